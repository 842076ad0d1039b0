"""Model -> provider dataclass conversion."""

from __future__ import annotations

from .models import Cluster
from .providers.base import ClusterSpec


def cluster_spec(cluster: Cluster) -> ClusterSpec:
    return ClusterSpec(
        id=cluster.id,
        tenant_id=cluster.tenant_id,
        name=cluster.name,
        kubernetes_version=cluster.kubernetes_version,
        region=cluster.region,
        created_at=cluster.created_at,
    )
