"""Resize a node pool (``SET_NODE_POOL_SIZE``): quota reserved or released in the same
transaction as the new spec; the reconciler adds nodes or removes them by the one scale-down
rule (:func:`nodepools.disruption.removal_order`: unhealthy first, then the newest). A dry run
answers what the resize would do and changes nothing."""

from __future__ import annotations

from django.db import transaction

from clusters.choices import GONE_PHASES, OperationType
from clusters.models import Cluster, Operation
from clusters.operations import Audit, start_operation
from clusters.services import ensure_no_active_operation
from fleet.shared_hosts import instance_profiles, is_shared_policy
from nvke.errors import Conflict
from tenants import quotas
from tenants.principal import Principal

from . import nvlink
from .disruption import removal_order, unhealthy
from .models import Node, NodePool
from .services import DryRun, check_reservation_left


def set_node_pool_size(
    *, principal: Principal, pool: NodePool, node_count: int, dry_run: bool = False
) -> Operation | DryRun:
    """Set ``node_count``; generation+1; a SET_NODE_POOL_SIZE operation.

    ``dry_run``: a :class:`~nodepools.services.DryRun` of what the resize would do
    (:func:`size_dry_run`); it writes nothing and takes no lock, so it is answered while
    another operation runs on the cluster.

    Raises Conflict ``nodepool_not_active`` (deleting/deleted), ``reservation_exhausted`` (a
    pool on a reservation growing past it), ``quota_exceeded`` or, for a
    pool kept in one NVLink domain, ``nvlink_domain_full`` (its domain has no room for the
    new nodes); a dry run raises the same except ``quota_exceeded`` (its ``quota`` says).
    Lock order: the pool row, then the quota row (as everywhere).
    """
    if dry_run:
        pool = NodePool.objects.select_related("cluster", "reservation").get(pk=pool.pk)
        _check_resize(pool, node_count)
        return size_dry_run(pool, node_count)
    with transaction.atomic():
        pool = NodePool.objects.select_for_update().get(pk=pool.pk)
        ensure_no_active_operation(
            Cluster.objects.select_for_update(no_key=True).get(pk=pool.cluster_id)
        )
        _check_resize(pool, node_count, lock=True)
        delta = node_count - pool.node_count
        gpus = {pool.gpu_model_id: abs(delta) * pool.gpus_per_node}
        if delta > 0:
            quotas.reserve(pool.tenant_id, nodes=delta, gpus=gpus)
        elif delta < 0:
            quotas.release(pool.tenant_id, nodes=-delta, gpus=gpus)
        before = pool.node_count
        pool.node_count = node_count
        pool.generation += 1
        pool.save(update_fields=["node_count", "generation", "updated_at"])
        return start_operation(
            **pool.operation_target(),
            type=OperationType.SET_NODE_POOL_SIZE,
            requested_by=principal.label,
            # a scale-up counts the pool's nodes up to its new size, a scale-down the nodes it
            # removes (a trial read "0/0 done" for 1 -> 0 and "2/2" for 3 -> 2)
            total=node_count if delta >= 0 else -delta,
            audit_event=Audit(
                "nodepool.set_size", before={"node_count": before}, after={"node_count": node_count}
            ),
        )


