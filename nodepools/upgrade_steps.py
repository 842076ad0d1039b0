"""The reconcile step of a node upgrade (see :mod:`nodepools.upgrades` for the rules).

:func:`step_upgrade` is called by the node pool reconciler once the pool's nodes exist and no
isolation change runs. It returns None when no upgrade is pending (or it just finished), a
delay in seconds to come back, or ``STOP`` when the rollout is paused.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from clusters.choices import OperationType
from clusters.maintenance import next_window_start, waiting_message
from clusters.models import finish_operation, progress_operation
from clusters.providers import ProviderError
from clusters.providers.base import NodePoolSpec, Provider
from nvke.conditions import save_conditions, set_condition

from . import disruption, host_drivers, observed_gates
from .choices import Disruption, DisruptionStep, NodePhase
from .models import Node, NodePool
from .specs import node_spec
from .step_result import STOP

DRAIN_POLL_S = 2.0


def _target(pool: NodePool) -> tuple[str, str]:
    return (pool.kubernetes_version, pool.driver_version)


def _current(node: Node) -> tuple[str, str]:
    return (node.kubernetes_version, node.driver_version)


def upgrade_surge(pool: NodePool, live: list[Node]) -> int:
    """Extra nodes to keep during a rolling upgrade (``max_surge`` while old nodes remain)."""
    if pool.upgrade.get("state") != "rolling":
        return 0  # paused or cancelled: no surge
    if not any(_current(n) != _target(pool) for n in live):
        return 0
    return int(pool.upgrade.get("max_surge") or 0)


def step_upgrade(
    pool: NodePool, live: list[Node], provider: Provider, spec: NodePoolSpec, now: datetime
) -> float | None:
    if not pool.upgrade:
        return None
    target = _target(pool)
    # a node another disruption holds (a repair, a move: Node's overlap rule) is taken once
    # it is back in service with no disruption; the rollout waits for it
    pending = [n for n in live if _current(n) != target and not n.disruption]
    busy = [n for n in live if n.disruption == Disruption.UPGRADE]
    held_elsewhere = [n for n in live if _current(n) != target and n.disruption and n not in busy]
    total = len([n for n in live if _current(n) != target]) + int(pool.upgrade.get("done", 0))
    if not pending and not busy and not held_elsewhere:
        return _finish(pool, now)
    if pool.upgrade.get("state") == "failed":
        if not busy:
            return _finish_failed(pool, live, target, now)
        held_elsewhere = []
        pending = []  # finish the node rolling back, start none
    elif pool.upgrade.get("state") == "cancelled":
        if not busy:  # nodes already upgraded stay upgraded; the rest keep their versions
            if not any(_current(n) == target for n in live):  # none upgraded: old spec back
                pool.kubernetes_version = pool.upgrade.get("from_kubernetes_version", "")
                pool.driver_version = pool.upgrade.get("from_driver_version", "")
            pool.upgrade = {}
            pool.conditions = set_condition(
                pool.conditions, "Upgrading", False, "Cancelled", "", now
            )
            pool.save(
                update_fields=[
                    "kubernetes_version",
                    "driver_version",
                    "upgrade",
                    "conditions",
                    "updated_at",
                ]
            )
            return None
        pending = held_elsewhere = []  # finish the nodes in flight, start none
    elif pool.upgrade.get("state") == "paused":
        return STOP
    # the policy is evaluated once per step: next_window_start answers "now" inside a window
    opens = (
        next_window_start(pool.cluster.maintenance_policy, now)
        if not busy and not pool.upgrade.get("urgent")
        else now
    )
    if opens != now:
        message = waiting_message(pool.cluster.maintenance_policy, opens, now)
        save_conditions(pool, now, ("Upgrading", True, "WaitingForMaintenanceWindow", message))
        progress_operation(pool.id, stage=message, done=_done(pool), total=total, now=now)
        return min((opens - now).total_seconds(), 60.0) if opens else 60.0
    slots = max(int(pool.upgrade.get("max_unavailable") or 0), 1)
    backend = disruption.backend_for(provider, spec)
    for node in pending[: max(slots - len(busy), 0)]:
        try:  # cordoned (DRAINING, no new pods), its drain clock started
            disruption.cordon(node, backend, now, why=Disruption.UPGRADE)
        except ProviderError as exc:
            return _pause(pool, node, f"the infrastructure provider failed: {exc}", [], now)
        busy.append(node)
    if not busy:  # only nodes another disruption holds are left: look again shortly
        return DRAIN_POLL_S
    waits: list[float] = []
    held: list[str] = []  # "node: waiting for checkpoint (deadline …)": what holds a drain
    for node in busy:
        try:
            result = _step_node(pool, node, provider, spec, target, now, held)
        except ProviderError as exc:
            return _pause(pool, node, f"the infrastructure provider failed: {exc}", [], now)
        if result is STOP:
            return STOP
        if result is not None:
            waits.append(result)
    progress_operation(
        pool.id,
        stage="; ".join([f"upgrading {', '.join(sorted(n.name for n in busy))}", *held]),
        done=_done(pool),
        total=total,
        now=now,
    )
    waiting = [*held, *(n.observed_problem for n in busy if n.observed_problem)]
    message = "; ".join([f"{_done(pool)} of {total} nodes", *waiting])
    save_conditions(pool, now, ("Upgrading", True, "RollingUpgrade", message))
    return min(waits) if waits else 0.0


def _step_node(
    pool: NodePool,
    node: Node,
    provider: Provider,
    spec: NodePoolSpec,
    target: tuple[str, str],
    now: datetime,
    held: list[str],
) -> float | None:
    """One transition of ``node``'s upgrade; what holds its drain (a gate's reason, or the
    pods waited for until the drain timeout) is added to ``held`` (``"node: reason"``)."""
    if node.disruption_step == DisruptionStep.DRAIN_BLOCKED:
        return STOP
    if node.disruption_step == DisruptionStep.DRAINING:
        policy = disruption.policy_for(
            "upgrade",
            timeout_s=int(pool.upgrade.get("drain_timeout_s", 600)),
            force=bool(pool.upgrade.get("force") or pool.upgrade.get("force_node") == node.name),
        )
        result = disruption.drain(node, policy, disruption.backend_for(provider, spec), now)
        if result.outcome in (disruption.BLOCKED, disruption.FAILED):
            return _pause(pool, node, "drain blocked", result.blockers, now)
        if result.outcome == disruption.WAITING:
            held.extend(result.held(node.name))  # a gate's reasons, or the pods waited for
            return DRAIN_POLL_S
        # another pool's node may have been placed on the host since the upgrade was accepted:
        # the install would change its driver undrained (nodepools.host_drivers)
        conflicts = host_drivers.driver_conflicts(pool, target[1], [node])
        if conflicts:
            return _pause(pool, node, host_drivers.conflict_words(target[1], conflicts), [], now)
        observed_gates.start_wait(node, now)  # verification needs a report after the install
        provider.upgrade_node(
            spec, node_spec(node), kubernetes_version=target[0], driver_version=target[1]
        )
        # from now: the verification clock
        disruption.advance(node, DisruptionStep.VERIFYING, clock=now)
        return 0.0
    rolling_back = node.disruption_step == DisruptionStep.ROLLING_BACK
    wanted = _previous(pool) if rolling_back else target
    what = "after rolling its upgrade back" if rolling_back else "after the upgrade"
    # the driver and NVML are the host agent's to report; the kubelet the provider's
    verdict, problem = observed_gates.gate(
        pool, node, observed_gates.expectation(pool, driver=wanted[1]), what=what, now=now
    )
    kubelet = provider.node_versions(spec, node_spec(node)).kubernetes_version
    if verdict == observed_gates.OK and wanted[0] and kubelet != wanted[0]:
        verdict = observed_gates.WAITING
        problem = f"node {node.name} {what}: kubelet expected {wanted[0]}, reported {kubelet}"
        if now - (node.drain_started_at or now) >= timedelta(seconds=observed_gates.timeout_s()):
            verdict = observed_gates.FAILED
    if verdict == observed_gates.OK and rolling_back:
        return _rolled_back(pool, node, wanted, now)
    if verdict == observed_gates.OK:
        node.kubernetes_version, node.driver_version = target
        disruption.end(  # uncordoned
            node, phase=NodePhase.READY, save=["kubernetes_version", "driver_version"]
        )
        pool.upgrade = {**pool.upgrade, "done": _done(pool) + 1}
        pool.save(update_fields=["upgrade", "updated_at"])
        return None
    if verdict == observed_gates.FAILED and rolling_back:
        return _rollback_failed(pool, node, problem, now)
    if verdict == observed_gates.FAILED:
        return _roll_back(pool, node, provider, spec, problem, now)
    return DRAIN_POLL_S  # the gate wrote ``observed_problem``: the condition names it


def _previous(pool: NodePool) -> tuple[str, str]:
    return (
        pool.upgrade.get("from_kubernetes_version", ""),
        pool.upgrade.get("from_driver_version", ""),
    )


def _roll_back(
    pool: NodePool,
    node: Node,
    provider: Provider,
    spec: NodePoolSpec,
    problem: str,
    now: datetime,
) -> float:
    """The node did not take the upgrade before the deadline: the rollout stops (the
    operation will FAIL with ``upgrade_verification_failed``) and the node gets its previous
    versions back, verified the same way."""
    error = {"code": "upgrade_verification_failed", "message": problem, "retryable": False}
    pool.upgrade = {**pool.upgrade, "state": "failed", "error": error}
    pool.save(update_fields=["upgrade", "updated_at"])
    save_conditions(pool, now, ("UpgradeBlocked", True, "UpgradeVerificationFailed", problem))
    previous = _previous(pool)
    observed_gates.start_wait(node, now)
    provider.upgrade_node(
        spec, node_spec(node), kubernetes_version=previous[0], driver_version=previous[1]
    )
    disruption.advance(node, DisruptionStep.ROLLING_BACK, clock=now)
    progress_operation(
        pool.id, stage=f"rolling back {node.name}: {problem}", done=_done(pool),
        total=pool.node_count, now=now,
    )  # fmt: skip
    return 0.0


def _rolled_back(pool: NodePool, node: Node, previous: tuple[str, str], now: datetime) -> None:
    """The node runs its previous versions again (verified): back in service."""
    node.kubernetes_version, node.driver_version = previous
    disruption.end(node, phase=NodePhase.READY, save=["kubernetes_version", "driver_version"])
    return None


def _rollback_failed(pool: NodePool, node: Node, problem: str, now: datetime) -> float:
    """The previous versions do not come back either: the node stays out of service and is
    replaced on healthy GPUs (auto-repair); the rollout stays failed."""
    from .repair import request_repair

    disruption.end(node, phase=NodePhase.NOT_READY)
    request_repair(node.id, action="replace", reason=f"upgrade rollback failed: {problem}", at=now)
    return 0.0


def _pause(pool: NodePool, node: Node, why: str, pods: list[str], now: datetime) -> float:
    """Stop the rollout on ``node`` and raise the alert condition ``UpgradeBlocked``."""
    disruption.start(node, Disruption.UPGRADE, DisruptionStep.DRAIN_BLOCKED)
    detail = f": {', '.join(pods)}" if pods else ""
    message = f"node {node.name}: {why}{detail}; resume with force or after fixing it"
    pool.upgrade = {
        **pool.upgrade,
        "state": "paused",
        "blocked": {"node": node.name, "pods": pods, "reason": why},
    }
    pool.save(update_fields=["upgrade", "updated_at"])
    save_conditions(
        pool,
        now,
        ("UpgradeBlocked", True, "DrainBlocked" if pods else "UpgradeFailed", message),
        # the rollout's own condition says it is paused (not the wait it last reported)
        ("Upgrading", True, "Paused", f"{_done(pool)} of {pool.node_count} nodes; {message}"),
    )
    progress_operation(
        pool.id, stage=f"paused: {message}", done=_done(pool), total=pool.node_count, now=now
    )
    return STOP


def _finish(pool: NodePool, now: datetime) -> None:
    pool.upgrade = {}
    pool.conditions = set_condition(pool.conditions, "Upgrading", False, "Upgraded", "", now)
    pool.conditions = set_condition(pool.conditions, "UpgradeBlocked", False, "Upgraded", "", now)
    pool.save(update_fields=["upgrade", "conditions", "updated_at"])
    finish_operation(pool.id, types=(OperationType.UPGRADE_NODES,), now=now)
    return None


def _finish_failed(
    pool: NodePool, live: list[Node], target: tuple[str, str], now: datetime
) -> None:
    """A node failed verification and was rolled back: the operation FAILS naming it. Nodes
    already upgraded stay upgraded; with none upgraded the pool's spec versions go back."""
    error = pool.upgrade.get("error") or {"code": "upgrade_verification_failed"}
    if not any(_current(n) == target for n in live):
        pool.kubernetes_version, pool.driver_version = _previous(pool)
    pool.upgrade = {}
    message = error.get("message", "")
    pool.conditions = set_condition(
        pool.conditions, "Upgrading", False, "UpgradeVerificationFailed", message, now
    )
    pool.conditions = set_condition(
        pool.conditions, "UpgradeBlocked", False, "UpgradeVerificationFailed", message, now
    )
    fields = ["kubernetes_version", "driver_version", "upgrade", "conditions", "updated_at"]
    pool.save(update_fields=fields)
    finish_operation(pool.id, types=(OperationType.UPGRADE_NODES,), error=error, now=now)
    return None


def _done(pool: NodePool) -> int:
    return int(pool.upgrade.get("done", 0)) if pool.upgrade else 0
