"""What a reservation's end does to the node pools drawing from it (receivers of
:mod:`reservations.signals`, connected in :mod:`nodepools.receivers`).

* announced (``reservation_ending``; at once when it is cancelled): every live pool drawing
  from it gets the condition ``ReservationEnding`` (True) saying when and what will happen —
  the tenant reads it on the pool (API, portal) beside the ``reservation.ending`` webhook
  event;
* ended, ``keep``: the condition becomes ``ReservationEnded`` "running on-demand since …";
  the pool's nodes stay, and are billed on-demand from the end (:mod:`billing.reservations`);
* ended, ``drain``: the pool is scaled to zero (``SET_NODE_POOL_SIZE`` operation by
  ``system:reservation``: nodes drained newest first, GPUs released, quota given back).
  A pool busy with another operation is tried again on the next sweep.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from clusters.choices import GONE_PHASES
from nvke.conditions import set_condition
from nvke.errors import Conflict
from tenants.choices import Role
from tenants.principal import Principal

from .models import NodePool


def _live_pools(reservation):
    return NodePool.objects.filter(
        reservation_id=reservation.id, deletion_requested_at__isnull=True
    ).exclude(phase__in=GONE_PHASES)


def announce_end(reservation) -> None:
    """Set ``ReservationEnding`` on the pools drawing from ``reservation``."""
    now = timezone.now()
    what = (
        "its nodes keep running, billed on-demand"
        if reservation.end_action == "keep"
        else "the pool is drained (scaled to zero)"
    )
    end = reservation.effective_end()
    how = "was cancelled at" if reservation.cancelled_at is not None else "ends at"
    message = f"reservation {reservation.label} {how} {end.isoformat()}: {what}"
    for pool in _live_pools(reservation).select_for_update(of=("self",)):
        pool.conditions = set_condition(
            pool.conditions, "ReservationEnding", True, "ReservationEndAnnounced", message, now
        )
        pool.save(update_fields=["conditions", "updated_at"])


def settle_end(reservation) -> int:
    """Apply ``end_action`` to the live pools; returns how many still need another try."""
    from .scaling import set_node_pool_size

    now = timezone.now()
    left = 0
    for pool in _live_pools(reservation):
        if reservation.end_action == "drain" and pool.node_count > 0:
            principal = Principal(pool.tenant, Role.OWNER, False, "system:reservation")
            try:
                with transaction.atomic():
                    set_node_pool_size(principal=principal, pool=pool, node_count=0)
            except Conflict:
                left += 1  # another operation runs on the cluster: next sweep
                continue
            pool.refresh_from_db()
            reason, message = "ReservationDrained", "the pool was drained at the reservation's end"
        elif reservation.end_action == "drain":
            continue
        else:
            reason = "RunningOnDemand"
            message = f"running on-demand since {reservation.effective_end().isoformat()}"
        with transaction.atomic():
            pool = NodePool.objects.select_for_update().get(pk=pool.pk)
            conditions = set_condition(pool.conditions, "ReservationEnding", False, reason, "", now)
            pool.conditions = set_condition(
                conditions, "ReservationEnded", True, reason, f"reservation ended: {message}", now
            )
            pool.save(update_fields=["conditions", "updated_at"])
    return left
