"""The dry run's three answers for a new node pool: capacity, quota left, and (through
:data:`nodepools.signals.price_nodepool`, answered by billing) the hourly cost.

Capacity is answered by the placement that would place the pool, in counts *and* shapes.
A whole-GPU pool: the counts of :mod:`reservations.capacity` (reserved GPUs are not on-demand
capacity) and a what-if run of the placement planner (:func:`fleet.placement.fits`, nothing
claimed), so "placeable now" means both that the GPUs are free for this pool and that its
nodes fit on hosts as they are, and "placeable from" the same at a reservation's end. A
``tenancy: shared`` pool: free GPU instances of its profiles on shared hosts and a what-if run
of the shared-host planner (:func:`fleet.shared_hosts.shared_room`).
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime
from typing import Any

from django.db.models import F, Sum
from django.utils import timezone

from clusters.choices import GONE_PHASES
from clusters.providers.fleet_claims import driver_short
from fleet import placement, shared_hosts
from fleet.shared_hosts import is_shared_policy
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


def new_node_requests(
    tenant_id,
    model: str,
    region: str,
    zone: str,
    gpus: int,
    nodes: int,
    reservation=None,
    driver_version: str = "",
) -> list[placement.GpuRequest]:
    """The placement requests of ``nodes`` new nodes of ``gpus`` GPUs, with the same fences,
    domain pin and driver pin as the pool's real claim (:func:`clusters.providers.fleet_claims
    .gpu_requests`); fresh holder ids: nothing is claimed."""
    return [
        placement.GpuRequest(
            holder_id=uuid.uuid4(),
            tenant_id=tenant_id,
            gpu_model=model,
            gpus=gpus,
            region=region,
            zone=zone or None,
            reservation_id=reservation.id if reservation else None,
            nvlink_domain=reservation.nvlink_domain if reservation else None,
            driver_version=driver_version,
        )
        for _ in range(nodes)
    ]


def capacity_answer(
    *,
    tenant_id,
    gpu_model: str,
    region: str,
    gpus_per_node: int,
    node_count: int,
    reservation: Reservation | None,
    isolation: dict[str, Any] | None = None,
    driver_version: str = "",
    now: datetime | None = None,
) -> dict[str, Any]:
    """``{"placeable_now", "placeable_from", "reservation_id", "unit", "needed_gpus",
    "free_gpus", "reserved_gpus", "held_by_reservations", "gpu_instances", "message"}``,
    computed by the placement that would place the pool: whole GPUs of dedicated hosts
    (``unit`` ``gpu``), or for a ``tenancy: shared`` MIG / vGPU pool GPU instances on shared
    hosts (``unit`` ``gpu_instance``, :func:`_shared_answer`).

    ``free_gpus``: for an on-demand pool the GPUs an unreserved pool may take now
    (``C - D - max R`` less ``scrubbing_gpus``, the free GPUs whose scrub after their last
    release is not confirmed yet: placement hands none of those out, and fragmentation does
    not count them; ``scrubbing_gpus`` is None for a reservation pool), for a reservation
    pool what its reservation has left after its other pools (0 once it is cancelled or
    ended, as its ``reserved_gpus``); ``reserved_gpus``:
    the largest count reserved from now on in the region (on-demand pools cannot take those),
    for a reservation pool its reservation's size; ``held_by_reservations``: GPUs of the
    model in the region that nodes of active reservations (other than the pool's own) hold
    now — a fact of the fleet, the same whatever the pool's size; ``placeable_from``: when it
    fits if not now (a reservation's start, or when reservations end and a host shape for
    every node is free: :func:`reservations.capacity.placeable_from`), None when it does not
    fit at any future instant as the fleet is now, and None too when only GPUs being scrubbed
    keep the nodes out (the message says they will be free shortly: no instant is known).
    ``gpu_instances`` is None here. ``driver_version``: the pool's pin; its nodes go only
    where they change no other node's driver (:mod:`fleet.host_driver`), and the message says
    when that is what keeps them out.
    """
    now = now or timezone.now()
    if is_shared_policy(isolation or {}):
        return _shared_answer(
            tenant_id=tenant_id,
            gpu_model=gpu_model,
            region=region,
            gpus_per_node=gpus_per_node,
            node_count=node_count,
            isolation=isolation or {},
            driver_version=driver_version,
            now=now,
        )
    needed = gpus_per_node * node_count
    if reservation is not None:
        state = reservation.state_at(now)
        live = state in ("ACTIVE", "SCHEDULED")  # a cancelled or ended one has nothing left
        left = reservation.gpus - planned_gpus(reservation) if live else 0
        fits = left >= needed
        shape = fits and placement.fits(
            new_node_requests(
                tenant_id,
                gpu_model,
                region,
                reservation.zone,
                gpus_per_node,
                node_count,
                reservation,
                driver_version,
            )
        )
        answer = {
            "placeable_now": state == "ACTIVE" and fits and shape,
            "placeable_from": None,
            "reservation_id": str(reservation.id),
            "unit": "gpu",
            "needed_gpus": needed,
            "free_gpus": max(left, 0),
            "scrubbing_gpus": None,
            "reserved_gpus": reservation.gpus if live else 0,
            "held_by_reservations": capacity.held_by_reservations(
                gpu_model, region, now, other_than=reservation.pk
            ),
            "gpu_instances": None,
        }
        if not live:
            answer["message"] = f"reservation {reservation.label} is {state}"
        elif not fits:
            answer["message"] = (
                f"reservation {reservation.label} has {left} of {reservation.gpus} GPU(s) left; "
                f"the pool needs {needed}"
            )
        elif state == "SCHEDULED":
            answer["placeable_from"] = reservation.start
            answer["message"] = f"placeable from {reservation.start.isoformat()} (reservation)"
        elif not shape:
            answer["message"] = "the reserved GPUs are free but no host set fits the nodes now"
            if driver := driver_short(
                new_node_requests(
                    tenant_id, gpu_model, region, reservation.zone, gpus_per_node,
                    node_count, reservation, driver_version,
                )
            ):  # fmt: skip
                answer["message"] += f": {driver}"
        else:
            # placeable now: from now, as an on-demand answer says (None reads as "never")
            answer["placeable_from"] = now
            answer["message"] = f"placeable now on reservation {reservation.label}"
        return answer
    room = capacity.on_demand_room(gpu_model, region, now)
    requests = new_node_requests(
        tenant_id, gpu_model, region, "", gpus_per_node, node_count, None, driver_version
    )
    when = capacity.placeable_from(requests, now)
    # the GPUs being scrubbed keep the nodes out only until the agent reports the scrubs
    scrub_wait = (
        when != now
        and room.scrubbing > 0
        and room.unreserved >= needed
        and placement.fits(requests, scrubbed=True)
    )
    answer = {
        "placeable_now": when == now,
        "placeable_from": None if scrub_wait else when,
        "reservation_id": None,
        "unit": "gpu",
        "needed_gpus": needed,
        "free_gpus": room.free,
        "scrubbing_gpus": room.scrubbing,
        "reserved_gpus": room.reserved_peak,
        "held_by_reservations": room.held_by_reservations,
        "gpu_instances": None,
    }
    if answer["placeable_now"]:
        answer["message"] = f"placeable now: {room.free} GPU(s) free on-demand"
    elif scrub_wait:
        answer["message"] = (
            f"not placeable now: {room.free} GPU(s) free on-demand; {room.scrubbing} more "
            "GPU(s) are being scrubbed after their last release and will be free shortly "
            "(when the agent reports the scrub), then the nodes fit"
        )
    elif driver := driver_short(requests):
        answer["message"] = f"not placeable now: {room.free} GPU(s) free on-demand, but {driver}"
    elif (block := capacity.reserved_block(requests, now)) is not None:
        answer["message"] = block.message(gpu_model, region)
    else:
        answer["message"] = f"not placeable now: {room.free} GPU(s) free on-demand" + (
            "" if room.free < needed else ", but no host set fits the nodes"
        )
        if room.scrubbing:
            answer["message"] += f" ({room.scrubbing} more being scrubbed)"
        if when is not None:
            answer["message"] += f"; placeable from {when.isoformat()}, when reservations end"
    return answer


def _shared_answer(
    *,
    tenant_id,
    gpu_model: str,
    region: str,
    gpus_per_node: int,
    node_count: int,
    isolation: dict[str, Any],
    driver_version: str,
    now: datetime,
) -> dict[str, Any]:
    """A shared pool's capacity, by the placement of shared pools (:mod:`fleet.shared_hosts`,
    :func:`fleet.shared_hosts.shared_room`): its nodes' GPU instances on shared hosts, never
    whole GPUs of dedicated hosts. ``unit`` ``gpu_instance``; ``gpu_instances``: per MIG
    profile of a node ``{"profile", "needed", "free"}`` (``free``: instances of that profile
    the shared hosts can still take now, the profile alone); ``placeable_now`` when every
    node fits on a shared host (all of a node's instances on one host). The GPU fields are
    None: the pool takes no whole GPU, and reservations hold only whole GPUs of dedicated
    hosts. ``placeable_from`` is ``now`` or None (instances come back as others release
    them, at no known time)."""
    per_node = shared_hosts.instances_for_policy(gpu_model, isolation, gpus_per_node)
    requests = [
        shared_hosts.GpuInstanceRequest(
            holder_id=uuid.uuid4(),
            tenant_id=tenant_id,
            gpu_model=gpu_model,
            region=region,
            instances=per_node,
            driver_version=driver_version,
        )
        for _ in range(node_count)
    ]
    room = shared_hosts.shared_room(requests)
    counts = Counter(per_node)
    rows = [
        {"profile": name, "needed": n * node_count, "free": room.free.get(name, 0)}
        for name, n in counts.items()
    ]
    placeable = room.nodes_placed == node_count
    needed = " + ".join(f"{r['needed']} x {r['profile']}" for r in rows)
    free = ", ".join(f"{r['free']} x {r['profile']}" for r in rows)
    if placeable:
        message = f"placeable now: {free} GPU instance(s) free on shared hosts"
    elif not room.hosts:
        message = f"not placeable: no shared host of {gpu_model} in {region}"
    elif any(r["free"] < r["needed"] for r in rows):
        message = (
            f"not placeable: {free} GPU instance(s) free on shared hosts; the pool needs {needed}"
        )
    elif driver := driver_short(requests):
        message = f"not placeable: {free} GPU instance(s) free on shared hosts, but {driver}"
    else:
        message = (
            f"not placeable: {free} GPU instance(s) free on shared hosts, but no shared host "
            f"has room for every node's {len(per_node)} instance(s) ({room.nodes_placed} of "
            f"{node_count} node(s) fit)"
        )
    return {
        "placeable_now": placeable,
        "placeable_from": now if placeable else None,
        "reservation_id": None,
        "unit": "gpu_instance",
        "needed_gpus": None,
        "free_gpus": None,
        "scrubbing_gpus": None,
        "reserved_gpus": None,
        "held_by_reservations": None,
        "gpu_instances": rows,
        "message": message,
    }


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
    """The first receiver's answer to :data:`price_nodepool` (billing: a cost, or
    ``{"cost_error"}``), or None. ``gpus`` is
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


def cost_fields(
    *,
    tenant_id,
    gpu_model: str,
    gpus: int,
    reservation: Reservation | None,
    isolation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The dry run's ``{"cost", "cost_error"}`` from :func:`cost_answer`: ``cost`` the priced
    answer, or None with ``cost_error`` (billing's ``missing_price`` body, as the usage API
    gives it) when the price sheet has no rate; both None without billing's answer."""
    answer = cost_answer(
        tenant_id=tenant_id,
        gpu_model=gpu_model,
        gpus=gpus,
        reservation=reservation,
        isolation=isolation,
    )
    if answer is not None and "cost_error" in answer:
        return {"cost": None, "cost_error": answer["cost_error"]}
    return {"cost": answer, "cost_error": None}
