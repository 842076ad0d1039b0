"""Node upgrades (UPGRADE_NODES): the Kubernetes version of a pool's nodes and/or their NVIDIA
driver, rolled out node by node.

Per node: cordon and drain (every pod holding a GPU is evicted; a pod that cannot be evicted —
a PodDisruptionBudget at its minimum, a pod without a controller — blocks the drain), upgrade
in place, verify that the node reports the target versions and that NVML initialises, then
uncordon. ``max_unavailable`` nodes are upgraded at once (at least 1); ``max_surge`` extra nodes
at the target versions are added first, so capacity does not drop, and removed (drained) at the
end. A drain still blocked after ``drain_timeout_s`` pauses the rollout: the node is marked
``drain-blocked`` with the blocking pods named, the pool gets the alert condition
``UpgradeBlocked``, and nothing continues to the next node until a
``resume`` (``force`` evicts the blockers, ignoring their budgets — never the default).
Non-urgent upgrades start nodes only inside the cluster's maintenance window.

Version rules: nodes never newer than the control plane and at most 3 minors older
(:mod:`clusters.versions`); the driver is checked against the GPU, its CUDA version and its MIG
profiles (:func:`nodepools.isolation.validate_driver`). The driver is the host's, one for
all its nodes: an upgrade whose driver would change under a node of another pool sharing a
host with this pool's nodes is refused (:mod:`nodepools.host_drivers`).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from clusters import versions
from clusters.choices import OperationType, Phase
from clusters.models import Cluster, Operation
from clusters.operations import Audit, start_operation
from clusters.services import ensure_no_active_operation
from nvke.errors import Conflict, InvalidInput
from tenants import audit
from tenants.principal import Principal

from . import disruption
from .choices import Disruption, DisruptionStep
from .host_drivers import refuse_driver_conflicts
from .isolation import validate_driver
from .models import NodePool
from .services import enqueue_reconcile


def upgrade_nodepool(
    *,
    principal: Principal,
    pool: NodePool,
    kubernetes_version: str | None = None,
    driver_version: str | None = None,
    max_surge: int = 0,
    max_unavailable: int = 1,
    drain_timeout_s: int = 600,
    force: bool = False,
    urgent: bool = False,
) -> Operation:
    """Start a rolling upgrade; returns the UPGRADE_NODES operation.

    Raises InvalidInput (``nothing_to_upgrade``, ``unsupported_kubernetes_version``,
    ``version_skew``, driver codes) or Conflict (``nodepool_not_running``,
    ``operation_in_progress``, ``host_driver_shared``: the driver would change under another
    pool's node on one of the pool's hosts).
    """
    with transaction.atomic():
        pool = (
            NodePool.objects.select_for_update(of=("self",))
            .select_related("gpu_model")
            .get(pk=pool.pk)
        )
        cluster = Cluster.objects.select_for_update(no_key=True).get(pk=pool.cluster_id)
        ensure_no_active_operation(cluster)
        if pool.phase != Phase.RUNNING or pool.deletion_requested_at is not None:
            raise Conflict(
                f"the node pool is {pool.phase}; it can be upgraded when it is RUNNING",
                code="nodepool_not_running",
            )
        current_k8s = pool.kubernetes_version or cluster.control_plane_version
        # a bare minor of the control plane's is its patch, the kubelet's version (issue 33)
        target_k8s = (
            versions.complete(kubernetes_version, cluster.control_plane_version)
            if kubernetes_version
            else current_k8s
        )
        target_driver = pool.driver_version if driver_version is None else driver_version
        lagging = pool.nodes.live().exclude(
            kubernetes_version=target_k8s, driver_version=target_driver
        )
        if (
            target_k8s == current_k8s
            and target_driver == pool.driver_version
            and not lagging.exists()
        ):
            raise InvalidInput(
                "the pool already runs these versions",
                code="nothing_to_upgrade",
                field="kubernetes_version",
            )
        if kubernetes_version:
            _check_kubernetes(cluster, kubernetes_version)
        if driver_version is not None:
            validate_driver(
                pool.gpu_model,
                driver_version=driver_version or None,
                cuda_version=pool.cuda_version or None,
                policy=pool.isolation,
            )
        # every node's host is given target_driver (a kubelet-only upgrade reinstalls the pin)
        refuse_driver_conflicts(pool, target_driver)
        before = {"kubernetes_version": current_k8s, "driver_version": pool.driver_version}
        pool.kubernetes_version = target_k8s
        pool.driver_version = target_driver
        pool.generation += 1
        pool.phase = Phase.RECONCILING
        op = start_operation(
            **pool.operation_target(),
            type=OperationType.UPGRADE_NODES,
            requested_by=principal.label,
            total=pool.node_count,
            audit_event=Audit(
                "nodepool.upgrade",
                before=before,
                after={
                    "kubernetes_version": target_k8s,
                    "driver_version": target_driver,
                    "max_surge": max_surge,
                    "max_unavailable": max(max_unavailable, 0),
                    "force": force,
                    "urgent": urgent,
                },
            ),
        )
        pool.upgrade = {
            "operation": str(op.id),
            "max_surge": max_surge,
            "max_unavailable": max(max_unavailable, 0),
            "drain_timeout_s": drain_timeout_s,
            "force": force,
            "urgent": urgent,
            "state": "rolling",
            "done": 0,
            "from_kubernetes_version": before["kubernetes_version"],
            "from_driver_version": before["driver_version"],
        }
        pool.save(
            update_fields=[
                "kubernetes_version",
                "driver_version",
                "generation",
                "phase",
                "upgrade",
                "updated_at",
            ]
        )
    return op


def resume_upgrade(*, principal: Principal, pool: NodePool, force: bool = False) -> NodePool:
    """Resume a paused rollout (after the blocking pods were dealt with, or ``force``)."""
    with transaction.atomic():
        pool = NodePool.objects.select_for_update().get(pk=pool.pk)
        if pool.upgrade.get("state") != "paused":
            raise Conflict("no paused upgrade on this node pool", code="upgrade_not_paused")
        upgrade: dict[str, Any] = dict(pool.upgrade)
        blocked_node = (upgrade.get("blocked") or {}).get("node", "")
        # force evicts the blockers of the paused node only: later nodes' budgets still count
        upgrade.update(state="rolling", force_node=blocked_node if force else "", blocked={})
        pool.upgrade = upgrade
        pool.save(update_fields=["upgrade", "updated_at"])
        disruption.advance_all(
            pool.nodes.filter(
                disruption=Disruption.UPGRADE, disruption_step=DisruptionStep.DRAIN_BLOCKED
            ),
            DisruptionStep.DRAINING,
            clock=timezone.now(),
        )
        from nvke.conditions import set_condition

        pool.conditions = set_condition(
            pool.conditions, "UpgradeBlocked", False, "Resumed", f"resumed by {principal.label}"
        )
        pool.save(update_fields=["conditions", "updated_at"])
        audit.record(
            actor=principal.label,
            action="nodepool.upgrade.resume",
            target_type="nodepool",
            target_id=pool.id,
            tenant_id=pool.tenant_id,
            after={"force": bool(force), "node": upgrade.get("force_node", "")},
        )
        enqueue_reconcile(pool.id)
    return pool


def _check_kubernetes(cluster: Cluster, target: str) -> None:
    versions.require_supported(target, cluster.provider)
    problem = versions.node_version_problem(
        cluster.control_plane_version or cluster.kubernetes_version, target
    )
    if problem:
        raise InvalidInput(problem, code="version_skew", field="kubernetes_version")
