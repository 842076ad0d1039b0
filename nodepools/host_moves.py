"""Host drains, maintenance and retirement: the nodes of a draining host move off it.

``fleet`` marks a host as draining (``Host.drain_target`` CORDONED / MAINTENANCE / RETIRED,
``Host.drain_force``) and sends ``host_drain_requested``; the receiver gives each affected pool
a HOST_MAINTENANCE operation and wakes its reconciler. The reconciler then reads the host row
at every step (level-triggered: a lost signal only waits for the periodic resync, a killed
worker loses nothing) and moves each node on a draining host, one transition per call:

1. ``replacing``: the node no longer counts towards the pool's size, so the reconciler's
   ordinary scale-up places a replacement first — elsewhere, since a draining host is
   cordoned and placement never picks it. Without capacity the pool *runs short*: the node
   moves on anyway, the pool is DEGRADED with the condition ``CapacityShort`` (how many nodes
   of how many run, and why) and retries placing the missing node every
   :data:`SHORT_RETRY_S` seconds until capacity comes back.
2. ``draining`` (once no node of the pool is provisioning, i.e. the replacement is READY): the
   node is cordoned and drained by the rules of node upgrades
   (:func:`nodepools.disruption.drain`, pause policy): pods that block it are waited for up to
   ``NVKE_HOST_DRAIN_TIMEOUT_S``, then the move pauses on that node (``drain-blocked``,
   condition ``HostDrainBlocked`` naming the pods) until the operator drains the host again
   with ``force`` (which evicts them, ignoring their budgets — never the default).
3. ``moved``: the node is released (its machine deleted, its GPUs back to the host, its
   ledger rows closed by ``node_released``); the host enters its drain target once none of its
   GPUs is held (:func:`fleet.services.settle_host_state`).

Operation progress and the pool's ``HostMaintenance`` condition say what is done and what is
pending, counting nodes: ``moving nodes off gpu-07 (MAINTENANCE): 1 of 2 node(s) moved, 1
pending (n-abc draining)``. An uncordon cancels the drain: nodes not yet released stay and the
surplus replacement is scaled down (newest first).
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Q

from clusters.choices import ACTIVE_OPERATION_STATUSES, OperationStatus, OperationType
from clusters.models import Operation, finish_operation
from clusters.operations import start_operation
from clusters.providers.base import NodePoolSpec, Provider
from fleet.models import Host
from nvke.conditions import get_condition, set_condition

from . import disruption, readiness
from .choices import LIVE_NODE_PHASES, Disruption, DisruptionStep, NodePhase
from .models import Node, NodePool
from .step_result import SHORT, STOP

#: the steps of a move (``Node.disruption`` ``move``)
REPLACING, DRAINING = DisruptionStep.REPLACING, DisruptionStep.DRAINING
DRAIN_BLOCKED, MOVED = DisruptionStep.DRAIN_BLOCKED, DisruptionStep.MOVED
MOVING_STATES = (REPLACING, DRAINING, DRAIN_BLOCKED)
#: a node moving (a queryset filter on the pool's nodes)
MOVING = Q(disruption=Disruption.MOVE, disruption_step__in=MOVING_STATES)
#: how often a pool that runs short for lack of capacity tries to place its missing nodes (s)
SHORT_RETRY_S = 30.0
#: host moves' resync clause (:func:`nodepools.reconcile.resync.nodepools_needing_reconcile`):
#: a node moving, or a live node on a host being drained
RESYNC = Q(nodes__disruption=Disruption.MOVE, nodes__disruption_step__in=MOVING_STATES) | Q(
    nodes__phase__in=LIVE_NODE_PHASES, nodes__host__drain_target__gt=""
)
#: how often a blocked drain is looked at again (s)
DRAIN_POLL_S = 2.0


def draining_hosts(host_ids: set) -> dict:
    """``{host_id: {"hostname", "drain_target", "drain_force"}}`` of the draining ones."""
    return {
        row["id"]: row
        for row in Host.objects.filter(pk__in=host_ids)
        .exclude(drain_target="")
        .values("id", "hostname", "drain_target", "drain_force")
    }


def mark_moving(pool: NodePool, live: list[Node], now: datetime) -> dict:
    """Nodes on a draining host (or moved by a defragmentation run, :mod:`nodepools.defrag`)
    start moving (``replacing``); nodes whose host's drain was cancelled stop (back to READY).
    A move replaces a planned disruption (upgrade, isolation change, scale-down), never a
    repair (the node moves once repaired): ``Node``'s overlap rule.
    Returns :func:`draining_hosts` of the live nodes."""
    from .defrag import requested_moves

    hosts = draining_hosts({n.host_id for n in live if n.host_id})
    requested = requested_moves({n.id for n in live})  # a defragmentation run's island step
    changed = False
    for node in live:
        on_draining = node.host_id in hosts or node.id in requested
        moving = node.disruption == Disruption.MOVE
        if (
            on_draining
            and (not node.disruption or node.disruption in disruption.PLANNED)
            and node.phase != NodePhase.PROVISIONING
        ):
            disruption.start(node, Disruption.MOVE, REPLACING)
            changed = True
        elif not on_draining and moving and node.disruption_step in MOVING_STATES:
            # uncordoned where it was cordoned: the drain was cancelled
            disruption.end(
                node, phase=NodePhase.READY if node.phase == NodePhase.DRAINING else None
            )
    if changed:
        ensure_operation(pool, now, requested_by="system:host-drain")
        if pool.phase == "RUNNING":
            pool.phase = "RECONCILING"
            pool.save(update_fields=["phase", "updated_at"])
    return hosts


def ensure_operation(pool: NodePool, now: datetime, *, requested_by: str) -> Operation:
    """The pool's active HOST_MAINTENANCE operation (created when there is none)."""
    op = Operation.objects.filter(
        target_id=pool.id,
        type=OperationType.HOST_MAINTENANCE,
        status__in=ACTIVE_OPERATION_STATUSES,
    ).first()
    if op is None:
        pending = pool.nodes.filter(MOVING).count()
        op = start_operation(
            **pool.operation_target(),
            type=OperationType.HOST_MAINTENANCE,
            requested_by=requested_by,
            total=pending,
            enqueue=False,  # the caller wakes the reconciler (or is it)
            now=now,
        )
    return op


