"""The node pool reconciler: one level-triggered, idempotent step per call.

Lock the pool row (``FOR UPDATE SKIP LOCKED``), compare spec with the nodes, take one step,
save status, return the requeue delay (None when converged):

1. deletion requested (the pool's own, or its cluster's — seen through the cluster's
   deletion timestamp): release every node's machine and GPUs (``node_released``), then
   ``DELETED``;
2. the cluster's control plane not RUNNING yet: wait;
3. too few nodes: create the missing Node rows and place their machines through the provider,
   all or none: on ``InsufficientCapacity`` (the fleet cannot hold them even with every other
   claim's lock released) nothing is kept: a new pool goes to ``ERROR`` and its operation
   FAILS with code ``insufficient_capacity``; a pool that serves nodes keeps serving them
   (``RUNNING``, ``CapacityShort``, its resize FAILED retryable so that it holds no lock) and
   retries until capacity comes back; when the missing nodes are replacements (of nodes moved
   off a drained host, or replaced by auto-repair) the pool runs short (``DEGRADED``,
   ``CapacityShort``) and retries the same way; a retryable
   provider error (including ``placement_contended``: concurrent claims hold every fitting
   host) is retried with jittered backoff, condition ``Ready=False`` naming it, until
   ``NVKE_PROVIDER_RETRY_DEADLINE_S`` after the first failure, then ``ERROR`` with the last
   error and how long it was retried;
4. too many nodes: drain and release the surplus, unhealthy nodes first, then the newest
   (:func:`nodepools.disruption.removal_order`);
5. provisioning nodes whose machine is ready become ``READY`` (``node_ready``) once their
   host's agent reports, after the node booted, what the node must run
   (:mod:`nodepools.observed_gates`); until then the node waits with ``observed_problem`` and the
   pool's ``NodesVerified`` condition naming expected vs reported, and past
   ``NVKE_OBSERVED_STATE_TIMEOUT_S`` the operation FAILS with ``observed_state_mismatch``;
6. an isolation change (``UPDATE_ISOLATION``): one node at a time whose applied GPU config
   (``Node.applied_config``) differs from the pool's is drained (``DRAINING``), reconfigured
   (``CORDONED``, disruption ``isolation-change`` at ``validating``) and validated: the
   provider reports the GPU Operator's state and sharing / vGPU devices, the host's agent what
   the GPUs run (MIG mode and instances at their placements, a report after the change,
   waited for up to ``NVKE_OBSERVED_STATE_TIMEOUT_S``); then ``READY`` with ``gpu_layout``. A node
   that fails validation starts a rollback: the pool's previous isolation and GPU config are
   restored and every changed node (the failed one first) goes back the same way, one at a
   time; the operation then FAILS with ``isolation_validation_failed``. A failure while
   rolling back leaves the pool ``DEGRADED`` (``isolation_rollback_failed``);
7. every step with all nodes placed reads the pool's ready count from its nodes' phases
   (:mod:`nodepools.readiness`): a node out of service unplanned (``NOT_READY``: its host is
   NOT_READY; ``REPAIRING``) makes the pool ``DEGRADED`` with ``NodesReady``/``Ready`` False
   naming it and why;
8. all nodes ready -> ``RUNNING``, ``observed_generation = generation``, operation DONE;
9. a pool ``ERROR`` for its current spec (``observed_generation == generation``) is not
   stepped through 3-8: the failed change waits for a new spec or a deletion, which take the
   steps above as usual. Its nodes are still read (step 7: ``NodesReady`` names the nodes out
   of service and the ones the failed change did not place) and repaired
   (:mod:`nodepools.repair`: reboot in place, or release and place exactly one replacement,
   under a REPAIR_NODES operation), while the pool stays ``ERROR`` with ``Ready`` keeping the
   failure (:func:`_step_failed`); converged (None) when nothing is in progress.

After every step on a RUNNING cluster, the cluster's Nodes are written from its hosts' latest
reports (:func:`nodepools.tenant_nodes.sync_cluster_nodes`; a no-op unless the provider
publishes Nodes: ``hosted``, ``clusterapi`` with simulated machines): a node placed and
booted appears, a released one is deleted, a cordoned one is unschedulable. Then the pools'
GPU add-ons (GPU Operator objects, ComputeDomains) are applied to its API
(:func:`nodepools.addons.sync_cluster_addons`; ``hosted`` only) and the stepped pool's
``AddonsApplied`` condition says whether the API took those rendered for it.

The package, one file per step: ``delete`` (1), ``ensure`` (2-8, in order), ``scale`` (3, 4:
placing and removing nodes; removal through :mod:`nodepools.disruption`), ``nodes_up`` (5),
``rollout`` (6), ``failed`` and ``fail`` (9 and how a pool goes ERROR), ``resync`` (the beat's
query and the cluster's ``NodesReady``); :mod:`nodepools.step_result` types what a step
answers. A step that leaves work for later says when the periodic resync must wake the pool in
its module's ``RESYNC`` clause (``delete``, ``scale``, :mod:`nodepools.repair`,
:mod:`nodepools.host_moves`); ``resync`` ORs them.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from clusters.choices import Phase
from clusters.models import progress_operation
from clusters.providers.base import ProviderError
from nvke.conditions import save_conditions

from .. import addons
from ..models import NodePool
from ..step_result import delay_of
from ..tenant_nodes import sync_cluster_nodes

# what other modules and tests use (one import path: ``nodepools.reconcile``)
from .delete import _step_delete, release_nodes
from .ensure import _step_ensure
from .failed import _step_failed
from .nodes_up import observed_layout, validate_layout
from .resync import nodepools_needing_reconcile, update_cluster_nodes_ready
from .rollout import UNKNOWN_CONFIG
from .scale import retry_backoff_s

__all__ = [
    "UNKNOWN_CONFIG",
    "nodepools_needing_reconcile",
    "observed_layout",
    "reconcile_nodepool",
    "release_nodes",
    "retry_backoff_s",
    "update_cluster_nodes_ready",
    "validate_layout",
]

log = logging.getLogger(__name__)

WAIT_FOR_CLUSTER_S = 1.0
SYNC_RETRY_S = 5.0  # the cluster's API refused or did not answer the Nodes: try again
ADDONS_RETRY_S = 30.0  # the cluster's API refused an add-on of the pool: try again


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
            # failed for this spec: the change waits for a new spec (or deletion), but the
            # nodes the pool has are still read and repaired
            delay = _step_failed(pool, now)
        elif pool.cluster.phase != Phase.RUNNING:
            delay = _wait_for_cluster(pool, now)
        else:
            delay = _step_ensure(pool, now)
    update_cluster_nodes_ready(pool.cluster_id, now)
    delay = delay_of(delay)
    if pool.cluster.phase == Phase.RUNNING and pool.cluster.deletion_requested_at is None:
        try:
            sync_cluster_nodes(pool.cluster_id, pool.cluster)
        except ProviderError as exc:
            log.warning("node pool %s: the cluster's Nodes not written: %s", pool.id, exc)
            delay = min(delay if delay is not None else SYNC_RETRY_S, SYNC_RETRY_S)
        delay = _sync_addons(pool, now, delay)
    return delay


def _sync_addons(pool: NodePool, now: datetime, delay: float | None) -> float | None:
    """Apply the cluster's pools' add-ons; record the stepped pool's outcome; the delay,
    shortened while the API did not answer or refused one of the pool's objects."""
    try:
        refused = addons.sync_cluster_addons(pool.cluster_id, pool.cluster)
    except ProviderError as exc:
        log.warning("node pool %s: the cluster's GPU add-ons not applied: %s", pool.id, exc)
        return min(delay if delay is not None else SYNC_RETRY_S, SYNC_RETRY_S)
    if refused is None or pool.deletion_requested_at is not None:
        return delay
    refusal = refused.get(pool.id)
    addons.record(pool.id, refusal, now)
    if refusal:
        log.warning("node pool %s: the cluster's API refused its add-ons: %s", pool.id, refusal)
        return min(delay if delay is not None else ADDONS_RETRY_S, ADDONS_RETRY_S)
    return delay


def _wait_for_cluster(pool: NodePool, now: datetime) -> float:
    message = f"waiting for the cluster's control plane ({pool.cluster.phase})"
    save_conditions(pool, now, ("Ready", False, "WaitingForControlPlane", message))
    progress_operation(pool.id, stage="waiting-for-control-plane", total=pool.node_count, now=now)
    return WAIT_FOR_CLUSTER_S
