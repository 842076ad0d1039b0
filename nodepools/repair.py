"""Auto-repair, in the spirit of Cluster API's MachineHealthCheck.

A node is repaired when one of its GPUs reports an Xid whose catalog action needs the GPU reset
or the machine restarted (``RESET_GPU``, ``RESTART_BM``, ``RESTART_VM``: the node is
*rebooted* in place), or one that needs hardware attention (``CHECK_MECHANICALS``,
``CONTACT_SUPPORT`` …: the node is *replaced* on healthy GPUs), and when its host stays
``NOT_READY`` for ``NVKE_NODE_REPAIR_TIMEOUT_S`` (replaced). A rebooted node returns to
service only when a report of its host's agent made after the reboot is clean (NVML
initialises, no pending row remap, no failed health check: :mod:`nodepools.observed_gates`);
otherwise, after ``NVKE_OBSERVED_STATE_TIMEOUT_S``, its unhealthy GPUs stay fenced with the
reason shown and the node is replaced on healthy GPUs. A verified reboot also lifts the host
cordon the fault placed when nothing else holds the host
(:func:`fleet.services.lift_repaired_cordon`); a replaced node's old host stays cordoned for
the hardware check. Repairs run as a REPAIR_NODES operation, one node at a time, and stop
while more than ``max_unhealthy`` (40 % of the pool, Cluster API's default style; at least 1)
of the pool's nodes are unhealthy — a fault storm is an operator's problem, not something to
repair the whole pool into (condition ``RepairsPaused``), and while the circuit breaker
(:mod:`fleet.breaker`) holds the pool's or its GPU model's automation (``RepairsPaused``,
reason ``CircuitBreakerOpen``) until an operator resumes it.

A replaced node is released first (its machine deleted, its healthy GPUs back to the fleet,
the unhealthy ones fenced) and keeps ``disruption`` ``repair`` at step ``replacing`` on its
DELETED row until
the pool has a READY node in its place; meanwhile the pool's condition ``RepairPending`` names
it. When no capacity is free for the replacement the pool does not fail: it runs short
(DEGRADED, ``CapacityShort`` and ``RepairPending`` saying what is missing and why), the
REPAIR_NODES operation stays RUNNING, and the placement is retried every
``host_moves.SHORT_RETRY_S`` seconds until capacity comes back; then the replacement is
placed, and once it is READY ``RepairPending`` turns False and the operation is DONE.

A pool ``ERROR`` for its current spec (a scale-up that found no capacity) is repaired the same
way (:func:`nodepools.reconcile._step_failed`) and stays ``ERROR``: a replaced node gets one
replacement (``Node.replaces``, :func:`placed_replacements`), never the nodes the failed change
asked for, and without capacity for it ``RepairPending`` says so and the placement is retried
every ``host_moves.SHORT_RETRY_S`` seconds (the pool does not run short: it is ERROR already).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from clusters.choices import OperationType
from clusters.models import Operation, active_operation, finish_operation, progress_operation
from clusters.operations import start_operation
from clusters.providers import ProviderError
from clusters.providers.base import NodePoolSpec, Provider
from nvke.conditions import get_condition, save_conditions

from . import disruption, observed_gates
from .choices import LIVE_NODE_PHASES, Disruption, DisruptionStep, NodePhase
from .models import Node, NodePool
from .signals import node_repaired

REBOOT_ACTIONS = frozenset({"RESET_GPU", "RESTART_BM", "RESTART_VM", "RESTART_APP"})
MAX_UNHEALTHY_FRACTION = 0.4
REBOOT_S = 5.0
#: how often a rebooted node waiting for a clean agent report is looked at again (s)
OBSERVED_POLL_S = 2.0


def repair_action_for(catalog_action: str) -> str | None:
    """``reboot`` / ``replace`` for an Xid's NVIDIA immediate action; None when no node repair
    is called for (``IGNORE``, ``RESTART_APP`` handled by the workload)."""
    if catalog_action in ("", "IGNORE", "RESTART_APP", "XID_154"):
        return None
    if catalog_action in REBOOT_ACTIONS or catalog_action.startswith("WORKFLOW_"):
        return "reboot"  # the catalog: treat WORKFLOW_* as at least RESET_GPU
    return "replace"


def repair_for_step(step: str) -> str | None:
    """``reboot`` / ``replace`` for a health rule's ladder step (:class:`fleet.choices.
    LadderStep`): a GPU reset is done by rebooting the node (providers reset a node's GPUs by
    rebooting it), a hardware ticket replaces the node (the host is cordoned by fleet);
    None for ``restart_workload`` (the workload's own business)."""
    return {
        "gpu_reset": "reboot",
        "node_reboot": "reboot",
        "replace": "replace",
        "hardware_ticket": "replace",
    }.get(step)


def max_unhealthy(pool: NodePool) -> int:
    return max(1, math.floor(pool.node_count * MAX_UNHEALTHY_FRACTION))


def step_repair(
    pool: NodePool, live: list[Node], provider: Provider, spec: NodePoolSpec, now: datetime
) -> float | None:
    """One repair step; None when nothing needs repair (or repairs are paused)."""
    timeout = timedelta(seconds=settings.NVKE_NODE_REPAIR_TIMEOUT_S)
    for node in live:
        if node.phase == NodePhase.NOT_READY and node.disruption != Disruption.REPAIR:
            since = node.repair_requested_at or now
            if now - since >= timeout:
                _request(node, "replace", "NOT_READY beyond the repair timeout", since)
    unhealthy = [n for n in live if n.disruption == Disruption.REPAIR]
    # here the pool has all its nodes, none provisioning: a replacement placed is READY
    settled = settle_replacements(pool, now)
    if settled and not unhealthy:
        finish_operation(pool.id, types=(OperationType.REPAIR_NODES,), now=now)
    if not unhealthy:
        # a pause whose node is gone (scaled away, repaired) no longer holds anything back:
        # a trial read RepairsPaused True naming a node the pool no longer had
        paused = get_condition(pool.conditions, "RepairsPaused")
        if paused and paused.get("status") == "True":
            save_conditions(pool, now, ("RepairsPaused", False, "NothingToRepair", ""))
        return None
    if len(unhealthy) > max_unhealthy(pool):
        message = (
            f"{len(unhealthy)} of {pool.node_count} nodes unhealthy, more than the "
            f"{max_unhealthy(pool)} that may be repaired at once: an operator must look"
        )
        save_conditions(pool, now, ("RepairsPaused", True, "TooManyUnhealthy", message))
        return None
    node = next(
        (n for n in unhealthy if n.disruption_step == DisruptionStep.REBOOTING), unhealthy[0]
    )
    if node.disruption_step == DisruptionStep.REQUESTED:
        allowed, why = _breaker_allows(pool, node, now)
        if not allowed:
            save_conditions(pool, now, ("RepairsPaused", True, "CircuitBreakerOpen", why))
            return None
    save_conditions(pool, now, ("RepairsPaused", False, "WithinLimit", ""))
    _ensure_operation(pool, len(unhealthy), now)
    if node.repair_action == "reboot" and node.disruption_step == DisruptionStep.REQUESTED:
        # the one path, as the emergency it is: no gate, nothing waited for
        backend = disruption.backend_for(provider, spec)
        disruption.drain(node, disruption.policy_for("repair"), backend, now)
        observed_gates.start_wait(node, now)  # back in service only on a report after the reboot
        try:
            provider.reboot_node(spec, _spec(node))
        except ProviderError as exc:
            if exc.retryable:
                return REBOOT_S
            node.repair_action = "replace"  # a provider that cannot reboot: replace it
            node.repair_reason = f"{node.repair_reason}; cannot reboot: {exc}"[:200]
            node.save(update_fields=["repair_action", "repair_reason"])
            return 0.0
        disruption.advance(node, DisruptionStep.REBOOTING, phase=NodePhase.REPAIRING)
        _progress(pool, f"rebooting {node.name}", len(unhealthy), now)
        return REBOOT_S
    if node.repair_action == "reboot":
        # mid-upgrade (the node's driver is not yet the pool's) a repair that replaced the
        # upgrade (Node's overlap rule) may reboot either driver: the upgrade verifies it when
        # it takes the node again; otherwise the pool's driver is expected
        mid_upgrade = bool(pool.upgrade) and node.driver_version != pool.driver_version
        verdict, problem = observed_gates.gate(
            pool,
            node,
            observed_gates.expectation(pool, driver="" if mid_upgrade else None, clean=True),
            what="after its repair reboot",
            now=now,
        )
        if verdict == observed_gates.WAITING:
            save_conditions(pool, now, ("NodesVerified", False, "ObservedStateMismatch", problem))
            _progress(pool, f"verifying {node.name}: {problem}", len(unhealthy), now)
            return OBSERVED_POLL_S
        if verdict == observed_gates.FAILED:
            return _fence_and_replace(pool, node, live, problem, now)
        from fleet.health import close_unhealthy
        from fleet.models import Gpu
        from fleet.services import lift_repaired_cordon

        closed = [
            gpu.uuid
            for gpu in Gpu.objects.filter(uuid__in=node.gpu_uuids, health="UNHEALTHY")
            if close_unhealthy(
                gpu, at=now, ended_by="auto-repair: rebooted, the agent's report is clean"
            )
        ]
        save_conditions(pool, now, ("NodesVerified", True, "AgentReportsAgree", ""))
        reason = node.repair_reason
        node.repair_action = node.repair_reason = ""
        node.repair_requested_at = None
        disruption.end(
            node,
            phase=NodePhase.READY,
            save=["repair_action", "repair_reason", "repair_requested_at"],
        )
        # the host cordon the fault placed is lifted when nothing else holds the host (also
        # on a step run again after the intervals were closed: then it names the node)
        if node.host_id is not None:
            lift_repaired_cordon(
                node.host_id, repaired=", ".join(closed) or f"node {node.name}", now=now
            )
        node_repaired.send_robust(sender=Node, node=node, action="reboot", reason=reason)
    else:  # replace: release the node; the reconciler places a new one on healthy GPUs
        _progress(pool, f"replacing {node.name}", len(unhealthy), now)
        reason = node.repair_reason
        _release_for_replacement(pool, node, now)
        node_repaired.send_robust(sender=Node, node=node, action="replace", reason=reason)
        return 0.0  # the operation is DONE once the replacement is READY
    if not [n for n in live if n.disruption == Disruption.REPAIR and n.pk != node.pk]:
        finish_operation(pool.id, types=(OperationType.REPAIR_NODES,), now=now)
    return 0.0


def _breaker_allows(pool: NodePool, node: Node, now: datetime) -> tuple[bool, str]:
    """The circuit breaker's word (:mod:`fleet.breaker`) on starting ``node``'s repair (which
    cordons it): asked once per repair request — a retried step does not count twice."""
    from fleet import breaker
    from fleet.breaker_models import CordonRecord

    target = f"node {node.name} ({node.pk})"
    since = node.repair_requested_at or now
    if CordonRecord.objects.filter(target=target, automatic=True, at__gte=since).exists():
        return True, ""
    return breaker.allow_automatic_cordon(
        target=target,
        gpu_model=pool.gpu_model_id,
        pool_id=pool.id,
        pool_size=pool.node_count,
        actor="system:auto-repair",
        now=max(now, since),
        pool_label=f"{pool.cluster.name}/{pool.name}",
    )


def _progress(pool: NodePool, stage: str, unhealthy: int, now: datetime) -> None:
    """The REPAIR_NODES operation's progress: ``total`` the nodes it has taken on (it grows
    when another node needs a repair meanwhile and never shrinks as nodes come back),
    ``done`` those repaired; ``unhealthy`` nodes still wait. Two reboots in turn read 0/2,
    1/2, then 2/2 (they ended 1/1: the total was the nodes still waiting)."""
    op = active_operation(pool.id)
    seen = (op.progress or {}) if op is not None and op.type == OperationType.REPAIR_NODES else {}
    total = max(seen.get("total", 0), seen.get("done", 0) + unhealthy)
    progress_operation(pool.id, stage=stage, done=total - unhealthy, total=total, now=now)


def _fence_and_replace(
    pool: NodePool, node: Node, live: list[Node], problem: str, now: datetime
) -> float:
    """The reboot did not repair the node: its unhealthy GPUs stay fenced (their interval
    stays open, the reason says why) and the node is replaced on healthy GPUs."""
    from fleet.models import Gpu

    reason = f"not repaired by a reboot: {problem}"[:300]
    Gpu.objects.filter(uuid__in=node.gpu_uuids, health="UNHEALTHY").update(health_reason=reason)
    save_conditions(pool, now, ("NodesVerified", False, "RepairNotVerified", problem))
    progress_operation(pool.id, stage=f"replacing {node.name}: {problem}", now=now)
    _release_for_replacement(pool, node, now)
    return 0.0  # the operation is DONE once the replacement is READY


def _release_for_replacement(pool: NodePool, node: Node, now: datetime) -> None:
    """Release ``node`` (DELETED, GPUs back to the fleet, ledger closed) and keep it
    ``replacing`` until a READY node takes its place (:func:`settle_replacements`)."""
    from .reconcile import release_nodes

    release_nodes(pool, [node], now, caller="repair")  # an emergency drain, as for a reboot
    disruption.advance(node, REPLACING)
    pending = pending_replacements(pool)
    save_conditions(
        pool, now, ("RepairPending", True, "ReplacementPending", _pending_text(pending))
    )


#: the repair step of a released node whose replacement is not READY yet
REPLACING = DisruptionStep.REPLACING
#: a released node waiting for its replacement (a queryset filter)
WAITING_FOR_REPLACEMENT = Q(disruption=Disruption.REPAIR, disruption_step=REPLACING)

#: auto-repair's resync clause (:func:`nodepools.reconcile.resync.nodepools_needing_reconcile`):
#: a NOT_READY node (replaced after its timeout), a live node marked for repair, or a released
#: one waiting for its replacement
RESYNC = (
    Q(nodes__phase=NodePhase.NOT_READY)
    | Q(nodes__phase__in=LIVE_NODE_PHASES, nodes__disruption=Disruption.REPAIR)
    | Q(nodes__disruption=Disruption.REPAIR, nodes__disruption_step=REPLACING)
)


def pending_replacements(pool: NodePool) -> list[Node]:
    """The pool's released nodes whose replacement is not READY yet, oldest first."""
    return list(
        pool.nodes.filter(WAITING_FOR_REPLACEMENT, phase=NodePhase.DELETED).order_by(
            "released_at", "name"
        )
    )


def _pending_text(pending: list[Node]) -> str:
    return "; ".join(f"replacing {n.name} ({n.repair_reason})" for n in pending)[:900]


def replacement_short(
    pool: NodePool, live: list[Node], pending: list[Node], reason: str, now: datetime
) -> float:
    """No capacity for the replacements of ``pending``: the pool runs short (DEGRADED,
    ``CapacityShort``, :func:`nodepools.host_moves.capacity_short`) instead of failing,
    ``RepairPending`` says what waits and why, and the REPAIR_NODES operation stays RUNNING;
    the reconciler retries every ``SHORT_RETRY_S``. Returns :data:`nodepools.step_result.SHORT`."""
    from . import host_moves

    short = host_moves.capacity_short(pool, live, reason, now, cause="auto-repair replaced nodes")
    replacement_waits(pool, pending, reason, now)
    return short


def replacement_waits(pool: NodePool, pending: list[Node], reason: str, now: datetime) -> float:
    """The replacements of ``pending`` cannot be placed (no capacity: ``reason``):
    ``RepairPending`` says what waits and why and the REPAIR_NODES operation stays RUNNING
    with that stage. Returns the retry delay, ``host_moves.SHORT_RETRY_S``."""
    from . import host_moves

    message = (
        f"{_pending_text(pending)}: no capacity for the replacement ({reason}); "
        f"retried every {host_moves.SHORT_RETRY_S:g} s"
    )
    save_conditions(pool, now, ("RepairPending", True, "InsufficientCapacity", message[:1000]))
    Operation.objects.filter(
        target_id=pool.id, type=OperationType.REPAIR_NODES, status__in=["PENDING", "RUNNING"]
    ).update(progress={"done": 0, "total": len(pending), "stage": message[:300]})
    return host_moves.SHORT_RETRY_S


def placed_replacements(pool: NodePool, live: list[Node]) -> tuple[list[Node], list[Node]]:
    """``(unplaced, placed)`` for a pool that does not grow to its ``node_count`` (ERROR for
    its current spec, where the missing count says nothing): the released nodes waiting for
    their replacement (:func:`pending_replacements`) that have none yet, and the nodes of
    ``live`` placed as replacements (``Node.replaces``) of those that have."""
    pending = pending_replacements(pool)
    ids = {n.pk for n in pending}
    placed = [n for n in live if n.replaces_id in ids]
    taken = {n.replaces_id for n in placed}
    return [n for n in pending if n.pk not in taken], placed


def settle_replacements(pool: NodePool, now: datetime) -> list[str]:
    """The pool has all its nodes READY again: its pending replacements are done
    (their ``repair`` disruption ended on their DELETED rows, ``RepairPending`` False). Returns the
    names of the nodes replaced."""
    pending = pending_replacements(pool)
    if not pending:
        return []
    names = [n.name for n in pending]
    disruption.end_all(Node.objects.filter(WAITING_FOR_REPLACEMENT, pk__in=[n.pk for n in pending]))
    message = f"replaced {', '.join(names)}: the new node(s) are READY"
    save_conditions(pool, now, ("RepairPending", False, "ReplacementReady", message[:1000]))
    return names


def _spec(node: Node):
    from .specs import node_spec

    return node_spec(node)


def _request(node: Node, action: str, reason: str, at: datetime) -> None:
    """Mark ``node`` for repair: the emergency replaces whatever disruption the node was in
    (an upgrade, an isolation change, a move, a scale-down), which starts again once the
    node is back in service (``Node``'s overlap rule)."""
    node.repair_action = action
    node.repair_reason = reason[:200]
    node.repair_requested_at = at
    disruption.start(
        node,
        Disruption.REPAIR,
        DisruptionStep.REQUESTED,
        save=["repair_action", "repair_reason", "repair_requested_at"],
    )


def request_repair(node_id, *, action: str, reason: str, at: datetime) -> bool:
    """Mark a node for repair (idempotent: an earlier request stands). True when marked."""
    node = Node.objects.live().filter(pk=node_id).first()
    if node is None or node.disruption == Disruption.REPAIR:
        return False
    _request(node, action, reason, at)
    return True


def _ensure_operation(pool: NodePool, total: int, now: datetime) -> None:
    if not Operation.objects.filter(
        target_id=pool.id, type=OperationType.REPAIR_NODES, status__in=["PENDING", "RUNNING"]
    ).exists():
        # the reconcile step's instant: not created after it started; the step goes on
        start_operation(
            **pool.operation_target(),
            type=OperationType.REPAIR_NODES,
            requested_by="system:auto-repair",
            total=total,
            enqueue=False,
            started=True,
            now=now,
        )