def request_moves(pool_id, *, hostname: str, now: datetime) -> bool:
    """Receiver's part (``host_drain_requested``): the pool's operation exists from the moment
    the operator asked, before its reconciler runs. False when the pool is gone."""
    with transaction.atomic():
        pool = NodePool.objects.filter(pk=pool_id).exclude(phase__in=["DELETED"]).first()
        if pool is None or pool.deletion_requested_at is not None:
            return False
        ensure_operation(pool, now, requested_by=f"system:host-drain {hostname}")
    return True


def capacity_short(
    pool: NodePool,
    live: list[Node],
    reason: str,
    now: datetime,
    *,
    cause: str = "nodes moved off drained hosts",
) -> float:
    """No room for the pool's missing nodes while a host drain moves (or moved) some, or an
    auto-repair replaced some (``cause`` says which, :func:`nodepools.repair.replacement_short`):
    the pool runs short (DEGRADED, ``CapacityShort``) instead of failing; moving nodes go on
    without a replacement (:func:`step_moves` drains them). ``live``: the nodes that count
    (not moving). Returns :data:`SHORT`."""
    counted = [n for n in live if n.disruption != Disruption.MOVE]
    # "missing", not "replacements": a scale-up of a short pool adds to what is missing (a
    # trial read "5 replacement(s) of nodes moved off drained hosts" for 2 moved + 3 new)
    message = (
        f"runs {len(counted)} of {pool.node_count} node(s): no capacity for "
        f"{pool.node_count - len(counted)} missing node(s) ({reason}); short since {cause}; "
        f"retried every {SHORT_RETRY_S:g} s"
    )
    conditions = set_condition(
        pool.conditions, "CapacityShort", True, "InsufficientCapacity", message, now
    )
    # Ready and NodesReady from the same counts as the phase (a trial read "3 of 3 nodes
    # ready" beside DEGRADED with none left): the nodes that count, the rest not placed
    state = readiness.readiness(pool, counted)
    conditions = set_condition(conditions, *readiness.nodes_ready(state), now)
    conditions = set_condition(conditions, "Ready", False, "CapacityShort", state.message, now)
    if (pool.phase, pool.conditions) != ("DEGRADED", conditions):  # a retry changes nothing
        pool.phase = "DEGRADED"
        pool.conditions = conditions
        pool.save(update_fields=["phase", "conditions", "updated_at"])
    return SHORT


