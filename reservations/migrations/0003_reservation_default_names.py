"""Reservations created without a name get ``r-<first 8 hex digits of the id>``
(:func:`reservations.admission.default_name`); this names the ones made before."""

from django.db import migrations


def name_unnamed(apps, schema_editor):
    Reservation = apps.get_model("reservations", "Reservation")
    for reservation in Reservation.objects.filter(name="").only("id"):
        Reservation.objects.filter(pk=reservation.pk).update(name=f"r-{reservation.id.hex[:8]}")


class Migration(migrations.Migration):
    dependencies = [("reservations", "0002_reservation_nvlink_domain")]

    operations = [migrations.RunPython(name_unnamed, migrations.RunPython.noop)]
