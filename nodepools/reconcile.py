"""The node pool reconciler: one level-triggered, idempotent step per call.

Lock the pool row (``FOR UPDATE SKIP LOCKED``), compare spec with the nodes, take one step,
save status, return the requeue delay (None when converged):

1. deletion requested (the pool's own, or its cluster's — seen through the cluster's
   deletion timestamp): release every node's machine and GPUs (``node_released``), then
   ``DELETED``;
2. the cluster's control plane not RUNNING yet: wait;
3. too few nodes: create the missing Node rows and place their machines through the provider,
   all or none: on ``InsufficientCapacity`` (the fleet cannot hold them even with every other
   claim's lock released) nothing is kept, the pool goes to ``ERROR`` and its operation FAILS
   with code ``insufficient_capacity`` — unless the missing nodes are replacements (of nodes
   moved off a drained host, or replaced by auto-repair): then the pool runs short
   (``DEGRADED``, ``CapacityShort``) and retries until capacity comes back; a retryable
   provider error (including ``placement_contended``: concurrent claims hold every fitting
   host) is retried with jittered backoff, condition ``Ready=False`` naming it, until
   ``NVKE_PROVIDER_RETRY_DEADLINE_S`` after the first failure, then ``ERROR`` with the last
   error and how long it was retried;
4. too many nodes: release the newest first (scale-down rule: newest nodes go first);
5. provisioning nodes whose machine is ready become ``READY`` (``node_ready``) once their
   host's agent reports, after the node booted, what the node must run
   (:mod:`nodepools.observed`); until then the node waits with ``observed_problem`` and the
   pool's ``NodesVerified`` condition naming expected vs reported, and past
   ``NVKE_OBSERVED_STATE_TIMEOUT_S`` the operation FAILS with ``observed_state_mismatch``;
6. an isolation change (``UPDATE_ISOLATION``): one node at a time whose applied GPU config
   (``Node.applied_config``) differs from the pool's is drained (``DRAINING``), reconfigured
   (``CORDONED``, ``config_state`` ``validating``) and validated: the provider reports the
   GPU Operator's state and sharing / vGPU devices, the host's agent what the GPUs run (MIG
   mode and instances at their placements, a report after the change, waited for up to
   ``NVKE_OBSERVED_STATE_TIMEOUT_S``); then ``READY`` with ``gpu_layout``. A node
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
"""

from __future__ import annotations

import contextlib
import logging
import random
import secrets
import uuid
from dataclasses import replace
from datetime import datetime

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from clusters.choices import OperationType, Phase
from clusters.models import Cluster, cancel_operations, finish_operation, progress_operation
from clusters.providers import MACHINE_REPLACING_PROVIDERS, ProviderError, get_provider
from clusters.providers.base import InsufficientCapacity, NodePoolSpec, Provider
from nvke.conditions import save_conditions, set_condition

from . import disruption, host_moves, observed, readiness, shared
from .choices import LIVE_NODE_PHASES, NodePhase
from .gpu_config import config_hash
from .models import Node, NodePool
from .repair import (
    REPLACING,
    pending_replacements,
    placed_replacements,
    replacement_short,
    replacement_waits,
    step_repair,
)
from .services import request_deletion
from .signals import node_ready, node_released
from .specs import node_spec, nodepool_spec
from .upgrade_steps import step_upgrade, upgrade_surge

log = logging.getLogger(__name__)

WAIT_FOR_CLUSTER_S = 1.0


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
    return delay


def _wait_for_cluster(pool: NodePool, now: datetime) -> float:
    message = f"waiting for the cluster's control plane ({pool.cluster.phase})"
    save_conditions(pool, now, ("Ready", False, "WaitingForControlPlane", message))
    progress_operation(pool.id, stage="waiting-for-control-plane", total=pool.node_count, now=now)
    return WAIT_FOR_CLUSTER_S


