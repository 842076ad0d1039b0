"""Deletion (step 1): release every node's machine and GPUs, then DELETED, or DELETE_FAILED
naming the leftovers.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime

from django.db import transaction
from django.db.models import Q

from clusters.choices import OperationType, Phase
from clusters.models import cancel_operations, finish_operation, progress_operation
from clusters.providers import ProviderError, get_provider
from nvke.conditions import set_condition

from .. import disruption
from ..choices import NodePhase
from ..models import Node, NodePool
from ..services import request_deletion
from ..signals import node_released
from ..specs import node_spec, nodepool_spec

log = logging.getLogger(__name__)

#: this step's resync clause (:func:`nodepools.reconcile.resync.nodepools_needing_reconcile`):
#: a pool being deleted, by itself or through its cluster
RESYNC = Q(phase=Phase.DELETING) | Q(cluster__deletion_requested_at__isnull=False)


def _step_delete(pool: NodePool, now: datetime) -> float | None:
    if pool.deletion_requested_at is None:
        # Deleted through its cluster, and the cluster's ``cluster_deleting`` receiver skipped
        # this pool because we held its row (SKIP LOCKED): do what it would have done. The
        # pool's reservation is released exactly once, by whoever first sets
        # ``deletion_requested_at`` under the pool's row lock (here, the receiver or
        # ``delete_nodepool``), so no path that ends a pool keeps its quota.
        request_deletion(pool, "superseded by the cluster's deletion", now)
    if pool.phase != Phase.DELETING:
        pool.phase = Phase.DELETING
        pool.save(update_fields=["phase", "updated_at"])
    nodes = list(pool.nodes.exclude(phase=NodePhase.DELETED))
    if nodes:
        progress_operation(pool.id, stage="releasing-nodes", total=len(nodes), now=now)
        try:
            with transaction.atomic():  # all of the pool's machines, or retry them all
                release_nodes(pool, nodes, now)
        except ProviderError as exc:
            return _delete_attempt_failed(pool, nodes, exc, now)
    pool.phase = Phase.DELETED
    pool.deleted_at = now
    pool.observed_generation = pool.generation
    pool.conditions = set_condition(
        pool.conditions, "Ready", False, "Deleted", "node pool deleted", now
    )
    # what the other conditions said of its nodes (a repair, the ready count) is over too
    for type_, message in (
        ("NodesReady", "0 nodes: the node pool is deleted"),
        ("RepairPending", "the node pool is deleted"),
        ("CapacityShort", "the node pool is deleted"),
    ):
        if any(c.get("type") == type_ for c in pool.conditions):
            pool.conditions = set_condition(pool.conditions, type_, False, "Deleted", message, now)
    pool.save(
        update_fields=["phase", "deleted_at", "observed_generation", "conditions", "updated_at"]
    )
    finish_operation(pool.id, types=(OperationType.DELETE_NODE_POOL,), now=now)
    cancel_operations(pool.id, "superseded by the node pool's deletion", now)
    return None


def _delete_attempt_failed(
    pool: NodePool, nodes: list[Node], exc: ProviderError, now: datetime
) -> float | None:
    """Back off and retry; after NVKE_MAX_DELETE_ATTEMPTS, DELETE_FAILED naming what is left
    (never an endless DELETING)."""
    from django.conf import settings

    attempts = int(pool.rollout.get("delete_attempts", 0)) + 1 if pool.rollout else 1
    leftovers = ", ".join(sorted(n.name for n in nodes))
    if attempts < settings.NVKE_MAX_DELETE_ATTEMPTS and exc.retryable:
        pool.rollout = {**(pool.rollout or {}), "delete_attempts": attempts}
        pool.save(update_fields=["rollout", "updated_at"])
        return float(min(2 ** (attempts - 1), 60))
    message = f"could not delete machines {leftovers} after {attempts} attempt(s): {exc}"
    pool.phase = Phase.DELETE_FAILED
    pool.conditions = set_condition(pool.conditions, "Ready", False, "DeleteFailed", message, now)
    pool.save(update_fields=["phase", "conditions", "updated_at"])
    finish_operation(
        pool.id,
        types=(OperationType.DELETE_NODE_POOL,),
        error={"code": "delete_failed", "message": message, "retryable": True},
        now=now,
    )
    return None


def release_nodes(
    pool: NodePool, nodes: list[Node], now: datetime, *, caller: str = "deletion"
) -> None:
    """Evict the nodes' pods (:mod:`nodepools.disruption`'s backend), delete their machines
    (GPUs back to the fleet), close their allocation. The last act of every disruption
    (scale-down, moves, repair's replacement, deletion). A node still READY or DRAINING is
    drained at once, its machine going anyway (the ``deletion`` policy, or ``repair`` for
    auto-repair's replacement of a failing node: ``caller``, an immediate row of
    :data:`nodepools.disruption.POLICIES`)."""
    provider = get_provider(pool.cluster.provider)
    backend = disruption.backend_for(provider, nodepool_spec(pool))
    policy = disruption.policy_for(caller)
    for node in nodes:
        if node.phase in (NodePhase.READY, NodePhase.DRAINING):
            # a provider that cannot drain: the machine deletion evicts the pods
            with contextlib.suppress(ProviderError):
                disruption.drain(node, policy, backend, now)
    provider.delete_machines(nodepool_spec(pool), [node_spec(n) for n in nodes])
    from fleet.host_warnings import OBSERVED_STATE, set_host_warning

    for node in nodes:
        if node.host_id:  # a gate's warning about this node ends with it (GPUs keep theirs)
            set_host_warning(node.host_id, f"{OBSERVED_STATE}{node.name} ", None)
        was_ready = node.ready_at is not None
        node.phase = NodePhase.DELETED
        node.released_at = now
        node.save(update_fields=["phase", "released_at"])
        if was_ready:
            node_released.send(sender=Node, node=node)
