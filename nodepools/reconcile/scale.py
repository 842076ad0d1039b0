"""Placing missing nodes (all or none, backoff on retryable provider errors) and removing
surplus ones through the one disruption path.
"""

from __future__ import annotations

import logging
import random
import secrets
from datetime import datetime

from django.db import transaction
from django.db.models import F, Q

from clusters.choices import OperationType, Phase
from clusters.models import active_operation, finish_operation, progress_operation
from clusters.providers import MACHINE_REPLACING_PROVIDERS, ProviderError, get_provider
from clusters.providers.base import InsufficientCapacity
from nvke.conditions import get_condition, save_conditions, set_condition

from .. import disruption, host_moves, observed_gates
from ..choices import Disruption, NodePhase
from ..gpu_config import config_hash
from ..models import Node, NodePool
from ..repair import (
    pending_replacements,
    replacement_short,
)
from ..specs import node_spec, nodepool_spec
from ..step_result import GROW_SHORT, Step
from .delete import release_nodes
from .fail import _fail

log = logging.getLogger(__name__)

#: this step's resync clause: a spec not realised yet (placing or removing nodes), a pool
#: short of capacity (retried), and a pool whose machines the infrastructure may replace
RESYNC = (
    Q(observed_generation__lt=F("generation"))
    | Q(phase__in=(Phase.PROVISIONING, Phase.RECONCILING))
    | Q(conditions__contains=[{"type": "CapacityShort", "status": "True"}])
    | Q(phase=Phase.RUNNING, cluster__provider__in=MACHINE_REPLACING_PROVIDERS)
)


def _scale_up(
    pool: NodePool,
    live: list[Node],
    now: datetime,
    count: int | None = None,
    surge: bool = False,
    moving: int = 0,
) -> float | None:
    """Place the missing nodes, all or none; a serving pool growing short takes what fits,
    one node a step (:func:`_place_one`). ``moving``: nodes moving off draining hosts
    beside ``live``; without capacity the pool then runs short
    (:data:`~nodepools.step_result.SHORT`)
    instead of failing; a pool that serves nodes and grows waits for capacity
    (:data:`~nodepools.step_result.GROW_SHORT`, :func:`_grow_short`), a new pool FAILS."""
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
        if moving:  # a host drain took the nodes: run short
            return host_moves.capacity_short(pool, live, str(exc), now)
        if live and (growing_short(pool) or not host_moves.runs_short(pool)):
            # a serving pool takes what fits, one node a step (each placement all or none):
            # a fresh-user trial's pool stayed at 2 of 4 while its CapacityShort said 1 more
            # could be placed and a dry run and the fragmentation view agreed
            if missing > 1 and _place_one(pool, now):
                return 0.0
            return _grow_short(pool, live, str(exc), now)  # serve what it has, retry
        if host_moves.runs_short(pool):
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


def _place_one(pool: NodePool, now: datetime) -> bool:
    """Place one more node of a serving pool whose missing nodes do not all fit: True when it
    was placed (the next step places the next one, or waits for capacity), False when not
    even one fits or the provider refused (nothing held either way)."""
    try:
        _place_nodes(pool, 1, now)
    except (InsufficientCapacity, ProviderError):
        return False
    return True


#: ``CapacityShort``'s reason while a serving pool waits for capacity to grow
GROW_SHORT_REASON = "WaitingForCapacity"


def growing_short(pool: NodePool) -> bool:
    """True while the pool's scale-up waits for capacity (:func:`_grow_short`)."""
    cond = get_condition(pool.conditions, "CapacityShort")
    return bool(cond and cond.get("status") == "True" and cond.get("reason") == GROW_SHORT_REASON)


def _grow_short(pool: NodePool, live: list[Node], reason: str, now: datetime) -> Step:
    """A scale-up of a pool that serves nodes found no capacity for the new ones: the pool
    keeps serving ``live`` (not ERROR), ``CapacityShort`` True says how many nodes are placed
    of how many and why (``3 of 4 nodes placed: no free host …; retried every 30 s``), and
    the resize operation FAILS ``insufficient_capacity`` (retryable) so that it holds no
    lock on the cluster; the reconciler places the missing nodes once capacity comes back
    (``host_moves.SHORT_RETRY_S``). Returns :data:`GROW_SHORT`."""
    message = (
        f"{len(live)} of {pool.node_count} nodes placed: {reason}; "
        f"retried every {host_moves.SHORT_RETRY_S:g} s"
    )
    save_conditions(pool, now, ("CapacityShort", True, GROW_SHORT_REASON, message[:1000]))
    # the failed operation's progress counts the placed nodes its error names
    progress_operation(pool.id, stage="nodes", done=len(live), total=pool.node_count, now=now)
    finish_operation(
        pool.id,
        types=(OperationType.SET_NODE_POOL_SIZE,),
        error={
            "code": "insufficient_capacity",
            "message": (
                f"{message}; the pool serves its {len(live)} node(s) meanwhile "
                "(condition CapacityShort)"
            )[:1000],
            "retryable": True,
        },
        now=now,
    )
    return GROW_SHORT


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
            observed_gates.start_wait(node, now)  # READY needs a report after it boots
    return new_nodes


def _release_replaced(pool: NodePool, live: list[Node], now: datetime) -> bool:
    """Release the READY nodes whose machine the infrastructure replaced by itself (a
    Cluster API MachineHealthCheck remediation): their ledger rows close now and their GPUs
    go back to the fleet; the pool then scales back up with new nodes, placed afresh (maybe
    on another host), which take over the replacement machines. Condition
    ``MachinesReplaced`` says which and why. True when any was released."""
    steady = [n for n in live if n.phase == NodePhase.READY and n.disruption != Disruption.UPGRADE]
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


def _drain_then_release(pool: NodePool, surplus: list[Node], now: datetime) -> float:
    """Scale-down: cordon and drain each surplus node, then release it. Pods that block the
    drain (a disruption budget at its minimum) are waited for up to
    ``NVKE_SCALE_DOWN_DRAIN_TIMEOUT_S`` (then evicted, as cluster autoscalers do), with the
    condition ``ScaleDownBlocked`` and the operation's stage (RUNNING) naming them meanwhile."""
    backend = disruption.backend_for(get_provider(pool.cluster.provider), nodepool_spec(pool))
    policy = disruption.policy_for("scale-down")
    ready, blocked, held = [], [], []
    for node in surplus:
        result = disruption.drain(node, policy, backend, now)
        if result.drained:
            ready.append(node)
        else:
            blocked.append(f"{node.name}: {', '.join(result.blockers)}")
            if result.gated:  # the tenant's checkpoint (nodepools/checkpoints.py)
                held.append(blocked[-1])
    if ready:
        release_nodes(pool, ready, now)
    # progress counts the nodes removed of those the resize removes (its operation's total)
    op = active_operation(pool.id)
    total = max(int((op.progress or {}).get("total") or 0), len(surplus)) if op else len(surplus)
    removed = total - len(surplus) + len(ready)
    # the operation runs and says what holds it (pods, or the tenant's checkpoint)
    stage = (
        f"removing {len(surplus)} node(s): {'; '.join(blocked)}"
        if blocked
        else f"removed {removed} of {total} node(s)"
    )
    progress_operation(pool.id, stage=stage, done=removed, total=total, now=now)
    if blocked:
        why = "WaitingForCheckpoint" if len(held) == len(blocked) else "DrainBlocked"
        save_conditions(pool, now, ("ScaleDownBlocked", True, why, "; ".join(blocked)))
        return 2.0
    save_conditions(pool, now, ("ScaleDownBlocked", False, "Drained", ""))
    return 0.0
