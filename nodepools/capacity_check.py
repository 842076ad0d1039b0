"""The dry run's three answers for a new node pool: capacity, quota left, and (through
:data:`nodepools.signals.price_nodepool`, answered by billing) the hourly cost.

Capacity is answered in counts *and* shapes: the counts of :mod:`reservations.capacity`
(reserved GPUs are not on-demand capacity) and a what-if run of the placement planner over
the current fleet (:class:`fleet.placement.Planner`, nothing claimed), so "placeable now" means
both that the GPUs are free for this pool and that its nodes fit on hosts as they are.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db.models import F, Sum
from django.utils import timezone

from clusters.choices import GONE_PHASES
from fleet import placement
from reservations import capacity
from reservations.models import Reservation
from tenants import quotas

from .models import NodePool
from .signals import price_nodepool


def planned_gpus(reservation: Reservation, exclude_pool=None) -> int:
    """GPUs the live pools drawing from ``reservation`` ask for (their specs)."""
    qs = NodePool.objects.filter(reservation=reservation).exclude(phase__in=GONE_PHASES)
    qs = qs.filter(deletion_requested_at__isnull=True)
    if exclude_pool is not None:
        qs = qs.exclude(pk=exclude_pool)
    total = qs.aggregate(n=Sum(F("node_count") * F("gpus_per_node")))["n"]
    return int(total or 0)


def _shape_fits(
    tenant_id, model: str, region: str, zone: str, gpus: int, nodes: int, reservation=None
) -> bool:
    """Whether the planner places ``nodes`` x ``gpus`` on the hosts as they are (nothing is
    claimed), with the same fences and domain pin as the pool's real claim."""
    requests = [
        placement.GpuRequest(
            holder_id=uuid.uuid4(),
            tenant_id=tenant_id,
            gpu_model=model,
            gpus=gpus,
            region=region,
            zone=zone or None,
            reservation_id=reservation.id if reservation else None,
            nvlink_domain=reservation.nvlink_domain if reservation else None,
        )
        for _ in range(nodes)
    ]
    planner = placement.Planner(placement.load_host_views(requests))
    try:
        planner.place_all(requests)
    except placement.InsufficientCapacity:
        return False
    return True


