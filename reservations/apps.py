from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    """GPU capacity reservations (between ``fleet`` and ``clusters`` in the dependency chain).

    ``ready()`` registers the placement hook (:func:`reservations.guard.check_claims`) with
    :mod:`fleet.placement`, which knows nothing about reservations itself.
    """

    default_auto_field = "django.db.models.BigAutoField"
    name = "reservations"

    def ready(self) -> None:
        from fleet import placement

        from .guard import check_claims

        if check_claims not in placement.CLAIM_HOOKS:
            placement.CLAIM_HOOKS.append(check_claims)