def _step_ensure(pool: NodePool, now: datetime) -> float | None:
    live = list(pool.nodes.live().order_by("created_at", "name"))
    if _release_replaced(pool, live, now):
        return 0.0  # the next step creates their successors
    # nodes moving off a draining host do not count: their replacements are placed first
    hosts = host_moves.mark_moving(pool, live, now)
    counted = [n for n in live if not n.move_state]
    desired = pool.node_count + upgrade_surge(pool, counted)
    short = False
    if len(counted) < pool.node_count:
        delay = _scale_up(pool, counted, now, moving=len(live) - len(counted))
        if delay != host_moves.SHORT:
            return delay
        if len(counted) == len(live):  # short, nothing left to move: try again later
            host_moves.finish(pool, now)
            return host_moves.SHORT_RETRY_S
        short = True  # the moving nodes go on without a replacement
    elif len(counted) < desired:  # only surge nodes are missing: without capacity, do without
        return _scale_up(pool, counted, now, count=desired, surge=True)
    elif len(counted) > desired:
        # scale-down rule (disruption.removal_order): unhealthy nodes first, then the newest
        # (surge nodes at the end of an upgrade)
        surplus = disruption.removal_order(counted)[: len(counted) - desired]
        return _drain_then_release(pool, surplus, now)
    provider = get_provider(pool.cluster.provider)
    spec = nodepool_spec(pool)
    waits, unverified, failed = _bring_up(pool, live, provider, spec, now)
    if failed is not None:
        return _fail(pool, "observed_state_mismatch", failed, retryable=True, now=now)
    ready = sum(1 for n in live if n.phase == NodePhase.READY)
    if waits:
        save_conditions(
            pool,
            now,
            ("Ready", False, "NodesProvisioning", f"{ready} of {pool.node_count} nodes ready"),
            _verified(unverified),
        )
        progress_operation(pool.id, stage="nodes", done=ready, total=pool.node_count, now=now)
        return min(waits)
    if pool.phase == Phase.DEGRADED and any(n.applied_config == UNKNOWN_CONFIG for n in live):
        return None  # a node's GPUs are in an unknown state: an operator must repair it
    moving = host_moves.step_moves(pool, live, hosts, provider, spec, now)
    if moving == STOP:
        return None
    if moving is not None:
        return moving
    if short:
        return host_moves.SHORT_RETRY_S
    live = counted
    host_moves.clear_short(pool, now)
    # the pool's ready count and NodesReady are read from its nodes now, at every step
    state = readiness.write_readiness(pool, live, now)
    repairing = step_repair(pool, live, provider, spec, now)
    if repairing is not None:
        return repairing
    rolling = _step_rollout(pool, live, provider, spec, now)
    if rolling == STOP:
        return None
    if rolling is not None:
        return rolling
    if pool.rollout:
        _finish_rollout(pool, now)
    upgrading = step_upgrade(pool, live, provider, spec, now)
    if upgrading == STOP:
        return None
    if upgrading is not None:
        return upgrading
    if state.degraded:
        # the spec is realised (its nodes exist; a create or resize is DONE), but the pool
        # stays DEGRADED until its nodes are READY again or repaired
        if pool.phase != Phase.DEGRADED or pool.observed_generation != pool.generation:
            pool.phase = Phase.DEGRADED
            pool.observed_generation = pool.generation
            pool.save(update_fields=["phase", "observed_generation", "updated_at"])
            _finish_size_operations(pool, now)
        return readiness.next_look_s(live, now)
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
    pool.conditions = set_condition(pool.conditions, *_verified([]), now)
    pool.save(update_fields=["phase", "observed_generation", "conditions", "updated_at"])
    _finish_size_operations(pool, now)
    return None


def _bring_up(
    pool: NodePool, nodes: list[Node], provider: Provider, spec: NodePoolSpec, now: datetime
) -> tuple[list[float], list[str], str | None]:
    """Make READY each PROVISIONING node of ``nodes`` whose machine is ready and whose host's
    agent reports what it must run. Returns ``(waits, unverified, failed)``: the delays (s)
    of the nodes still provisioning, the differences of those waiting for their agent, and
    the problem of the first node past ``NVKE_OBSERVED_STATE_TIMEOUT_S`` (None if none; the
    nodes after it are not looked at)."""
    waits: list[float] = []
    unverified: list[str] = []
    for node in nodes:
        if node.phase != NodePhase.PROVISIONING:
            continue
        status = provider.machine_status(spec, node_spec(node), now)
        if not status.ready:
            waits.append(status.retry_after_s)
            continue
        # READY only when the host's agent reports what the node must run (observed.py)
        verdict, problem = observed.gate(
            pool, node, observed.expectation(pool), what="to become READY", now=now
        )
        if verdict == observed.FAILED:
            return waits, unverified, problem
        if verdict == observed.WAITING:
            unverified.append(problem)
            waits.append(OBSERVED_POLL_S)
            continue
        node.phase = NodePhase.READY
        node.ready_at = now
        try:
            report = provider.node_config_status(spec, node_spec(node), now)
        except ProviderError:  # a provider that cannot report it: sharing stays unknown
            report = None
        node.gpu_layout = observed_layout(
            node, list(report.gpu_layout) if report and report.state == "success" else []
        )
        node.save(update_fields=["phase", "ready_at", "gpu_layout"])
        # a VM node of a shared host bills one ledger row per GPU instance, by fraction
        node_ready.send(sender=Node, node=node, allocations=shared.allocations(node))
    return waits, unverified, None


