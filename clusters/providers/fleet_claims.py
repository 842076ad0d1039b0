"""Machines on NVKE's own fleet inventory: the GPU claim both providers make for a pool's
nodes (the simulated one and the Cluster API one reserve GPUs the same way)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from fleet import nvlink_domains, placement, shared_hosts

from .base import InsufficientCapacity, NodePoolSpec, NodeSpec, ProviderError

#: ``ProviderError.code`` of a claim that met other claims on every fitting host
PLACEMENT_CONTENDED = "placement_contended"


def claim_fleet_gpus(pool: NodePoolSpec, nodes: list[NodeSpec]) -> list[placement.Placement]:
    """Claim ``pool.gpus_per_node`` GPUs per node in the pool's region, all or none; for a
    ``tenancy: shared`` MIG/vGPU pool, GPU instances of a shared host per node instead
    (:mod:`fleet.shared_hosts`; the placements carry the GPUs they touch).

    Raises the provider-level InsufficientCapacity (retryable) when the fleet lacks room even
    with every other claim's lock released, and a retryable ProviderError
    ``placement_contended`` when concurrent claims hold every host that would fit (the caller
    tries again after a short backoff, see :mod:`fleet.placement`). A pool with
    ``placement.same_nvlink_domain`` claims inside one NVLink domain (its own once it has
    nodes, :func:`fleet.nvlink_domains.claim_in_one_domain`); no domain with room is the
    same retryable InsufficientCapacity, its message naming the largest free domain.

    Each node is placed with the driver it pins (``NodeSpec.driver_version``, its pool's pin
    when it was created): a host whose driver differs takes it only when no other node is
    there (:mod:`fleet.host_driver`); a refusal for that reason says so.
    """
    if shared_hosts.is_shared_policy(pool.isolation):
        return _claim_gpu_instances(pool, nodes)  # type: ignore[return-value]
    pins = {node.id: node.driver_version for node in nodes}
    requests = gpu_requests(pool, [node.id for node in nodes], pins=pins)
    try:
        if pool.placement.get("same_nvlink_domain"):
            return nvlink_domains.claim_in_one_domain(requests, group_id=pool.id)
        return placement.claim_gpus(requests)
    except nvlink_domains.NvlinkDomainFull as exc:
        raise InsufficientCapacity(str(exc), retryable=True) from exc
    except placement.InsufficientCapacity as exc:
        raise InsufficientCapacity(_why_short(pool, requests, exc), retryable=True) from exc
    except placement.PlacementContended as exc:
        raise ProviderError(str(exc), retryable=True, code=PLACEMENT_CONTENDED) from exc


def gpu_requests(
    pool: NodePoolSpec,
    holder_ids: Iterable[uuid.UUID],
    *,
    pins: Mapping[uuid.UUID, str] | None = None,
) -> list[placement.GpuRequest]:
    """The placement request of each of ``pool``'s nodes, one per holder id: the pool's
    ``gpus_per_node`` whole GPUs of its model in its cluster's region, its zone, reservation
    and NVLink domain where set, and the driver the node pins (``pins[holder_id]``, else the
    pool's ``driver_version``: what a new node is created with)."""
    pins = pins or {}
    return [
        placement.GpuRequest(
            holder_id=holder_id,
            tenant_id=pool.cluster.tenant_id,
            gpu_model=pool.gpu_model,
            gpus=pool.gpus_per_node,
            region=pool.cluster.region,
            zone=pool.zone or None,
            reservation_id=pool.reservation_id,
            nvlink_domain=pool.nvlink_domain,
            driver_version=pins.get(holder_id, pool.driver_version),
        )
        for holder_id in holder_ids
    ]


def _why_short(pool: NodePoolSpec, requests: list[placement.GpuRequest], exc: Exception) -> str:
    """The placement's words, and for an on-demand pool kept out by reservations (the GPUs
    exist but are reserved, free or held by reservation pools) what they hold and until when
    (:func:`reservations.capacity.reserved_block`) — so the pool's ERROR says why."""
    from django.utils import timezone

    from reservations import capacity
    from reservations.guard import ReservedCapacity

    if pool.reservation_id is not None or isinstance(exc, ReservedCapacity):
        return str(exc)  # the guard's refusal names the reservation already
    driver = driver_short(requests)
    if driver:
        return f"{exc}: {driver}"
    block = capacity.reserved_block(requests, timezone.now())
    if block is None:
        return str(exc)
    return f"{exc}: {block.message(pool.gpu_model, pool.cluster.region)}"


def driver_short(
    requests: Sequence[placement.GpuRequest] | Sequence[shared_hosts.GpuInstanceRequest],
) -> str:
    """Why ``requests`` of a pool that pins a driver do not fit when the driver is the reason
    (whole GPUs, or GPU instances of shared hosts: they would fit if the pool pinned none),
    in the words a CapacityShort condition and a dry run carry; "" otherwise."""
    pin = next((r.driver_version for r in requests if r.driver_version), "")
    if not pin:
        return ""
    unpinned = [replace(r, driver_version="") for r in requests]
    if isinstance(requests[0], shared_hosts.GpuInstanceRequest):
        fits = shared_hosts.shared_room(unpinned).nodes_placed == len(unpinned)  # type: ignore[arg-type]
    else:
        fits = placement.fits(unpinned)  # type: ignore[arg-type]
    if not fits:
        return ""
    return (
        f"the pool pins driver {pin}, and the hosts with room run another driver beside other "
        "nodes (a host's driver is one for all its nodes: it is changed only on a host that "
        "no other node uses)"
    )


def _claim_gpu_instances(
    pool: NodePoolSpec, nodes: list[NodeSpec]
) -> list[shared_hosts.GpuInstancePlacement]:
    """A ``tenancy: shared`` pool: each node is a VM holding GPU instances of a shared host."""
    instances = shared_hosts.instances_for_policy(
        pool.gpu_model, pool.isolation, pool.gpus_per_node
    )
    requests = [
        shared_hosts.GpuInstanceRequest(
            holder_id=node.id,
            tenant_id=pool.cluster.tenant_id,
            gpu_model=pool.gpu_model,
            region=pool.cluster.region,
            instances=instances,
            driver_version=node.driver_version,
        )
        for node in nodes
    ]
    try:
        return shared_hosts.claim_gpu_instances(requests)
    except shared_hosts.SharedCapacityShort as exc:
        driver = driver_short(requests)
        message = f"{exc}: {driver}" if driver else str(exc)
        raise InsufficientCapacity(message, retryable=True) from exc
