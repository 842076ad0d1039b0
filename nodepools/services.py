"""Node pool use-cases: validate against the catalog and fleet, write the spec, create the
Operation, enqueue the reconciler on commit."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from catalog.services import UnknownGpuModel, get_gpu_model
from clusters.choices import GONE_PHASES, OperationType, Phase, TargetType
from clusters.models import Cluster, Operation, active_operation, cancel_operations
from fleet.placement import max_host_gpus
from nvke.errors import Conflict, InvalidInput
from tenants import audit, quotas
from tenants.principal import Principal

from .gpu_config import render_gpu_config
from .isolation import validate_isolation
from .models import NodePool

MAX_NODES_PER_POOL = 1000


def pool_spec_of(pool: NodePool) -> dict:
    """The spec fields of a node pool, for audit diffs."""
    return {
        "name": pool.name,
        "gpu_model": pool.gpu_model_id,
        "gpus_per_node": pool.gpus_per_node,
        "node_count": pool.node_count,
        "isolation": pool.isolation,
    }


def release_pool_quota(pool: NodePool) -> None:
    """Give back the nodes and GPUs a pool's spec reserved (on its deletion request)."""
    quotas.release(
        pool.tenant_id,
        nodes=pool.node_count,
        gpus={pool.gpu_model_id: pool.node_count * pool.gpus_per_node},
    )


def enqueue_reconcile(pool_id) -> None:
    from .tasks import reconcile_nodepool

    transaction.on_commit(lambda: reconcile_nodepool.delay(str(pool_id)))


def create_nodepool(
    *,
    principal: Principal,
    cluster: Cluster,
    name: str,
    gpu_model: str,
    gpus_per_node: int,
    node_count: int,
    isolation: Any,
) -> Operation:
    """Create a node pool (phase PROVISIONING) and its CREATE_NODE_POOL operation.

    Raises InvalidInput (``unknown_gpu_model``, ``gpus_per_node_too_large``, isolation codes,
    see :mod:`nodepools.isolation`) or Conflict (``cluster_not_active``,
    ``duplicate_nodepool_name``). Nothing is written when a check fails.
    """
    try:
        model = get_gpu_model(gpu_model)
    except UnknownGpuModel as exc:
        raise InvalidInput(
            f"unknown GPU model {gpu_model!r}",
            code="unknown_gpu_model",
            field="gpu_model",
            extra={"valid_gpu_models": list(exc.valid)},
        ) from exc
    policy = validate_isolation(model, isolation)
    largest = max_host_gpus(model.slug)
    if largest and gpus_per_node > largest:
        raise InvalidInput(
            f"gpus_per_node={gpus_per_node} but the largest {model.slug} host has {largest} GPUs",
            code="gpus_per_node_too_large",
            field="gpus_per_node",
            extra={"max_gpus_per_node": largest},
        )
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
        if cluster.phase in GONE_PHASES or cluster.deletion_requested_at is not None:
            raise Conflict(
                f"cluster {cluster.name!r} is {cluster.phase}", code="cluster_not_active"
            )
        if (
            NodePool.objects.filter(cluster=cluster, name=name)
            .exclude(phase=Phase.DELETED)
            .exists()
        ):
            raise Conflict(
                f"node pool {name!r} already exists in cluster {cluster.name!r}",
                code="duplicate_nodepool_name",
                field="name",
            )
        quotas.reserve(
            cluster.tenant_id,
            nodes=node_count,
            gpus={model.slug: node_count * gpus_per_node},
        )
        pool = NodePool.objects.create(
            tenant=cluster.tenant,
            cluster=cluster,
            name=name,
            gpu_model=model,
            gpus_per_node=gpus_per_node,
            node_count=node_count,
            isolation=policy,
            gpu_config=render_gpu_config(
                gpu_model=model, gpus_per_node=gpus_per_node, isolation=policy, pool_name=name
            ),
        )
        op = Operation.objects.create(
            tenant=cluster.tenant,
            cluster=cluster,
            type=OperationType.CREATE_NODE_POOL,
            target_type=TargetType.NODE_POOL,
            target_id=pool.id,
            requested_by=principal.label,
            progress={"done": 0, "total": node_count, "stage": "pending"},
        )
        audit.record(
            actor=principal.label,
            action="nodepool.create",
            target_type="nodepool",
            target_id=pool.id,
            tenant_id=cluster.tenant_id,
            after=pool_spec_of(pool),
        )
        enqueue_reconcile(pool.id)
    return op


def delete_nodepool(*, principal: Principal, pool: NodePool) -> Operation:
    """Request deletion of a node pool (its nodes are drained and released by the reconciler).

    Idempotent while the deletion runs. Raises Conflict ``nodepool_deleted``.
    """
    with transaction.atomic():
        pool = NodePool.objects.select_for_update().get(pk=pool.pk)
        if pool.phase == Phase.DELETED:
            raise Conflict("the node pool is already deleted", code="nodepool_deleted")
        if pool.deletion_requested_at is not None and pool.phase != Phase.DELETE_FAILED:
            existing = active_operation(pool.id)
            if existing is not None and existing.type == OperationType.DELETE_NODE_POOL:
                return existing
        now = timezone.now()
        if pool.deletion_requested_at is None:
            release_pool_quota(pool)
        previous_phase = pool.phase
        cancel_operations(pool.id, "superseded by the node pool's deletion", now)
        pool.deletion_requested_at = pool.deletion_requested_at or now
        pool.phase = Phase.DELETING
        pool.generation += 1
        pool.save(update_fields=["deletion_requested_at", "phase", "generation", "updated_at"])
        op = Operation.objects.create(
            tenant=pool.tenant,
            cluster_id=pool.cluster_id,
            type=OperationType.DELETE_NODE_POOL,
            target_type=TargetType.NODE_POOL,
            target_id=pool.id,
            requested_by=principal.label,
            progress={"done": 0, "total": pool.nodes.count(), "stage": "pending"},
        )
        audit.record(
            actor=principal.label,
            action="nodepool.delete",
            target_type="nodepool",
            target_id=pool.id,
            tenant_id=pool.tenant_id,
            before={"phase": previous_phase},
            after={"phase": pool.phase},
        )
        enqueue_reconcile(pool.id)
    return op