def _step_failed(pool: NodePool, now: datetime) -> float | None:
    """A step of a pool ERROR for its current spec (step 9 of the module docstring).

    The failed change is not retried (a new spec or a deletion moves the pool on); the nodes
    the pool has are still read (:mod:`nodepools.readiness`) and repaired
    (:mod:`nodepools.repair`) as in a RUNNING pool. A replaced node gets exactly one
    replacement (:func:`nodepools.repair.placed_replacements`), never the nodes the failed
    change asked for; without capacity for it the placement is retried every
    ``SHORT_RETRY_S`` (``RepairPending`` says why). The phase stays ERROR and ``Ready`` keeps
    the failure. Returns None when nothing is in progress.
    """
    if pool.cluster.phase != Phase.RUNNING:
        return None  # its nodes are looked at once the control plane is back (beat's resync)
    live = list(pool.nodes.live().order_by("created_at", "name"))
    unplaced, placed = placed_replacements(pool, live)
    if unplaced:
        try:
            _place_nodes(pool, len(unplaced), now, replaces=unplaced)
        except (InsufficientCapacity, ProviderError) as exc:
            why = (
                str(exc) if isinstance(exc, InsufficientCapacity) else f"the provider failed: {exc}"
            )
            readiness.write_readiness(pool, live, now)
            return replacement_waits(pool, unplaced, why, now)
        return 0.0  # the next step brings the replacement up
    provider = get_provider(pool.cluster.provider)
    spec = nodepool_spec(pool)
    waits, unverified, failed = _bring_up(pool, placed, provider, spec, now)
    if placed:
        save_conditions(pool, now, _verified([failed] if failed else unverified))
    if failed is not None or waits:
        readiness.write_readiness(pool, live, now)
    if failed is not None:
        # the replacement never agreed with its host's agent: the repair fails, the node
        # stays as a new node of a failed change does (an operator looks, or a new spec)
        error = {"code": "observed_state_mismatch", "message": failed, "retryable": True}
        finish_operation(pool.id, types=(OperationType.REPAIR_NODES,), error=error, now=now)
        return None
    if waits:
        return min(waits)
    repairing = step_repair(pool, live, provider, spec, now)
    # read after the repair step, so that a node it took out of service is named at once
    live = [n for n in live if n.phase in LIVE_NODE_PHASES]
    readiness.write_readiness(pool, live, now)
    if repairing is not None:
        return repairing
    return readiness.next_look_s(live, now)


def _finish_size_operations(pool: NodePool, now: datetime) -> None:
    """The pool has the nodes its spec asks for: its create / resize operation is DONE."""
    finish_operation(
        pool.id,
        types=(OperationType.CREATE_NODE_POOL, OperationType.SET_NODE_POOL_SIZE),
        now=now,
    )


def _scale_up(
    pool: NodePool,
    live: list[Node],
    now: datetime,
    count: int | None = None,
    surge: bool = False,
    moving: int = 0,
) -> float | None:
    """Place the missing nodes, all or none. ``moving``: nodes moving off draining hosts
    beside ``live``; without capacity the pool then runs short (``host_moves.SHORT``)
    instead of failing."""
    missing = (count if count is not None else pool.node_count) - len(live)
    try:
        _place_nodes(pool, missing, now)
    except InsufficientCapacity as exc:
        if surge:  # no room for surge nodes: upgrade in place instead
            pool.upgrade = {**pool.upgrade, "max_surge": 0, "surge_unavailable": str(exc)}
            pool.save(update_fields=["upgrade", "updated_at"])
            return 0.0
        replaced = pending_replacements(pool)
        if replaced:  # an auto-repair released nodes: run short, retry (never ERROR)
            return replacement_short(pool, live, replaced, str(exc), now)
        if moving or host_moves.runs_short(pool):  # a host drain took the nodes: run short
            return host_moves.capacity_short(pool, live, str(exc), now)
        return _fail(pool, "insufficient_capacity", str(exc), retryable=True, now=now)
    except ProviderError as exc:
        if exc.retryable:
            return _retry_provisioning(pool, exc, now)
        return _fail(
            pool, exc.code, f"the infrastructure provider failed: {exc}", exc.retryable, now
        )
    fields = ["updated_at"]
    if pool.provision_failures or pool.provision_retry_since:
        pool.provision_failures, pool.provision_retry_since = 0, None
        fields += ["provision_failures", "provision_retry_since"]
    if pool.phase not in (Phase.PROVISIONING, Phase.RECONCILING):
        pool.phase = Phase.RECONCILING
        fields.append("phase")
    if len(fields) > 1:
        pool.save(update_fields=fields)
    progress_operation(pool.id, stage="nodes", done=0, total=pool.node_count, now=now)
    return 0.0


