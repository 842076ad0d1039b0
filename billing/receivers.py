"""Open and close ledger rows when nodes become ready / are released (nodepools' signals).

``node_ready(sender, node, allocations=None)``: without ``allocations`` the node holds the
whole GPUs in ``node.gpu_uuids`` (one row each, fraction 1.0: a pool owning whole GPUs pays
1.0 GPU-hour per GPU-hour, MIG or not). A sender that places MIG slices of GPUs shared across
tenants passes ``allocations=[{"gpu_uuid", "mig_gpu_instance_id", "mig_profile"}]``: one row
per slice, billed by its profile's share (:mod:`billing.fractions`).
"""

from __future__ import annotations

from django.dispatch import receiver

from nodepools.signals import node_ready, node_released

from .ledger import close_allocations, open_allocation


@receiver(node_ready)
def open_ledger(sender, node, allocations=None, **kwargs) -> None:
    """Open one row per GPU (or slice) the node holds, from ``node.ready_at``. Idempotent."""
    if allocations is None:
        allocations = [
            {"gpu_uuid": uuid, "mig_profile": node.nodepool.isolation.get("mig_profile", "")}
            for uuid in node.gpu_uuids
        ]
    for alloc in allocations:
        open_allocation(
            node=node,
            gpu_uuid=alloc["gpu_uuid"],
            start=node.ready_at,
            mig_gpu_instance_id=alloc.get("mig_gpu_instance_id"),
            mig_profile=alloc.get("mig_profile", ""),
        )


@receiver(node_released)
def close_ledger(sender, node, **kwargs) -> None:
    """Close the node's open rows at ``node.released_at`` (guarded UPDATE; idempotent)."""
    close_allocations(node, node.released_at)
