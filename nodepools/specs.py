"""Model -> provider dataclass conversion for node pools and nodes."""

from __future__ import annotations

from django.utils import timezone

from clusters.providers.base import NodePoolSpec, NodeSpec
from clusters.specs import cluster_spec

from .models import Node, NodePool


def nodepool_spec(pool: NodePool) -> NodePoolSpec:
    return NodePoolSpec(
        id=pool.id,
        cluster=cluster_spec(pool.cluster),
        name=pool.name,
        gpu_model=pool.gpu_model_id,
        gpus_per_node=pool.gpus_per_node,
        isolation=pool.isolation,
        gpu_config=pool.gpu_config,
        placement=pool.placement,
        kubernetes_version=pool.kubernetes_version,
        driver_version=pool.driver_version,
        **_reservation_of(pool),
    )


def _reservation_of(pool: NodePool) -> dict:
    """The pool's reservation while it is in force; after it ended (``keep``) the pool's
    new nodes are placed on-demand like any other. A reservation of a whole NVLink domain pins
    the nodes to that domain's hosts."""
    reservation = pool.reservation
    if reservation is None or not reservation.is_active(timezone.now()):
        return {}
    return {
        "reservation_id": reservation.id,
        "zone": reservation.zone,
        "nvlink_domain": reservation.nvlink_domain,
    }


def node_spec(node: Node) -> NodeSpec:
    return NodeSpec(
        id=node.id,
        name=node.name,
        created_at=node.created_at,
        gpu_uuids=tuple(node.gpu_uuids),
        host_id=node.host_id,
        kubernetes_version=node.kubernetes_version,
        driver_version=node.driver_version,
    )