def _place_nodes(
    pool: NodePool, count: int, now: datetime, replaces: list[Node] | None = None
) -> list[Node]:
    """Create ``count`` Node rows and place their machines through the provider, all or
    none: on ``InsufficientCapacity`` or a ``ProviderError`` (raised) no Node row and no GPU
    stays held. The new nodes are PROVISIONING, waiting for their host's agent; with
    ``replaces`` (``count`` released nodes) each new node records the one it replaces."""
    k8s = (
        pool.kubernetes_version
        or pool.cluster.control_plane_version
        or pool.cluster.kubernetes_version
    )
    provider = get_provider(pool.cluster.provider)
    with transaction.atomic():  # savepoint: on failure no Node row and no GPU stays held
        new_nodes = [
            Node.objects.create(
                tenant_id=pool.tenant_id,
                cluster_id=pool.cluster_id,
                nodepool=pool,
                name=f"{pool.cluster.name}-{pool.name}-{secrets.token_hex(3)}",
                created_at=now,
                kubernetes_version=k8s,
                driver_version=pool.driver_version,
                replaces=replaces[i] if replaces else None,
            )
            for i in range(count)
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
            node.applied_config = config_hash(pool.gpu_config)  # what it boots with
            node.save(update_fields=["host", "zone", "gpu_uuids", "applied_config"])
            observed.start_wait(node, now)  # READY needs a report after it boots
    return new_nodes


def _release_replaced(pool: NodePool, live: list[Node], now: datetime) -> bool:
    """Release the READY nodes whose machine the infrastructure replaced by itself (a
    Cluster API MachineHealthCheck remediation): their ledger rows close now and their GPUs
    go back to the fleet; the pool then scales back up with new nodes, placed afresh (maybe
    on another host), which take over the replacement machines. Condition
    ``MachinesReplaced`` says which and why. True when any was released."""
    steady = [n for n in live if n.phase == NodePhase.READY and not n.upgrade_state]
    if not steady:
        return False
    provider = get_provider(pool.cluster.provider)
    try:
        replaced = provider.replaced_machines(nodepool_spec(pool), [node_spec(n) for n in steady])
    except ProviderError as exc:
        log.warning("pool %s: cannot check for replaced machines: %s", pool.id, exc)
        return False
    if not replaced:
        return False
    by_id = {n.id: n for n in steady}
    gone = [by_id[r.node_id] for r in replaced if r.node_id in by_id]
    release_nodes(pool, gone, now)
    message = "; ".join(f"{by_id[r.node_id].name}: {r.reason}" for r in replaced)
    save_conditions(pool, now, ("MachinesReplaced", True, "InfrastructureReplaced", message))
    return True


def retry_backoff_s(failures: int) -> float:
    """Delay before attempt ``failures + 1``: 0.5 s doubling to 30 s, times a random 0.5-1.0
    (jitter, so claimants that met on the same hosts do not meet again at the same instant)."""
    return min(0.5 * 2 ** max(failures - 1, 0), 30.0) * random.uniform(0.5, 1.0)


def _retry_provisioning(pool: NodePool, exc: ProviderError, now: datetime) -> float | None:
    """A retryable failure to create nodes: back off, or ERROR once the deadline has passed."""
    from django.conf import settings

    pool.provision_failures += 1
    pool.provision_retry_since = pool.provision_retry_since or now
    waited = (now - pool.provision_retry_since).total_seconds()
    if waited >= settings.NVKE_PROVIDER_RETRY_DEADLINE_S:
        message = (
            f"gave up creating nodes after {pool.provision_failures} attempt(s) over "
            f"{waited:.0f} s (deadline {settings.NVKE_PROVIDER_RETRY_DEADLINE_S:.0f} s); "
            f"last error: {exc}"
        )
        pool.provision_failures, pool.provision_retry_since = 0, None
        pool.save(update_fields=["provision_failures", "provision_retry_since", "updated_at"])
        return _fail(pool, exc.code, message, retryable=True, now=now)
    delay = retry_backoff_s(pool.provision_failures)
    reason = "PlacementContended" if exc.code == "placement_contended" else "ProviderRetrying"
    pool.conditions = set_condition(
        pool.conditions,
        "Ready",
        False,
        reason,
        f"attempt {pool.provision_failures} failed, retrying in {delay:.1f} s: {exc}",
        now,
    )
    pool.save(
        update_fields=["provision_failures", "provision_retry_since", "conditions", "updated_at"]
    )
    log.info(
        "pool %s: %s (attempt %d), retry in %.1f s", pool.id, exc, pool.provision_failures, delay
    )
    return delay


#: ``Node.applied_config`` of a node whose reconfiguration failed: matches no config
UNKNOWN_CONFIG = "unknown"
#: what :func:`_step_rollout` returns when the pool must stop (DEGRADED)
STOP = -1.0


def _step_rollout(
    pool: NodePool, live: list[Node], provider: Provider, spec: NodePoolSpec, now: datetime
) -> float | None:
    """One step of an isolation change; None when every node runs the pool's config."""
    desired = config_hash(pool.gpu_config)
    node = next((n for n in live if n.config_state), None) or next(
        (n for n in live if n.phase == NodePhase.READY and n.applied_config not in ("", desired)),
        None,
    )
    if node is None:
        return None
    stage_prefix = "rollback" if pool.rollout.get("state") == "rolling-back" else "update"
    total = sum(1 for n in live if n.applied_config not in ("", desired)) + _done(pool)
    if pool.phase != Phase.RECONCILING:
        pool.phase = Phase.RECONCILING
        pool.save(update_fields=["phase", "updated_at"])
    try:
        return _rollout_node(pool, node, provider, spec, desired, total, stage_prefix, now)
    except ProviderError as exc:
        if exc.retryable:
            log.warning("pool %s: provider error on node %s: %s", pool.id, node.name, exc)
            return PROVIDER_RETRY_S
        message = f"the infrastructure provider failed: {exc}"
        if not node.config_state and not _done(pool) and pool.rollout.get("state") == "rolling":
            return _abort_rollout(pool, exc.code, message, now)  # no node was touched yet
        return _node_config_failed(pool, node, message, now)


def _abort_rollout(pool: NodePool, code: str, message: str, now: datetime) -> float:
    """Nothing changed on any node: restore the previous spec, FAIL the operation."""
    error = {"code": code, "message": message, "retryable": False}
    pool.isolation = pool.rollout["from_isolation"]
    pool.gpu_config = pool.rollout["from_gpu_config"]
    pool.rollout = {}
    pool.phase = Phase.RUNNING
    pool.observed_generation = pool.generation
    pool.conditions = set_condition(
        pool.conditions, "IsolationUpdated", False, _reason(code), message, now
    )
    pool.save(
        update_fields=[
            "isolation",
            "gpu_config",
            "rollout",
            "phase",
            "observed_generation",
            "conditions",
            "updated_at",
        ]
    )
    finish_operation(pool.id, types=(OperationType.UPDATE_ISOLATION,), error=error, now=now)
    return STOP


#: back-off after a retryable provider error during a rollout (s)
PROVIDER_RETRY_S = 5.0
#: an isolation change waits for the pods that block a node's drain, without a deadline
ISOLATION_DRAIN = disruption.DrainPolicy(timeout_s=float("inf"), on_timeout="pause")


def _rollout_node(
    pool: NodePool,
    node: Node,
    provider: Provider,
    spec: NodePoolSpec,
    desired: str,
    total: int,
    stage_prefix: str,
    now: datetime,
) -> float:
    """Drain -> reconfigure -> validate, one transition per call (see the module docstring)."""
    backend = disruption.backend_for(provider, spec)
    if not node.config_state:  # 1. cordon
        disruption.cordon(node, backend, now)
        node.config_state = "draining"
        node.save(update_fields=["config_state"])
        _progress(pool, f"{stage_prefix}: draining {node.name}", total, now)
        return 0.0
    if node.config_state == "draining":  # 2. drain, then repartition / reconfigure
        if not disruption.drain(node, ISOLATION_DRAIN, backend, now).drained:
            return 1.0  # pods that block it are waited for (no timeout: nothing is evicted)
        observed.start_wait(node, now)  # validation needs a report after the change
        provider.apply_node_config(spec, node_spec(node))
        node.phase = NodePhase.CORDONED
        node.config_state = "validating"
        node.save(update_fields=["phase", "config_state"])
        _progress(pool, f"{stage_prefix}: repartitioning {node.name}", total, now)
        return 0.0
    report = provider.node_config_status(spec, node_spec(node), now)  # 3. validate
    if report.state == "pending":
        return report.retry_after_s
    if report.state != "success":
        return _node_config_failed(pool, node, report.message, now)
    # what the GPUs run is the host agent's to say (a wedged MIG Manager still says success)
    verdict, problem = observed.gate(
        pool, node, observed.expectation(pool), what="after the isolation change", now=now
    )
    if verdict == observed.WAITING:
        save_conditions(pool, now, _verified([problem]))
        return OBSERVED_POLL_S
    if verdict == observed.FAILED:
        return _node_config_failed(pool, node, problem.split(": ", 1)[-1], now)
    layout = observed_layout(node, list(report.gpu_layout))
    problem = validate_layout(pool, node, layout)
    if problem is not None:
        return _node_config_failed(pool, node, problem, now)
    save_conditions(pool, now, _verified([]))
    node.phase = NodePhase.READY
    node.config_state = ""
    node.applied_config = desired
    node.gpu_layout = layout
    node.save(update_fields=["phase", "config_state", "applied_config", "gpu_layout"])
    pool.rollout["done"] = _done(pool) + 1
    pool.save(update_fields=["rollout", "updated_at"])
    _progress(pool, f"{stage_prefix}: {node.name} validated", total, now)
    return 0.0


def _done(pool: NodePool) -> int:
    return int(pool.rollout.get("done", 0)) if pool.rollout else 0


def _progress(pool: NodePool, stage: str, total: int, now: datetime) -> None:
    progress_operation(pool.id, stage=stage, done=_done(pool), total=max(total, 1), now=now)


#: how often a node waiting for its host's agent is looked at again (s)
OBSERVED_POLL_S = 2.0
#: retry delay after a placement that found a fitting host's row locked (s)


def _verified(problems: list[str]) -> tuple:
    """The pool condition ``NodesVerified``: False naming every node that waits for its
    host's agent (expected vs reported), True when none does."""
    if problems:
        return ("NodesVerified", False, "ObservedStateMismatch", "; ".join(problems)[:1000])
    return ("NodesVerified", True, "AgentReportsAgree", "")


def observed_layout(node: Node, provider_layout: list[dict]) -> list[dict]:
    """``Node.gpu_layout``: per GPU the MIG devices the host's agent reports (profile,
    start, size) and the sharing / vGPU devices the provider's device plugin config says."""
    from fleet.observed import host_facts

    facts = host_facts(node.host_id, node.gpu_uuids) if node.host_id else None
    by_gpu = {g.get("gpu_uuid"): g for g in provider_layout}
    own = shared.node_slices(node)  # shared host: never show other tenants' instances
    out = []
    for gpu_uuid in node.gpu_uuids:
        gpu = facts.gpus.get(gpu_uuid) if facts else None
        if gpu is not None and own is not None:
            gpu = replace(
                gpu, instances=tuple(i for i in gpu.instances if i in own.get(gpu_uuid, ()))
            )
        extra = by_gpu.get(gpu_uuid) or {}
        out.append(
            {
                "gpu_uuid": gpu_uuid,
                "mig_devices": [
                    {"profile": p, "start": st, "size": sz} for p, st, sz in gpu.instances
                ]
                if gpu
                else [],
                "sharing": extra.get("sharing"),
                "vgpu_devices": extra.get("vgpu_devices") or {},
            }
        )
    return out


def validate_layout(pool: NodePool, node: Node, layout: list[dict]) -> str | None:
    """None when ``layout`` (per GPU: the MIG devices the agent reports, the sharing and vGPU
    devices the provider reports) matches the pool's config on every
    GPU of the node: the same MIG instances (profile multiset) at placements valid by the
    catalog's table and not overlapping, the same sharing and vGPU devices; else why not.

    Placements may differ from NVKE's plan (MIG Manager chooses its own); validity is what
    counts.
    """
    from catalog.mig import MigTable

    config = pool.gpu_config
    wanted = sorted(d["profile"] for d in config.get("mig_layout") or [])
    by_gpu = {g.get("gpu_uuid"): g for g in layout}
    table = MigTable.from_gpu_model(pool.gpu_model) if wanted else None
    for gpu_id in node.gpu_uuids:
        gpu = by_gpu.get(gpu_id)
        if gpu is None:
            return f"{gpu_id} is missing from the node's GPU report"
        devices = gpu.get("mig_devices") or []
        if sorted(d["profile"] for d in devices) != wanted:
            return (
                f"{gpu_id} runs MIG devices {sorted(d['profile'] for d in devices)}, "
                f"expected {wanted}"
            )
        used = 0
        for device in devices:
            spec = table.profile(device["profile"]) if table else None
            bits = ((1 << device["size"]) - 1) << device["start"]
            if spec is None or device["start"] not in spec.starts or device["size"] != spec.size:
                where = f"{device['profile']} at start {device['start']}"
                return f"{gpu_id}: {where} is not a valid placement"
            if used & bits:
                return f"{gpu_id}: MIG devices overlap at start {device['start']}"
            used |= bits
        plugin = (config.get("device_plugin_config") or {}).get("sharing") or {}
        expected_sharing = None
        for key, strategy in (("timeSlicing", "time-slicing"), ("mps", "mps")):
            if key in plugin:
                expected_sharing = {
                    "strategy": strategy,
                    "replicas": plugin[key]["resources"][0]["replicas"],
                }
        if gpu.get("sharing") != expected_sharing:
            return f"{gpu_id} shares as {gpu.get('sharing')}, expected {expected_sharing}"
        vgpu = config.get("vgpu_device_manager_config") or {}
        expected_vgpu: dict = {}
        for entries in (vgpu.get("vgpu-configs") or {}).values():
            for entry in entries:
                expected_vgpu.update(entry.get("vgpu-devices") or {})
        if (gpu.get("vgpu_devices") or {}) != expected_vgpu:
            return f"{gpu_id} runs vGPU devices {gpu.get('vgpu_devices')}, expected {expected_vgpu}"
    return None


def _node_config_failed(pool: NodePool, node: Node, problem: str, now: datetime) -> float:
    message = f"node {node.name} failed validation: {problem}"
    if pool.rollout.get("state") == "rolling-back" or not pool.rollout:
        # the previous config does not come back either: stop, keep the node out of service
        node.phase = NodePhase.NOT_READY
        node.config_state = ""
        node.applied_config = UNKNOWN_CONFIG
        node.save(update_fields=["phase", "config_state", "applied_config"])
        pool.phase = Phase.DEGRADED
        pool.observed_generation = pool.generation
        error = {
            "code": "isolation_rollback_failed",
            "message": f"rollback failed: {message}",
            "retryable": False,
        }
        pool.conditions = set_condition(
            pool.conditions, "Ready", False, "IsolationRollbackFailed", error["message"], now
        )
        pool.rollout = {}
        pool.save(
            update_fields=["phase", "observed_generation", "conditions", "rollout", "updated_at"]
        )
        finish_operation(pool.id, types=(OperationType.UPDATE_ISOLATION,), error=error, now=now)
        return STOP
    log.warning("isolation change of pool %s rolls back: %s", pool.id, message)
    rollout = dict(pool.rollout)
    rollout.update(
        state="rolling-back",
        done=0,
        error={"code": "isolation_validation_failed", "message": message, "retryable": False},
        failed_node=node.name,
        to_isolation=pool.isolation,
    )
    pool.isolation = rollout["from_isolation"]
    pool.gpu_config = rollout["from_gpu_config"]
    pool.rollout = rollout
    pool.conditions = set_condition(
        pool.conditions, "Ready", False, "IsolationRollingBack", message, now
    )
    pool.save(update_fields=["isolation", "gpu_config", "rollout", "conditions", "updated_at"])
    # the failed node's GPUs are in an unknown state: it is reconfigured first (still drained)
    node.applied_config = UNKNOWN_CONFIG
    node.config_state = "draining"
    node.save(update_fields=["applied_config", "config_state"])
    _progress(pool, f"rollback: {message}", 1, now)
    return 0.0


def _finish_rollout(pool: NodePool, now: datetime) -> None:
    """Every node runs the pool's config: the update is DONE, or the rollback finished and
    the operation FAILS with the validation error."""
    error = pool.rollout.get("error") if pool.rollout.get("state") == "rolling-back" else None
    pool.rollout = {}
    if error:
        pool.conditions = set_condition(
            pool.conditions, "IsolationUpdated", False, "RolledBack", error["message"], now
        )
    else:
        pool.conditions = set_condition(
            pool.conditions, "IsolationUpdated", True, "AllNodesValidated", "", now
        )
    pool.save(update_fields=["rollout", "conditions", "updated_at"])
    finish_operation(pool.id, types=(OperationType.UPDATE_ISOLATION,), error=error, now=now)


def _fail(pool: NodePool, code: str, message: str, retryable: bool, now: datetime) -> None:
    log.warning("node pool %s (%s) goes ERROR: %s: %s", pool.id, pool.name, code, message)
    pool.phase = Phase.ERROR
    pool.observed_generation = pool.generation
    pool.conditions = set_condition(pool.conditions, "Ready", False, _reason(code), message, now)
    # NodesReady as the next steps read it (_step_failed): the nodes it has, those not placed
    live = list(pool.nodes.live().order_by("created_at", "name"))
    pool.conditions = set_condition(
        pool.conditions, *readiness.nodes_ready(readiness.readiness(pool, live)), now
    )
    pool.save(update_fields=["phase", "observed_generation", "conditions", "updated_at"])
    finish_operation(
        pool.id, error={"code": code, "message": message, "retryable": retryable}, now=now
    )
    return None


def _reason(code: str) -> str:
    return "".join(part.capitalize() for part in code.split("_"))


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


def _drain_then_release(pool: NodePool, surplus: list[Node], now: datetime) -> float:
    """Scale-down: cordon and drain each surplus node, then release it. Pods that block the
    drain (a disruption budget at its minimum) are waited for up to
    ``NVKE_SCALE_DOWN_DRAIN_TIMEOUT_S`` (then evicted, as cluster autoscalers do), with the
    condition ``ScaleDownBlocked`` naming them meanwhile."""
    from django.conf import settings

    backend = disruption.backend_for(get_provider(pool.cluster.provider), nodepool_spec(pool))
    policy = disruption.DrainPolicy(
        timeout_s=settings.NVKE_SCALE_DOWN_DRAIN_TIMEOUT_S, on_timeout="evict"
    )
    ready, blocked = [], []
    for node in surplus:
        result = disruption.drain(node, policy, backend, now)
        if result.drained:
            ready.append(node)
        else:
            blocked.append(f"{node.name}: {', '.join(result.blockers)}")
    if ready:
        release_nodes(pool, ready, now)
    if blocked:
        save_conditions(pool, now, ("ScaleDownBlocked", True, "DrainBlocked", "; ".join(blocked)))
        return 2.0
    save_conditions(pool, now, ("ScaleDownBlocked", False, "Drained", ""))
    return 0.0


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


def release_nodes(pool: NodePool, nodes: list[Node], now: datetime) -> None:
    """Drain the nodes, delete their machines (GPUs back to the fleet), close their allocation."""
    provider = get_provider(pool.cluster.provider)
    for node in nodes:
        if node.phase in (NodePhase.READY, NodePhase.DRAINING):
            # a provider that cannot drain: the machine deletion evicts the pods
            with contextlib.suppress(ProviderError):
                provider.drain_node(nodepool_spec(pool), node_spec(node))
    provider.delete_machines(nodepool_spec(pool), [node_spec(n) for n in nodes])
    from fleet.observed import set_host_warning

    for node in nodes:
        if node.host_id:  # a gate's warning about this node ends with it (GPUs keep theirs)
            set_host_warning(node.host_id, f"observed state: node {node.name} ", None)
        was_ready = node.ready_at is not None
        node.phase = NodePhase.DELETED
        node.released_at = now
        node.save(update_fields=["phase", "released_at"])
        if was_ready:
            node_released.send(sender=Node, node=node)


def update_cluster_nodes_ready(cluster_id: uuid.UUID, now: datetime) -> None:
    """Write the cluster's ``NodesReady`` condition from its live pools.

    The cluster row is locked with SKIP LOCKED: when the cluster reconciler holds it, the
    update is skipped (the next pool step or resync writes it), which avoids a lock-order
    deadlock between the two reconcilers.
    """
    with transaction.atomic():
        cluster = (
            Cluster.objects.select_for_update(skip_locked=True, no_key=True)
            .filter(pk=cluster_id)
            .first()
        )
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
            | Q(nodes__phase=NodePhase.NOT_READY)
            # a live node marked for repair, or a released one waiting for its replacement
            | Q(nodes__phase__in=LIVE_NODE_PHASES, nodes__repair_state__gt="")
            | Q(nodes__repair_state=REPLACING)
            # the infrastructure may replace their machines by itself (health checks)
            | Q(phase=Phase.RUNNING, cluster__provider__in=MACHINE_REPLACING_PROVIDERS)
            | Q(nodes__move_state__in=host_moves.MOVING_STATES)
            | Q(nodes__phase__in=LIVE_NODE_PHASES, nodes__host__drain_target__gt="")
            | Q(conditions__contains=[{"type": "CapacityShort", "status": "True"}])
        )
        .exclude(phase__in=(Phase.DELETED, Phase.DELETE_FAILED))
        .values_list("id", flat=True)
        .distinct()
    )
