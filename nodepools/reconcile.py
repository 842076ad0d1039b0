"""The node pool reconciler: one level-triggered, idempotent step per call.

Lock the pool row (``FOR UPDATE SKIP LOCKED``), compare spec with the nodes, take one step,
save status, return the requeue delay (None when converged):

1. deletion requested (the pool's own, or its cluster's — seen through the cluster's
   deletion timestamp): release every node's machine and GPUs (``node_released``), then
   ``DELETED``;
2. the cluster's control plane not RUNNING yet: wait;
3. too few nodes: create the missing Node rows and place their machines through the provider,
   all or none: on ``InsufficientCapacity`` nothing is kept, the pool goes to ``ERROR`` and its
   operation FAILS with code ``insufficient_capacity``;
4. too many nodes: release the newest first (scale-down rule: newest nodes go first);
5. provisioning nodes whose machine is ready become ``READY`` (``node_ready``);
6. all nodes ready -> ``RUNNING``, ``observed_generation = generation``, operation DONE.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from datetime import datetime

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from clusters.choices import OperationType, Phase
from clusters.models import Cluster, cancel_operations, finish_operation, progress_operation
from clusters.providers import ProviderError, get_provider
from clusters.providers.base import InsufficientCapacity
from nvke.conditions import set_condition

from .choices import NodePhase
from .models import Node, NodePool
from .signals import node_ready, node_released
from .specs import node_spec, nodepool_spec

log = logging.getLogger(__name__)

WAIT_FOR_CLUSTER_S = 1.0
LIVE_NODE_PHASES = [p for p in NodePhase.values if p not in (NodePhase.DELETING, NodePhase.DELETED)]


def reconcile_nodepool(pool_id: uuid.UUID | str, now: datetime | None = None) -> float | None:
    """Take one reconcile step for a node pool; returns the requeue delay (s) or None."""
    now = now or timezone.now()
    with transaction.atomic():
        pool = (
            NodePool.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("cluster", "gpu_model")
            .filter(pk=pool_id)
            .first()
        )
        if pool is None or pool.phase in (Phase.DELETED, Phase.DELETE_FAILED):
            return None
        if pool.deletion_requested_at is not None or pool.cluster.deletion_requested_at is not None:
            delay = _step_delete(pool, now)
        elif pool.phase == Phase.ERROR and pool.observed_generation == pool.generation:
            delay = None  # failed for this spec: wait for a spec change (or deletion)
        elif pool.cluster.phase != Phase.RUNNING:
            delay = _wait_for_cluster(pool, now)
        else:
            delay = _step_ensure(pool, now)
    update_cluster_nodes_ready(pool.cluster_id, now)
    return delay


def _wait_for_cluster(pool: NodePool, now: datetime) -> float:
    message = f"waiting for the cluster's control plane ({pool.cluster.phase})"
    _set_conditions(pool, now, ("Ready", False, "WaitingForControlPlane", message))
    progress_operation(pool.id, stage="waiting-for-control-plane", total=pool.node_count, now=now)
    return WAIT_FOR_CLUSTER_S


def _step_ensure(pool: NodePool, now: datetime) -> float | None:
    live = list(pool.nodes.filter(phase__in=LIVE_NODE_PHASES).order_by("created_at", "name"))
    if len(live) < pool.node_count:
        return _scale_up(pool, live, now)
    if len(live) > pool.node_count:
        surplus = sorted(live, key=lambda n: (n.created_at, n.name))[pool.node_count :]
        _release_nodes(pool, surplus, now)
        return 0.0
    provider = get_provider(pool.cluster.provider)
    spec = nodepool_spec(pool)
    waits: list[float] = []
    for node in live:
        if node.phase != NodePhase.PROVISIONING:
            continue
        status = provider.machine_status(spec, node_spec(node), now)
        if not status.ready:
            waits.append(status.retry_after_s)
            continue
        node.phase = NodePhase.READY
        node.ready_at = now
        node.save(update_fields=["phase", "ready_at"])
        node_ready.send(sender=Node, node=node)
    ready = sum(1 for n in live if n.phase == NodePhase.READY)
    if waits:
        _set_conditions(
            pool,
            now,
            ("Ready", False, "NodesProvisioning", f"{ready} of {pool.node_count} nodes ready"),
        )
        progress_operation(pool.id, stage="nodes", done=ready, total=pool.node_count, now=now)
        return min(waits)
    if pool.phase == Phase.RUNNING and pool.observed_generation == pool.generation:
        return None
    pool.phase = Phase.RUNNING
    pool.observed_generation = pool.generation
    pool.conditions = set_condition(
        pool.conditions,
        "Ready",
        True,
        "NodesReady",
        f"{ready} of {pool.node_count} nodes ready",
        now,
    )
    pool.save(update_fields=["phase", "observed_generation", "conditions", "updated_at"])
    finish_operation(
        pool.id,
        types=(OperationType.CREATE_NODE_POOL, OperationType.SET_NODE_POOL_SIZE),
        now=now,
    )
    return None


def _scale_up(pool: NodePool, live: list[Node], now: datetime) -> float | None:
    missing = pool.node_count - len(live)
    provider = get_provider(pool.cluster.provider)
    try:
        with transaction.atomic():  # savepoint: on failure no Node row and no GPU stays held
            new_nodes = [
                Node.objects.create(
                    tenant_id=pool.tenant_id,
                    cluster_id=pool.cluster_id,
                    nodepool=pool,
                    name=f"{pool.cluster.name}-{pool.name}-{secrets.token_hex(3)}",
                    created_at=now,
                )
                for _ in range(missing)
            ]
            placements = provider.ensure_machines(
                nodepool_spec(pool), [node_spec(n) for n in new_nodes]
            )
            by_id = {p.node_id: p for p in placements}
            for node in new_nodes:
                placed = by_id[node.id]
                node.host_id = placed.host_id
                node.zone = placed.zone
                node.gpu_uuids = list(placed.gpu_uuids)
                node.save(update_fields=["host", "zone", "gpu_uuids"])
    except InsufficientCapacity as exc:
        return _fail(pool, "insufficient_capacity", str(exc), retryable=True, now=now)
    except ProviderError as exc:
        return _fail(
            pool, exc.code, f"the infrastructure provider failed: {exc}", exc.retryable, now
        )
    if pool.phase not in (Phase.PROVISIONING, Phase.RECONCILING):
        pool.phase = Phase.RECONCILING
        pool.save(update_fields=["phase", "updated_at"])
    progress_operation(pool.id, stage="nodes", done=0, total=pool.node_count, now=now)
    return 0.0


def _fail(pool: NodePool, code: str, message: str, retryable: bool, now: datetime) -> None:
    pool.phase = Phase.ERROR
    pool.observed_generation = pool.generation
    pool.conditions = set_condition(pool.conditions, "Ready", False, _reason(code), message, now)
    pool.save(update_fields=["phase", "observed_generation", "conditions", "updated_at"])
    finish_operation(
        pool.id, error={"code": code, "message": message, "retryable": retryable}, now=now
    )
    return None


def _reason(code: str) -> str:
    return "".join(part.capitalize() for part in code.split("_"))


def _step_delete(pool: NodePool, now: datetime) -> float | None:
    if pool.phase != Phase.DELETING:
        pool.phase = Phase.DELETING
        pool.save(update_fields=["phase", "updated_at"])
    nodes = list(pool.nodes.exclude(phase=NodePhase.DELETED))
    if nodes:
        progress_operation(pool.id, stage="releasing-nodes", total=len(nodes), now=now)
        _release_nodes(pool, nodes, now)
    pool.phase = Phase.DELETED
    pool.deleted_at = now
    pool.observed_generation = pool.generation
    pool.conditions = set_condition(
        pool.conditions, "Ready", False, "Deleted", "node pool deleted", now
    )
    pool.save(
        update_fields=["phase", "deleted_at", "observed_generation", "conditions", "updated_at"]
    )
    finish_operation(pool.id, types=(OperationType.DELETE_NODE_POOL,), now=now)
    cancel_operations(pool.id, "superseded by the node pool's deletion", now)
    return None


def _release_nodes(pool: NodePool, nodes: list[Node], now: datetime) -> None:
    """Delete the nodes' machines (GPUs back to the fleet), close their allocation."""
    get_provider(pool.cluster.provider).delete_machines(
        nodepool_spec(pool), [node_spec(n) for n in nodes]
    )
    for node in nodes:
        was_ready = node.ready_at is not None
        node.phase = NodePhase.DELETED
        node.released_at = now
        node.save(update_fields=["phase", "released_at"])
        if was_ready:
            node_released.send(sender=Node, node=node)


