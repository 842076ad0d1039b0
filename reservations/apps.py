from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    """GPU capacity reservations (between ``fleet`` and ``clusters`` in the dependency chain).

    ``ready()`` registers the placement hook (:func:`reservations.guard.check_claims`) and the
    NVLink domain fence (:func:`reservations.fences.fenced_domains`) with
    :mod:`fleet.placement`, which knows nothing about reservations itself.
    """

    default_auto_field = "django.db.models.BigAutoField"
    name = "reservations"

    def ready(self) -> None:
        from fleet import placement

        from .fences import fenced_domains
        from .guard import check_claims

        if check_claims not in placement.CLAIM_HOOKS:
            placement.CLAIM_HOOKS.append(check_claims)
        if fenced_domains not in placement.DOMAIN_FENCES:
            placement.DOMAIN_FENCES.append(fenced_domains)
