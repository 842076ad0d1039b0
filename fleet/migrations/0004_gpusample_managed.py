# GpuSample becomes a managed model in Django's state only: the partitioned table was created
# by RunSQL (0001) and its later columns by RunSQL (0002); nothing changes in the database.
# Managed models are truncated by Django's flush, so transactional tests no longer leak samples
# into each other.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0003_host_gpu_summary'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.AlterModelOptions(name='gpusample', options={}),
                migrations.AddField(
                    model_name='gpusample',
                    name='clocks_event_reasons',
                    field=models.BigIntegerField(null=True),
                ),
                migrations.AddField(
                    model_name='gpusample',
                    name='ecc_volatile_corrected',
                    field=models.BigIntegerField(null=True),
                ),
                migrations.AddField(
                    model_name='gpusample',
                    name='host',
                    field=models.ForeignKey(db_constraint=False, default=None, on_delete=django.db.models.deletion.DO_NOTHING, to='fleet.host'),
                    preserve_default=False,
                ),
                migrations.AddField(
                    model_name='gpusample',
                    name='memory_clock_mhz',
                    field=models.IntegerField(null=True),
                ),
                migrations.AddField(
                    model_name='gpusample',
                    name='sm_clock_mhz',
                    field=models.IntegerField(null=True),
                ),
            ],
        ),
    ]