def capacity_answer(
    *,
    tenant_id,
    gpu_model: str,
    region: str,
    gpus_per_node: int,
    node_count: int,
    reservation: Reservation | None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """``{"placeable_now", "placeable_from", "reservation_id", "needed_gpus", "free_gpus",
    "reserved_gpus", "held_by_reservations", "message"}``.

    ``free_gpus``: for an on-demand pool the GPUs an unreserved pool may take now
    (``C - D - max R``), for a reservation pool what its reservation has left after its other
    pools (0 once it is cancelled or ended, as its ``reserved_gpus``); ``reserved_gpus``:
    the largest count reserved from now on in the region (on-demand pools cannot take those),
    for a reservation pool its reservation's size; ``held_by_reservations``:
    of those, GPUs reservation pools hold now (0 unless reservations are what keeps an
    on-demand pool out); ``placeable_from``: when it fits if not now (a reservation's start,
    or when reservations end), None when it does not fit at any future instant as the fleet
    is now.
    """
    now = now or timezone.now()
    needed = gpus_per_node * node_count
    if reservation is not None:
        state = reservation.state_at(now)
        live = state in ("ACTIVE", "SCHEDULED")  # a cancelled or ended one has nothing left
        left = reservation.gpus - planned_gpus(reservation) if live else 0
        fits = left >= needed
        shape = fits and _shape_fits(
            tenant_id, gpu_model, region, reservation.zone, gpus_per_node, node_count, reservation
        )
        answer = {
            "placeable_now": state == "ACTIVE" and fits and shape,
            "placeable_from": None,
            "reservation_id": str(reservation.id),
            "needed_gpus": needed,
            "free_gpus": max(left, 0),
            "reserved_gpus": reservation.gpus if live else 0,
            "held_by_reservations": 0,
        }
        if not live:
            answer["message"] = f"reservation {reservation.id} is {state}"
        elif not fits:
            answer["message"] = (
                f"reservation {reservation.id} has {left} of {reservation.gpus} GPU(s) left; "
                f"the pool needs {needed}"
            )
        elif state == "SCHEDULED":
            answer["placeable_from"] = reservation.start
            answer["message"] = f"placeable from {reservation.start.isoformat()} (reservation)"
        elif not shape:
            answer["message"] = "the reserved GPUs are free but no host set fits the nodes now"
        else:
            answer["message"] = f"placeable now on reservation {reservation.id}"
        return answer
    room = capacity.on_demand_room(gpu_model, region, now)
    shape = _shape_fits(tenant_id, gpu_model, region, "", gpus_per_node, node_count)
    answer = {
        "placeable_now": room.free >= needed and shape,
        "placeable_from": None,
        "reservation_id": None,
        "needed_gpus": needed,
        "free_gpus": room.free,
        "reserved_gpus": room.reserved_peak,
        "held_by_reservations": 0,
    }
    if answer["placeable_now"]:
        answer["placeable_from"] = now
        answer["message"] = f"placeable now: {room.free} GPU(s) free on-demand"
    elif (block := capacity.reserved_block(gpu_model, region, needed, now)) is not None:
        answer["placeable_from"] = block.until
        answer["held_by_reservations"] = block.held_by_reservations
        answer["message"] = block.message(gpu_model, region)
    else:
        answer["message"] = f"not placeable: {room.free} GPU(s) free on-demand" + (
            "" if room.free < needed else ", but no host set fits the nodes"
        )
    return answer


def quota_answer(*, tenant_id, gpu_model: str, gpus: int, nodes: int) -> dict[str, Any]:
    """``{"fits", "gpus": {"gpu_model", "limit", "reserved", "in_use", "requested",
    "left_after"}, "nodes": {"limit", "reserved", "in_use", "requested", "left_after"}}`` from
    the tenant's quota row (read, not locked: the real create checks it again under the lock).

    ``reserved`` is what the quota row holds for the tenant's live specs (every pool's
    ``node_count x gpus_per_node``, provisioning or not) and is what the check counts:
    ``left_after = limit - reserved - requested``; ``in_use`` is what the tenant's READY nodes
    hold now (:func:`nodepools.quota_check.in_use`), shown beside it, never counted."""
    from .quota_check import in_use

    quota = quotas.quota_for(tenant_id, lock=False)
    held_nodes, held_gpus = in_use(tenant_id)
    gpu_limit = quotas.gpu_limit(quota, gpu_model)
    gpu_used = int(quota.reserved_gpus.get(gpu_model, 0))
    out = {
        "gpus": {
            "gpu_model": gpu_model,
            "limit": gpu_limit,
            "reserved": gpu_used,
            "in_use": held_gpus.get(gpu_model, 0),
            "requested": gpus,
            "left_after": gpu_limit - gpu_used - gpus,
        },
        "nodes": {
            "limit": quota.max_nodes,
            "reserved": quota.reserved_nodes,
            "in_use": held_nodes,
            "requested": nodes,
            "left_after": quota.max_nodes - quota.reserved_nodes - nodes,
        },
    }
    out["fits"] = out["gpus"]["left_after"] >= 0 and out["nodes"]["left_after"] >= 0
    return out


def cost_answer(
    *,
    tenant_id,
    gpu_model: str,
    gpus: int,
    reservation: Reservation | None,
    isolation: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The first receiver's answer to :data:`price_nodepool` (billing), or None. ``gpus`` is
    whole GPUs, or GPU instances for a pool sharing GPUs across tenants (``isolation``
    tenancy shared: billed by the GPU instance's fraction)."""
    for _, answer in price_nodepool.send(
        sender=NodePool,
        tenant_id=tenant_id,
        gpu_model=gpu_model,
        gpus=gpus,
        reservation=reservation,
        isolation=isolation or {},
    ):
        if answer is not None:
            return answer
    return None
