"""VM nodes of ``tenancy: shared`` pools on shared hosts: what the node-side code needs.

A shared pool's node holds GPU instances of a shared host's GPUs (fleet.GpuInstance rows,
placed by :mod:`fleet.shared_hosts`), not whole GPUs; ``Node.gpu_uuids`` lists the GPUs
they are on. The observed-state gate checks that the host's agent reports each of the node's
own instances (others' may be there too), the node's ``gpu_layout`` shows only its own
instances (never another tenant's), and its ledger rows are one per instance, billed by the
profile's fraction (billing/fractions.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleet.shared_hosts import instances_of

from .models import Node

if TYPE_CHECKING:
    from fleet.agent_facts import HostFacts


def node_gpu_instances(
    node: Node, facts: HostFacts | None = None
) -> dict[str, tuple[tuple[str, int, int], ...]] | None:
    """``{gpu_uuid: sorted (profile, start, size)}`` of the node's instances; None when the
    node holds no GPU instance (a whole-GPU node).

    With the host's ``facts`` already read (:func:`fleet.agent_facts.host_facts`), a node that
    holds each of its GPUs whole (``Gpu.holder_id`` is the node) is answered None without a
    query: GPU instances are placed only on GPUs nobody holds whole (shared hosts).
    """
    if facts is not None and _holds_whole_gpus(node, facts):
        return None
    rows = instances_of(node.id)
    if not rows:
        return None
    out: dict[str, list[tuple[str, int, int]]] = {}
    for row in rows:
        out.setdefault(row.gpu.uuid, []).append((row.profile, row.start, row.size))
    return {uuid: tuple(sorted(items)) for uuid, items in out.items()}


def _holds_whole_gpus(node: Node, facts: HostFacts) -> bool:
    gpus = [facts.gpus.get(uuid) for uuid in node.gpu_uuids]
    return bool(gpus) and all(g is not None and g.holder_id == node.id for g in gpus)


def allocations(node: Node) -> list[dict[str, Any]] | None:
    """The ``node_ready`` allocations of a VM node: one per GPU instance
    (``{"gpu_uuid", "mig_gpu_instance_id", "mig_profile"}``, the NVML GPU-instance id as the
    agent reported it); None for a whole-GPU node (billing's default: one row per GPU).
    Raises RuntimeError when an instance's id was never reported (the READY gate waits for
    the agent's report, which records it, so this does not happen)."""
    rows = instances_of(node.id)
    if not rows:
        return None
    missing = [f"{r.profile}@{r.start}" for r in rows if r.gpu_instance_id is None]
    if missing:
        raise RuntimeError(f"GPU-instance ids of {', '.join(missing)} not reported yet")
    return [
        {"gpu_uuid": r.gpu.uuid, "mig_gpu_instance_id": r.gpu_instance_id, "mig_profile": r.profile}
        for r in rows
    ]
