from django.db import models


class EndAction(models.TextChoices):
    """What happens to the nodes of pools drawing from a reservation when it ends."""

    KEEP = "keep"  # they keep running, billed on-demand from the end
    DRAIN = "drain"  # the pools are scaled to zero (nodes drained, GPUs released)


class ReservationState(models.TextChoices):
    """Derived from the times (never stored): see :meth:`Reservation.state_at`."""

    SCHEDULED = "SCHEDULED"
    ACTIVE = "ACTIVE"
    ENDED = "ENDED"
    CANCELLED = "CANCELLED"
