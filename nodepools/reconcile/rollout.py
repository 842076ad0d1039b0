"""An isolation change (UPDATE_ISOLATION), one node at a time: drain, reconfigure, validate;
rollback when a node fails.
"""

from __future__ import annotations

import logging
from datetime import datetime

from clusters.choices import OperationType, Phase
from clusters.models import finish_operation, progress_operation
from clusters.providers import ProviderError
from clusters.providers.base import NodePoolSpec, Provider
from nvke.conditions import save_conditions, set_condition

from .. import disruption, observed_gates
from ..choices import Disruption, DisruptionStep, NodePhase
from ..gpu_config import config_hash
from ..models import Node, NodePool
from ..specs import node_spec
from ..step_result import STOP
from .fail import _reason
from .nodes_up import OBSERVED_POLL_S, _verified, observed_layout, validate_layout

log = logging.getLogger(__name__)

#: ``Node.applied_config`` of a node whose reconfiguration failed: matches no config
UNKNOWN_CONFIG = "unknown"


def _step_rollout(
    pool: NodePool, live: list[Node], provider: Provider, spec: NodePoolSpec, now: datetime
) -> float | None:
    """One step of an isolation change; None when every node runs the pool's config."""
    desired = config_hash(pool.gpu_config)
    changing = [n for n in live if n.applied_config not in ("", desired)]
    node = next((n for n in live if n.disruption == Disruption.ISOLATION_CHANGE), None) or next(
        (n for n in changing if n.phase == NodePhase.READY and not n.disruption), None
    )
    if node is None:
        # a node another disruption holds (a repair: Node's overlap rule) is taken once it is
        # back in service; the change waits for it
        if any(n.disruption for n in changing):
            return HELD_ELSEWHERE_S
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
        untouched = node.disruption != Disruption.ISOLATION_CHANGE
        if untouched and not _done(pool) and pool.rollout.get("state") == "rolling":
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
#: how often a change waiting for a node another disruption holds looks again (s)
HELD_ELSEWHERE_S = 2.0


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
    if node.disruption != Disruption.ISOLATION_CHANGE:  # 1. cordon
        disruption.cordon(node, backend, now, why=Disruption.ISOLATION_CHANGE)
        _progress(pool, f"{stage_prefix}: draining {node.name}", total, now)
        return 0.0
    if node.disruption_step == DisruptionStep.DRAINING:  # 2. drain, then reconfigure
        policy = disruption.policy_for("isolation-change")
        result = disruption.drain(node, policy, backend, now)
        if not result.drained:
            held = "; ".join(result.blockers)
            if result.gated:  # the tenant's checkpoint (nodepools/checkpoints.py)
                _progress(pool, f"{stage_prefix}: {node.name}: {held}", total, now)
            else:  # the operation names the pods it waits for
                _progress(pool, f"{stage_prefix}: draining {node.name}: {held}", total, now)
            return 1.0  # pods that block it are waited for (no timeout: nothing is evicted)
        observed_gates.start_wait(node, now)  # validation needs a report after the change
        provider.apply_node_config(spec, node_spec(node))
        disruption.advance(node, DisruptionStep.VALIDATING, phase=NodePhase.CORDONED)
        _progress(pool, f"{stage_prefix}: repartitioning {node.name}", total, now)
        return 0.0
    report = provider.node_config_status(spec, node_spec(node), now)  # 3. validate
    if report.state == "pending":
        return report.retry_after_s
    if report.state != "success":
        return _node_config_failed(pool, node, report.message, now)
    # what the GPUs run is the host agent's to say (a wedged MIG Manager still says success)
    verdict, problem = observed_gates.gate(
        pool, node, observed_gates.expectation(pool), what="after the isolation change", now=now
    )
    if verdict == observed_gates.WAITING:
        save_conditions(pool, now, _verified([problem]))
        return OBSERVED_POLL_S
    if verdict == observed_gates.FAILED:
        return _node_config_failed(pool, node, problem.split(": ", 1)[-1], now)
    layout = observed_layout(node, list(report.gpu_layout))
    problem = validate_layout(pool, node, layout)
    if problem is not None:
        return _node_config_failed(pool, node, problem, now)
    save_conditions(pool, now, _verified([]))
    node.applied_config = desired
    node.gpu_layout = layout
    disruption.end(node, phase=NodePhase.READY, save=["applied_config", "gpu_layout"])
    pool.rollout["done"] = _done(pool) + 1
    pool.save(update_fields=["rollout", "updated_at"])
    _progress(pool, f"{stage_prefix}: {node.name} validated", total, now)
    return 0.0


def _done(pool: NodePool) -> int:
    return int(pool.rollout.get("done", 0)) if pool.rollout else 0


def _progress(pool: NodePool, stage: str, total: int, now: datetime) -> None:
    progress_operation(pool.id, stage=stage, done=_done(pool), total=max(total, 1), now=now)


def _node_config_failed(pool: NodePool, node: Node, problem: str, now: datetime) -> float:
    message = f"node {node.name} failed validation: {problem}"
    if pool.rollout.get("state") == "rolling-back" or not pool.rollout:
        # the previous config does not come back either: stop, keep the node out of service
        node.applied_config = UNKNOWN_CONFIG
        disruption.end(node, phase=NodePhase.NOT_READY, save=["applied_config"])
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
    disruption.start(
        node, Disruption.ISOLATION_CHANGE, DisruptionStep.DRAINING, save=["applied_config"]
    )
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