def _check_resize(pool: NodePool, node_count: int, *, lock: bool = False) -> None:
    """Conflict ``nodepool_not_active`` for a pool being deleted; for a pool on a
    reservation growing past what the reservation has left after its other pools, Conflict
    ``reservation_exhausted`` (as create); for a pool kept in one NVLink domain growing,
    Conflict ``nvlink_domain_full`` when its domain has no room. ``lock`` (a resize, in its
    transaction): the reservation's row is locked before its pools are counted, as a create
    on it locks it, so two pools of the tenant growing at once (in two clusters: no cluster
    lock orders them) cannot both take its last GPUs."""
    if pool.phase in GONE_PHASES or pool.deletion_requested_at is not None:
        raise Conflict(f"node pool {pool.name!r} is {pool.phase}", code="nodepool_not_active")
    if node_count > pool.node_count and pool.reservation_id is not None:
        # as create does: a pool on a reservation grows only within it (409 now, not a
        # resize operation that fails after placing what the reservation had room for)
        reservation = pool.reservation
        if lock:
            from reservations.models import Reservation

            reservation = Reservation.objects.select_for_update().get(pk=pool.reservation_id)
        check_reservation_left(reservation, node_count * pool.gpus_per_node, pool_id=pool.id)
    if node_count > pool.node_count and nvlink.wants_one_domain(pool.placement):
        # Scale-up stays in the pool's domain: 409 now when it has no room for them.
        # (A pool that grows past one domain's size is refused by the same check.)
        nvlink.check_room(
            gpu_model=pool.gpu_model_id,
            region=pool.cluster.region,
            tenant_id=pool.tenant_id,
            gpus_per_node=pool.gpus_per_node,
            nodes=node_count,
            pool_id=pool.id,
            reservation=pool.reservation,
        )


def size_dry_run(pool: NodePool, node_count: int) -> DryRun:
    """What resizing ``pool`` to ``node_count`` would do, read from the rows as they are now.

    ``node_count``: ``{"from", "to"}``. ``disruption``: ``{"nodes": [{"name", "drain": True,
    "repartition": False, "gpus", "gpu_instances", "unhealthy"}], "drain", "repartition": 0,
    "provision"}`` — the live nodes a scale-down removes, in the order the reconciler takes
    them (:func:`nodepools.disruption.removal_order`), and how many nodes a scale-up
    provisions. A node's ``gpus``: the whole GPUs it holds, ``gpu_instances`` None; a VM node
    of a ``tenancy: shared`` pool holds GPU instances, not GPUs: ``gpus`` None and
    ``gpu_instances`` ``{profile: count}`` (``{"1g.10gb": 1}``).
    A scale-up also answers ``capacity`` and ``quota`` for the added nodes
    (:mod:`nodepools.capacity_check`); ``cost`` is the pool at its new size (None without
    billing's answer)."""
    from .capacity_check import capacity_answer, cost_fields, quota_answer

    live = list(Node.objects.live().filter(nodepool=pool))
    leaving = removal_order(live)[: max(len(live) - node_count, 0)]
    added = max(node_count - len(live), 0)
    delta = max(node_count - pool.node_count, 0)
    shared = is_shared_policy(pool.isolation)
    held = instance_profiles(n.id for n in leaving) if shared and leaving else {}
    plan = {
        "nodes": [
            {
                "name": n.name,
                "drain": True,
                "repartition": False,
                "gpus": None if shared else len(n.gpu_uuids),
                "gpu_instances": held.get(n.id, {}) if shared else None,
                "unhealthy": unhealthy(n),
            }
            for n in leaving
        ],
        "drain": len(leaving),
        "repartition": 0,
        "provision": added,
    }
    grows = added > 0
    return DryRun(
        pool.isolation,
        pool.gpu_config,
        plan,
        capacity=capacity_answer(
            tenant_id=pool.tenant_id,
            gpu_model=pool.gpu_model_id,
            region=pool.cluster.region,
            gpus_per_node=pool.gpus_per_node,
            node_count=added,
            reservation=pool.reservation,
            isolation=pool.isolation,
            driver_version=pool.driver_version,
        )
        if grows
        else None,
        quota=quota_answer(
            tenant_id=pool.tenant_id,
            gpu_model=pool.gpu_model_id,
            gpus=delta * pool.gpus_per_node,
            nodes=delta,
        )
        if delta
        else None,
        **cost_fields(
            tenant_id=pool.tenant_id,
            gpu_model=pool.gpu_model_id,
            gpus=node_count * pool.gpus_per_node,
            reservation=pool.reservation,
            isolation=pool.isolation,
        ),
        node_count={"from": pool.node_count, "to": node_count},
    )
