"""The quota invariant: what a tenant's quota row has reserved equals what its live specs ask.

Live means not yet asked to go: a cluster or node pool whose ``deletion_requested_at`` is unset
(a deletion request releases the reservation at once, whatever the reconcilers still do). A
pool reserves ``node_count`` nodes and ``node_count * gpus_per_node`` GPUs of its model; a
cluster reserves one cluster. The fault suite and the quota race tests check it after
randomised create / scale / delete races; an operator can run it too
(:func:`quota_drift` lists every tenant whose row disagrees).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from clusters.models import Cluster
from tenants.models import Quota

from .models import Node, NodePool


@dataclass(frozen=True)
class Reservations:
    clusters: int
    nodes: int
    gpus: dict[str, int]


def expected_reservations(tenant_id: Any) -> Reservations:
    """What the tenant's live specs ask for."""
    clusters = Cluster.objects.filter(tenant_id=tenant_id, deletion_requested_at__isnull=True)
    pools = NodePool.objects.filter(
        tenant_id=tenant_id,
        deletion_requested_at__isnull=True,
        cluster__deletion_requested_at__isnull=True,
    ).values_list("node_count", "gpus_per_node", "gpu_model_id")
    nodes, gpus = 0, {}
    for count, per_node, model in pools:
        nodes += count
        if count:
            gpus[model] = gpus.get(model, 0) + count * per_node
    return Reservations(clusters=clusters.count(), nodes=nodes, gpus=gpus)


def in_use(tenant_id: Any) -> tuple[int, dict[str, int]]:
    """What the tenant holds now, as opposed to what its quota has reserved: its READY nodes
    and the GPUs they hold, by GPU model (catalog slug) — ``(nodes, {slug: gpus})``. A pool
    still provisioning, or a node NOT_READY, reserves quota without being in use."""
    from .choices import NodePhase

    nodes = Node.objects.filter(tenant_id=tenant_id, phase=NodePhase.READY)
    gpus: dict[str, int] = {}
    for model, held in nodes.values_list("nodepool__gpu_model_id", "gpu_uuids"):
        gpus[model] = gpus.get(model, 0) + len(held)
    return nodes.count(), gpus


def reserved(quota: Quota) -> Reservations:
    return Reservations(
        clusters=quota.reserved_clusters,
        nodes=quota.reserved_nodes,
        gpus={k: v for k, v in quota.reserved_gpus.items() if v},
    )


def quota_drift() -> dict[uuid.UUID, tuple[Reservations, Reservations]]:
    """``{tenant id: (reserved, expected)}`` for every tenant whose quota row disagrees."""
    out = {}
    for quota in Quota.objects.all():
        have, want = reserved(quota), expected_reservations(quota.tenant_id)
        if have != want:
            out[quota.tenant_id] = (have, want)
    return out
