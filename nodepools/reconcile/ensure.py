"""The steady step of a node pool (steps 3-8 of the package docstring): scale, bring nodes up,
move nodes off draining hosts, repair, isolation change, upgrade, then RUNNING or DEGRADED.
"""

from __future__ import annotations

import logging
from datetime import datetime

from clusters.choices import OperationType, Phase
from clusters.models import finish_operation, progress_operation
from clusters.providers import get_provider
from nvke.conditions import save_conditions, set_condition

from .. import disruption, drift, host_moves, readiness
from ..choices import Disruption, NodePhase
from ..models import NodePool
from ..repair import step_repair
from ..specs import nodepool_spec
from ..step_result import GROW_SHORT, SHORT, STOP
from ..upgrade_steps import step_upgrade, upgrade_surge
from .fail import _fail
from .nodes_up import _bring_up, _verified
from .rollout import UNKNOWN_CONFIG, _finish_rollout, _step_rollout
from .scale import _drain_then_release, _release_replaced, _scale_up

log = logging.getLogger(__name__)


def _step_ensure(pool: NodePool, now: datetime) -> float | None:
    live = list(pool.nodes.live().order_by("created_at", "name"))
    if _release_replaced(pool, live, now):
        return 0.0  # the next step creates their successors
    # nodes moving off a draining host do not count: their replacements are placed first
    hosts = host_moves.mark_moving(pool, live, now)
    counted = [n for n in live if n.disruption != Disruption.MOVE]
    desired = pool.node_count + upgrade_surge(pool, counted)
    short = grow_short = False
    if len(counted) < pool.node_count:
        delay = _scale_up(pool, counted, now, moving=len(live) - len(counted))
        if delay is GROW_SHORT:
            grow_short = True  # no room to grow: the nodes it has are served as usual
        elif delay is not SHORT:
            return delay
        elif len(counted) == len(live):  # short, nothing left to move: try again later
            host_moves.finish(pool, now)
            return host_moves.SHORT_RETRY_S
        else:
            short = True  # the moving nodes go on without a replacement
    elif len(counted) < desired:  # only surge nodes are missing: without capacity, do without
        return _scale_up(pool, counted, now, count=desired, surge=True)
    elif len(counted) > desired:
        # scale-down rule (disruption.removal_order): unhealthy nodes first, then the newest
        # (surge nodes at the end of an upgrade)
        surplus = disruption.removal_order(counted)[: len(counted) - desired]
        return _drain_then_release(pool, surplus, now)
    # a scale-down no longer wanted (the pool grew back): its nodes go back into service
    for node in counted:
        if node.disruption == Disruption.SCALE_DOWN:
            disruption.end(node, phase=NodePhase.READY)
    provider = get_provider(pool.cluster.provider)
    spec = nodepool_spec(pool)
    waits, unverified, failed = _bring_up(pool, live, provider, spec, now)
    if failed is not None:
        return _fail(pool, "observed_state_mismatch", failed, retryable=True, now=now)
    ready = sum(1 for n in live if n.phase == NodePhase.READY)
    if waits:
        # Ready and NodesReady from the same nodes, those that count (the cluster's NodesReady
        # is derived from the pool's: a stale "1 of 1 nodes ready" of before a scale-up would
        # say the cluster's nodes are ready)
        state = readiness.readiness(pool, counted)
        save_conditions(
            pool,
            now,
            ("Ready", False, "NodesProvisioning", state.summary),
            readiness.nodes_ready(state),
            _verified(unverified),
        )
        progress_operation(pool.id, stage="nodes", done=ready, total=pool.node_count, now=now)
        return min(waits)
    if pool.phase == Phase.DEGRADED and any(n.applied_config == UNKNOWN_CONFIG for n in live):
        return None  # a node's GPUs are in an unknown state: an operator must repair it
    moving = host_moves.step_moves(pool, live, hosts, provider, spec, now)
    if moving is STOP:
        return None
    if moving is not None:
        return moving
    if short:
        return host_moves.SHORT_RETRY_S
    live = counted
    if not grow_short:
        host_moves.clear_short(pool, now)
    # the pool's ready count and NodesReady are read from its nodes now, at every step
    state = readiness.write_readiness(pool, live, now)
    drift.check_drift(pool, live, now)  # READY nodes whose host stopped agreeing: said
    repairing = step_repair(pool, live, provider, spec, now)
    if repairing is not None:
        return repairing
    rolling = _step_rollout(pool, live, provider, spec, now)
    if rolling is STOP:
        return None
    if rolling is not None:
        return rolling
    if pool.rollout:
        _finish_rollout(pool, now)
    upgrading = step_upgrade(pool, live, provider, spec, now)
    if upgrading is STOP:
        return None
    if upgrading is not None:
        return upgrading
    if grow_short:
        return _serve_short(pool, state, now)
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


def _serve_short(pool: NodePool, state: readiness.Readiness, now: datetime) -> float:
    """A pool that waits for capacity to grow serves the nodes it has: RUNNING (DEGRADED
    while one of them is out of service), its spec not yet observed; the missing nodes are
    tried again in ``host_moves.SHORT_RETRY_S`` seconds. ``Ready`` is True (reason
    ``CapacityShort``) and says why beside ``NodesReady`` False, from the same counts:
    ``serving: 3 of 4 nodes ready; 1 node(s) not placed; waiting for capacity (condition
    CapacityShort)`` (a fresh-user trial read the two conditions' one message as True and
    False, issue 33)."""
    phase = Phase.DEGRADED if state.degraded else Phase.RUNNING
    if not state.degraded:  # a degraded pool's Ready names its nodes (write_readiness)
        serving = f"serving: {state.message}; waiting for capacity (condition CapacityShort)"
        save_conditions(pool, now, ("Ready", True, "CapacityShort", serving[:1000]))
    if pool.phase != phase:
        pool.phase = phase
        pool.save(update_fields=["phase", "updated_at"])
    return host_moves.SHORT_RETRY_S


def _finish_size_operations(pool: NodePool, now: datetime) -> None:
    """The pool has the nodes its spec asks for: its create / resize operation is DONE."""
    finish_operation(
        pool.id,
        types=(OperationType.CREATE_NODE_POOL, OperationType.SET_NODE_POOL_SIZE),
        now=now,
    )
