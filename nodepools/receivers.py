"""Receivers of signals sent by lower apps (connected in ``NodepoolsConfig.ready``)."""

from __future__ import annotations

from django.db import transaction
from django.dispatch import receiver
from django.utils import timezone

from clusters.choices import GONE_PHASES as GONE
from clusters.choices import Phase
from clusters.signals import cluster_deleting, collect_node_versions, operation_cancelled
from fleet.signals import (
    gpu_facts_changed,
    gpu_health_changed,
    host_drain_checked,
    host_drain_requested,
    host_state_changed,
)
from nvke.queueing import enqueue_once, send_on_commit
from reservations.signals import reservation_ended, reservation_ending
from tenants.signals import collect_usage

from . import disruption
from .choices import Disruption, DisruptionStep, NodePhase
from .models import Node, NodePool
from .services import request_deletion


@receiver(cluster_deleting)
def delete_pools_of_deleting_cluster(sender, cluster, **kwargs) -> int | list[str]:
    """Mark the cluster's pools for deletion and enqueue their reconcilers.

    Returns the number of pools not yet DELETED, or the names of pools whose deletion failed.
    Pools locked by their own reconciler are skipped this round (SKIP LOCKED; they see the
    cluster's deletion themselves).
    """
    from .tasks import reconcile_nodepool

    pools = list(NodePool.objects.filter(cluster=cluster).exclude(phase=Phase.DELETED))
    failed = [p.name for p in pools if p.phase == Phase.DELETE_FAILED]
    if failed:
        return failed
    now = timezone.now()
    for pool in pools:
        locked = (
            NodePool.objects.select_for_update(skip_locked=True)
            .filter(pk=pool.pk, deletion_requested_at__isnull=True)
            .first()
        )
        if locked is not None:
            request_deletion(locked, "superseded by the cluster's deletion", now)
        # a direct send: a pending countdown (e.g. a maintenance-window wait) must not delay it
        send_on_commit(reconcile_nodepool, pool.id)
    return len(pools)


@receiver(collect_usage)
def held_nodes_and_gpus(sender, tenant_id, **kwargs) -> dict:
    """READY nodes and the GPUs they hold, by GPU model (:func:`nodepools.quota_check.in_use`)."""
    from .quota_check import in_use

    nodes, gpus = in_use(tenant_id)
    return {"nodes": nodes, "gpus": gpus}


@receiver(collect_node_versions)
def pool_node_versions(sender, cluster, **kwargs) -> list[tuple[str, str]]:
    """``(pool name, Kubernetes version)`` of the cluster's live pools, for the skew check."""
    out = []
    for pool in NodePool.objects.filter(cluster=cluster).exclude(phase__in=GONE):
        out.append((pool.name, pool.kubernetes_version or cluster.control_plane_version))
    return [(name, version) for name, version in out if version]


@receiver(operation_cancelled)
def cancel_pool_operation(sender, operation, **kwargs) -> bool:
    """Resize: keep the nodes the pool has. Upgrade: pause it where it is (nodes already
    upgraded stay upgraded; the spec goes back to the old versions only if none was)."""
    from clusters.choices import OperationType

    from .tasks import reconcile_nodepool

    pool = NodePool.objects.select_for_update().filter(pk=operation.target_id).first()
    if pool is None:
        return False
    send_on_commit(reconcile_nodepool, pool.id)
    if operation.type == OperationType.SET_NODE_POOL_SIZE:
        live = pool.nodes.live().count()
        if live != pool.node_count:
            from tenants import quotas

            delta = pool.node_count - live
            gpus = {pool.gpu_model_id: abs(delta) * pool.gpus_per_node}
            if delta > 0:
                quotas.release(pool.tenant_id, nodes=delta, gpus=gpus)
            else:  # a cancelled scale-down keeps nodes its new spec had given back
                quotas.reserve(pool.tenant_id, nodes=-delta, gpus=gpus, enforce=False)
            pool.node_count = live
            pool.generation += 1
            pool.save(update_fields=["node_count", "generation", "updated_at"])
        return True
    if operation.type == OperationType.UPGRADE_NODES:
        # nodes not yet upgraded go back into service; a node being verified finishes
        disruption.end_all(
            pool.nodes.filter(
                disruption=Disruption.UPGRADE,
                disruption_step__in=[DisruptionStep.DRAINING, DisruptionStep.DRAIN_BLOCKED],
            ),
            phase=NodePhase.READY,
        )
        pool.upgrade = {**pool.upgrade, "state": "cancelled"}
        pool.generation += 1
        pool.save(update_fields=["upgrade", "generation", "updated_at"])
        return True
    return False


@receiver(gpu_health_changed)
def repair_on_gpu_fault(
    sender, gpu_uuid, holder_id, healthy, action, xid, at, rule_action="", **kwargs
) -> None:
    """An unhealthy GPU held by a node: mark the node for repair (reboot or replace: by the
    health rule's ladder step, else by the Xid's catalog action) and wake its pool's
    reconciler."""
    from .repair import repair_action_for, repair_for_step, request_repair
    from .tasks import reconcile_nodepool

    if healthy or holder_id is None:
        return
    repair = repair_for_step(rule_action) if rule_action else repair_action_for(action)
    if repair is None:
        return
    reason = f"GPU {gpu_uuid}: " + (f"Xid {xid} ({action})" if xid is not None else action)
    if request_repair(holder_id, action=repair, reason=reason, at=at):
        pool_id = Node.objects.filter(pk=holder_id).values_list("nodepool_id", flat=True).first()
        if pool_id:
            transaction.on_commit(lambda: enqueue_once(reconcile_nodepool, pool_id))