def runs_short(pool: NodePool) -> bool:
    """True while the pool runs short after a host drain (``CapacityShort`` is True)."""
    cond = get_condition(pool.conditions, "CapacityShort")
    return bool(cond and cond.get("status") == "True")


def may_run_short(pool: NodePool, live: list[Node]) -> bool:
    """A scale-up without capacity makes the pool short (not ERROR) when a host drain is why
    it lacks nodes."""
    return runs_short(pool) or any(n.disruption == Disruption.MOVE for n in live)


def clear_short(pool: NodePool, now: datetime) -> None:
    """The pool has its nodes again: ``CapacityShort`` False, and a finished move's
    ``HostMaintenance`` no longer says the pool runs short (a trial read it on a RUNNING
    pool)."""
    if runs_short(pool):
        pool.conditions = set_condition(
            pool.conditions,
            "CapacityShort",
            False,
            "CapacityRestored",
            # no count: the condition outlives the size (a trial read "runs 3 of 3 node(s)"
            # on a pool scaled to 0 since, beside NodesReady's "0 of 0")
            "no node missing: the pool has the nodes its size asks for",
            now,
        )
        moved = get_condition(pool.conditions, "HostMaintenance")
        if moved and moved.get("status") == "False" and moved["message"].endswith(SHORT_NOTE):
            pool.conditions = set_condition(
                pool.conditions,
                "HostMaintenance",
                False,
                "NodesMoved",
                moved["message"].removesuffix(SHORT_NOTE) + "; replaced once capacity returned",
                now,
            )
        pool.save(update_fields=["conditions", "updated_at"])


def step_moves(
    pool: NodePool,
    live: list[Node],
    hosts: dict,
    provider: Provider,
    spec: NodePoolSpec,
    now: datetime,
) -> float | None:
    """Drain and release the moving nodes (called once no node of the pool provisions).

    Returns None when no node moves (the pool's HOST_MAINTENANCE operation is then DONE),
    a delay to come back, or ``STOP`` while every moving node is blocked.
    """
    from .defrag import run_moves
    from .reconcile import release_nodes

    moving = [
        n for n in live if n.disruption == Disruption.MOVE and n.disruption_step in MOVING_STATES
    ]
    if not moving:
        finish(pool, now)
        return None
    by_runs = run_moves({n.id for n in moving})  # a run's move, even on a host it drained
    released: list[Node] = []
    blocked: list[str] = []
    held: list[str] = []  # what holds a drain: a gate (the tenant's checkpoint), or pods
    waiting = False
    for node in moving:
        host = hosts.get(node.host_id) or {}
        forced = bool(host.get("drain_force"))
        if node.disruption_step == DRAIN_BLOCKED and not forced:
            blocked.append(_blocked_text(node, provider, spec))
            continue
        backend = disruption.backend_for(provider, spec)
        if node.disruption_step == REPLACING:  # its replacement is READY: cordon and drain it
            disruption.cordon(node, backend, now, why=Disruption.MOVE, step=DRAINING)
        caller = "defrag-move" if node.id in by_runs else "host-maintenance"
        policy = disruption.policy_for(caller, force=forced)
        result = disruption.drain(node, policy, backend, now)
        if result.drained:
            released.append(node)
        elif result.outcome in (disruption.BLOCKED, disruption.FAILED):
            disruption.advance(node, DRAIN_BLOCKED)
            blocked.append(f"{node.name}: {', '.join(result.blockers)}")
        else:
            waiting = True
            held.extend(result.held(node.name))  # a gate's reasons, or the pods waited for
    if released:
        for node in released:
            disruption.advance(node, MOVED)
        release_nodes(pool, released, now)
    _report(pool, hosts, blocked, now, held)
    if released:
        return 0.0
    if waiting:
        return DRAIN_POLL_S
    return STOP  # every moving node is blocked: wait for a forced drain (or the resync)


