"""Machines on NVKE's own fleet inventory: the GPU claim both providers make for a pool's
nodes (the simulated one and the Cluster API one reserve GPUs the same way)."""

from __future__ import annotations

from fleet import placement

from .base import InsufficientCapacity, NodePoolSpec, NodeSpec, ProviderError

#: ``ProviderError.code`` of a claim that met other claims on every fitting host
PLACEMENT_CONTENDED = "placement_contended"


def claim_fleet_gpus(pool: NodePoolSpec, nodes: list[NodeSpec]) -> list[placement.Placement]:
    """Claim ``pool.gpus_per_node`` GPUs per node in the pool's region, all or none.

    Raises the provider-level InsufficientCapacity (retryable) when the fleet lacks room even
    with every other claim's lock released, and a retryable ProviderError
    ``placement_contended`` when concurrent claims hold every host that would fit (the caller
    tries again after a short backoff, see :mod:`fleet.placement`).
    """
    requests = [
        placement.GpuRequest(
            holder_id=node.id,
            tenant_id=pool.cluster.tenant_id,
            gpu_model=pool.gpu_model,
            gpus=pool.gpus_per_node,
            region=pool.cluster.region,
            zone=pool.zone or None,
            reservation_id=pool.reservation_id,
        )
        for node in nodes
    ]
    try:
        return placement.claim_gpus(requests)
    except placement.InsufficientCapacity as exc:
        raise InsufficientCapacity(str(exc), retryable=True) from exc
    except placement.PlacementContended as exc:
        raise ProviderError(str(exc), retryable=True, code=PLACEMENT_CONTENDED) from exc