def _set_conditions(pool: NodePool, now: datetime, *conds: tuple) -> None:
    conditions = pool.conditions
    for type_, status, reason, message in conds:
        conditions = set_condition(conditions, type_, status, reason, message, now)
    if conditions != pool.conditions:
        pool.conditions = conditions
        pool.save(update_fields=["conditions", "updated_at"])


def update_cluster_nodes_ready(cluster_id: uuid.UUID, now: datetime) -> None:
    """Write the cluster's ``NodesReady`` condition from its live pools.

    The cluster row is locked with SKIP LOCKED: when the cluster reconciler holds it, the
    update is skipped (the next pool step or resync writes it), which avoids a lock-order
    deadlock between the two reconcilers.
    """
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update(skip_locked=True).filter(pk=cluster_id).first()
        if cluster is None or cluster.phase == Phase.DELETED:
            return
        pools = list(
            NodePool.objects.filter(cluster_id=cluster_id)
            .exclude(phase=Phase.DELETED)
            .values_list("name", "phase")
        )
        not_running = sorted(name for name, phase in pools if phase != Phase.RUNNING)
        if not pools:
            status, reason, message = True, "NoNodePools", "the cluster has no node pools"
        elif not_running:
            status, reason = False, "NodePoolsNotReady"
            message = f"node pools not running: {', '.join(not_running)}"
        else:
            status, reason, message = (
                True,
                "AllNodePoolsRunning",
                f"{len(pools)} node pool(s) running",
            )
        conditions = set_condition(cluster.conditions, "NodesReady", status, reason, message, now)
        if conditions != cluster.conditions:
            Cluster.objects.filter(pk=cluster_id).update(conditions=conditions)


def nodepools_needing_reconcile() -> list[uuid.UUID]:
    """Ids the periodic resync re-enqueues: unconverged, transitional, or cluster deleting."""
    return list(
        NodePool.objects.filter(
            Q(observed_generation__lt=F("generation"))
            | Q(phase__in=(Phase.PROVISIONING, Phase.RECONCILING, Phase.DELETING))
            | Q(cluster__deletion_requested_at__isnull=False)
        )
        .exclude(phase__in=(Phase.DELETED, Phase.DELETE_FAILED))
        .values_list("id", flat=True)
    )