def _sync_tenant_nodes_of(holder_ids) -> int:
    """Enqueue the Node writer of the clusters of the nodes ``holder_ids`` whose provider
    publishes Nodes (``hosted``); returns how many clusters."""
    from clusters.providers import get_provider

    from .tasks import sync_tenant_nodes

    rows = set(
        Node.objects.filter(pk__in=[h for h in holder_ids if h is not None]).values_list(
            "cluster_id", "cluster__provider"
        )
    )
    ids = [str(c) for c, provider in rows if get_provider(provider).publishes_nodes]
    for cluster_id in ids:
        transaction.on_commit(lambda c=cluster_id: enqueue_once(sync_tenant_nodes, c))
    return len(ids)


@receiver(gpu_health_changed)
def publish_gpu_health(sender, holder_id, **kwargs) -> None:
    """A GPU held by a node changed health: the node's cluster's Nodes follow (allocatable,
    the ``GpuXidCritical`` condition: :mod:`nodepools.tenant_nodes`)."""
    _sync_tenant_nodes_of([holder_id])


@receiver(gpu_facts_changed)
def publish_gpu_facts(sender, gpu_uuids, **kwargs) -> None:
    """A host reported other MIG facts for some GPUs: their holders' Nodes follow (MIG
    resources, ``mig.config.state``), and their pools look again, so that a READY node whose
    host stopped matching it is named (:mod:`nodepools.drift`)."""
    from fleet.models import Gpu

    from .tasks import reconcile_nodepool

    holders = set(
        Gpu.objects.filter(uuid__in=gpu_uuids, holder_id__isnull=False).values_list(
            "holder_id", flat=True
        )
    )
    _sync_tenant_nodes_of(holders)
    pools = set(Node.objects.filter(pk__in=holders).values_list("nodepool_id", flat=True))
    for pool_id in pools:
        transaction.on_commit(lambda p=str(pool_id): enqueue_once(reconcile_nodepool, p))


@receiver(host_state_changed)
def follow_host_readiness(sender, host_id, new_state, **kwargs) -> int:
    """Nodes on a NOT_READY host are NOT_READY (repaired after NVKE_NODE_REPAIR_TIMEOUT_S);
    back to READY when the host reports again. The pools of the nodes that changed are woken
    so that their ready count and conditions follow at once (:mod:`nodepools.readiness`).
    Returns the number of nodes changed."""
    from django.utils import timezone

    from .choices import NodePhase
    from .tasks import reconcile_nodepool

    nodes = Node.objects.live().filter(host_id=host_id)
    if new_state == "NOT_READY":
        changed = nodes.filter(phase=NodePhase.READY)
        pool_ids = set(changed.values_list("nodepool_id", flat=True))
        count = changed.update(phase=NodePhase.NOT_READY, repair_requested_at=timezone.now())
    elif new_state in ("AVAILABLE", "ALLOCATED"):
        changed = nodes.filter(phase=NodePhase.NOT_READY).exclude(disruption=Disruption.REPAIR)
        pool_ids = set(changed.values_list("nodepool_id", flat=True))
        count = changed.update(phase=NodePhase.READY, repair_requested_at=None)
    else:
        return 0
    for pool_id in sorted(pool_ids, key=str):
        # a direct send: a pending countdown (the repair timeout's) must not delay it
        send_on_commit(reconcile_nodepool, pool_id)
    return count


@receiver(host_drain_checked)
def commitments_a_host_drain_breaks(sender, host_id, holder_ids, **kwargs) -> list:
    """What a drain of ``host_id`` would break
    (:func:`nodepools.commitments.broken_by_host_drain`)."""
    from .commitments import broken_by_host_drain

    return broken_by_host_drain(host_id, holder_ids)


@receiver(host_drain_requested)
def move_nodes_off_draining_host(sender, host_id, holder_ids, target_state, **kwargs) -> int:
    """An operator drains a host: each pool with a node there gets its HOST_MAINTENANCE
    operation and its reconciler is woken (the moves themselves: :mod:`nodepools.host_moves`,
    read from the host row at every step). Returns the number of pools woken."""
    from fleet.models import Host

    from .host_moves import request_moves
    from .tasks import reconcile_nodepool

    hostname = Host.objects.filter(pk=host_id).values_list("hostname", flat=True).first() or ""
    pool_ids = set(
        Node.objects.live().filter(pk__in=holder_ids).values_list("nodepool_id", flat=True)
    )
    now = timezone.now()
    woken = 0
    for pool_id in sorted(pool_ids, key=str):
        if request_moves(pool_id, hostname=hostname, now=now):
            # a direct send: a pending countdown must not delay it
            transaction.on_commit(lambda pid=pool_id: reconcile_nodepool.delay(str(pid)))
            woken += 1
    return woken


@receiver(reservation_ending)
def on_reservation_ending(sender, reservation, **kwargs) -> None:
    from .reservation_end import announce_end

    announce_end(reservation)


@receiver(reservation_ended)
def on_reservation_ended(sender, reservation, **kwargs) -> int:
    """Pools still to settle (see :func:`nodepools.reservation_end.settle_end`)."""
    from .reservation_end import settle_end

    return settle_end(reservation)
