"""Resize a node pool (``SET_NODE_POOL_SIZE``): quota reserved or released in the same
transaction as the new spec; the reconciler adds nodes or removes the newest first."""

from __future__ import annotations

from django.db import transaction

from clusters.choices import GONE_PHASES, OperationType
from clusters.models import Cluster, Operation
from clusters.operations import Audit, start_operation
from clusters.services import ensure_no_active_operation
from nvke.errors import Conflict
from tenants import quotas
from tenants.principal import Principal

from . import nvlink
from .models import NodePool


def set_node_pool_size(*, principal: Principal, pool: NodePool, node_count: int) -> Operation:
    """Set ``node_count``; generation+1; a SET_NODE_POOL_SIZE operation.

    Raises Conflict ``nodepool_not_active`` (deleting/deleted), ``quota_exceeded`` or, for a
    pool kept in one NVLink domain, ``nvlink_domain_full`` (its domain has no room for the
    new nodes).
    Lock order: the pool row, then the quota row (as everywhere).
    """
    with transaction.atomic():
        pool = NodePool.objects.select_for_update().get(pk=pool.pk)
        ensure_no_active_operation(
            Cluster.objects.select_for_update(no_key=True).get(pk=pool.cluster_id)
        )
        if pool.phase in GONE_PHASES or pool.deletion_requested_at is not None:
            raise Conflict(f"node pool {pool.name!r} is {pool.phase}", code="nodepool_not_active")
        delta = node_count - pool.node_count
        if delta > 0 and nvlink.wants_one_domain(pool.placement):
            # Scale-up stays in the pool's domain: 409 now when it has no room for them.
            # (A pool that grows past one domain's size is refused by the same check.)
            nvlink.check_room(
                gpu_model=pool.gpu_model_id,
                region=pool.cluster.region,
                tenant_id=pool.tenant_id,
                gpus_per_node=pool.gpus_per_node,
                nodes=node_count,
                pool_id=pool.id,
                reservation=pool.reservation,
            )
        gpus = {pool.gpu_model_id: abs(delta) * pool.gpus_per_node}
        if delta > 0:
            quotas.reserve(pool.tenant_id, nodes=delta, gpus=gpus)
        elif delta < 0:
            quotas.release(pool.tenant_id, nodes=-delta, gpus=gpus)
        before = pool.node_count
        pool.node_count = node_count
        pool.generation += 1
        pool.save(update_fields=["node_count", "generation", "updated_at"])
        return start_operation(
            **pool.operation_target(),
            type=OperationType.SET_NODE_POOL_SIZE,
            requested_by=principal.label,
            total=node_count,
            audit_event=Audit(
                "nodepool.set_size", before={"node_count": before}, after={"node_count": node_count}
            ),
        )
