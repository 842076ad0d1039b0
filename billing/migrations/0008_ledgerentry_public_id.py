"""Ledger rows get a public UUID (nvke/public_ids.py); SLA credit lines stored before it named
ledger rows and health intervals by their serial ids, which tell a tenant how much everyone else
allocated: rewritten to the public ids. Amounts, spans and everything else stay as they were;
finalized lines are rewritten too (the immutability trigger is off for this one statement)."""

import django.contrib.postgres.functions
from django.db import migrations, models

# one element: its serial ids replaced by the rows' public ids (an id whose row is gone: null)
_ELEMENT = """
d || CASE WHEN jsonb_typeof(d->'ledger_entry_id') = 'number' THEN jsonb_build_object(
         'ledger_entry_id', (SELECT l.public_id::text FROM billing_ledgerentry l
                              WHERE l.id = (d->>'ledger_entry_id')::bigint))
       ELSE '{}'::jsonb END
  || CASE WHEN jsonb_typeof(d->'health_interval_id') = 'number' THEN jsonb_build_object(
         'health_interval_id', (SELECT i.public_id::text FROM fleet_gpuhealthinterval i
                                 WHERE i.id = (d->>'health_interval_id')::bigint))
       ELSE '{}'::jsonb END
"""

REWRITE_DETAILS = f"""
ALTER TABLE billing_invoiceline DISABLE TRIGGER invoiceline_finalized_immutable;
UPDATE billing_invoiceline li
   SET details = (SELECT jsonb_agg({_ELEMENT} ORDER BY n)
                    FROM jsonb_array_elements(li.details) WITH ORDINALITY AS t(d, n))
 WHERE jsonb_typeof(li.details) = 'array'
   AND EXISTS (SELECT 1 FROM jsonb_array_elements(li.details) d
                WHERE jsonb_typeof(d->'ledger_entry_id') = 'number'
                   OR jsonb_typeof(d->'health_interval_id') = 'number');
ALTER TABLE billing_invoiceline ENABLE TRIGGER invoiceline_finalized_immutable;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0007_reservation"),
        ("fleet", "0012_gpuhealthinterval_public_id"),
    ]

    operations = [
        migrations.AddField(
            model_name="ledgerentry",
            name="public_id",
            field=models.UUIDField(
                db_default=django.contrib.postgres.functions.RandomUUID(),
                editable=False,
                unique=True,
            ),
        ),
        migrations.RunSQL(REWRITE_DETAILS, reverse_sql=migrations.RunSQL.noop),
    ]