def _blocked_text(node: Node, provider: Provider, spec: NodePoolSpec) -> str:
    from .specs import node_spec

    pods = provider.drain_blockers(spec, node_spec(node))
    return f"{node.name}: {', '.join(pods) or 'blocked'}"


def _counts(pool: NodePool, op: Operation | None) -> tuple[int, list[Node]]:
    done = pool.nodes.filter(disruption=Disruption.MOVE, disruption_step=MOVED)
    if op is not None:
        done = done.filter(released_at__gte=op.created_at)
    pending = list(pool.nodes.filter(MOVING).order_by("name"))
    return done.count(), pending


def _active_op(pool: NodePool) -> Operation | None:
    return Operation.objects.filter(
        target_id=pool.id,
        type=OperationType.HOST_MAINTENANCE,
        status__in=ACTIVE_OPERATION_STATUSES,
    ).first()


def _report(
    pool: NodePool, hosts: dict, blocked: list[str], now: datetime, held: list[str]
) -> None:
    """Operation progress and the pool's conditions, in nodes moved and pending (and what
    ``held`` a drain: ``"node: waiting for checkpoint (deadline …)"``, or the pods waited for
    until the drain timeout)."""
    op = _active_op(pool)
    done, pending = _counts(pool, op)
    names = sorted({h["hostname"] for h in hosts.values()})
    targets = sorted({h["drain_target"] for h in hosts.values()})
    what = f"moving nodes off {', '.join(names) or 'drained hosts'} ({', '.join(targets)})"
    detail = ", ".join(f"{n.name} {n.disruption_step}" for n in pending)
    stage = (
        f"{what}: {done} of {done + len(pending)} node(s) moved, {len(pending) or 'none'} pending"
        + (f" ({detail})" if detail else "")
        + "".join(f"; {h}" for h in held)
    )
    if op is not None:
        progress = {"done": done, "total": done + len(pending), "stage": stage[:300]}
        Operation.objects.filter(pk=op.pk, status__in=ACTIVE_OPERATION_STATUSES).update(
            status=OperationStatus.RUNNING, started_at=op.started_at or now, progress=progress
        )
    conditions = set_condition(pool.conditions, "HostMaintenance", True, "MovingNodes", stage, now)
    if blocked:
        message = (
            f"{'; '.join(blocked)}; the operator drains the host again with force to evict them"
        )
        conditions = set_condition(conditions, "HostDrainBlocked", True, "DrainBlocked", message)
    else:
        conditions = set_condition(conditions, "HostDrainBlocked", False, "NotBlocked", "", now)
    if conditions != pool.conditions:
        pool.conditions = conditions
        pool.save(update_fields=["conditions", "updated_at"])


#: how a finished host move says the pool was left short (cleared once it is not)
SHORT_NOTE = "; the pool runs short: no capacity for a replacement (condition CapacityShort)"


def finish(pool: NodePool, now: datetime) -> None:
    """No node moves any more: the HOST_MAINTENANCE operation is DONE, saying how it ended."""
    op = _active_op(pool)
    if op is None:
        return
    done, _ = _counts(pool, op)
    short = runs_short(pool)
    stage = f"{done} of {done} node(s) moved off drained hosts, none pending" + (
        SHORT_NOTE if short else ""
    )
    finish_operation(pool.id, types=(OperationType.HOST_MAINTENANCE,), stage=stage[:300], now=now)
    pool.conditions = set_condition(
        pool.conditions, "HostMaintenance", False, "NodesMoved", stage, now
    )
    pool.conditions = set_condition(
        pool.conditions, "HostDrainBlocked", False, "NotBlocked", "", now
    )
    pool.save(update_fields=["conditions", "updated_at"])
