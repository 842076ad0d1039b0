"""Provider dataclasses for the clusterapi tests, with fixed ids so names are stable."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

CLUSTER_ID = uuid.UUID("0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d")
TENANT_ID = uuid.UUID("11111111-2222-4333-8444-555555555555")
POOL_ID = uuid.UUID("fedcba98-7654-4321-8fed-cba987654321")
NODE_IDS = [
    uuid.UUID("00000000-0000-4000-8000-000000000001"),
    uuid.UUID("00000000-0000-4000-8000-000000000002"),
    uuid.UUID("00000000-0000-4000-8000-000000000003"),
]
CREATED = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def cluster_spec(name: str = "llm-training", version: str = "1.36"):
    from clusters.providers.base import ClusterSpec

    return ClusterSpec(
        id=CLUSTER_ID,
        tenant_id=TENANT_ID,
        name=name,
        kubernetes_version=version,
        region="us-east-1",
        created_at=CREATED,
    )


def pool_spec(
    gpu_model: str = "h100-sxm5-80gb",
    gpus_per_node: int = 2,
    isolation: dict | None = None,
    *,
    name: str = "h100-mig",
    driver: str | None = None,
    cluster=None,
):
    """A NodePoolSpec whose gpu_config is NVKE's real rendering (needs the catalog)."""
    from catalog.models import GpuModel
    from clusters.providers.base import NodePoolSpec
    from nodepools.gpu_config import render_gpu_config

    isolation = isolation or {"mode": "mig", "mig_profile": "1g.10gb"}
    config = render_gpu_config(
        gpu_model=GpuModel.objects.get(slug=gpu_model),
        gpus_per_node=gpus_per_node,
        isolation=isolation,
        pool_name=name,
        driver_version=driver,
    )
    return NodePoolSpec(
        id=POOL_ID,
        cluster=cluster or cluster_spec(),
        name=name,
        gpu_model=gpu_model,
        gpus_per_node=gpus_per_node,
        isolation=isolation,
        gpu_config=config,
    )


def node_spec(i: int = 0, gpus: tuple[str, ...] = ()):
    from clusters.providers.base import NodeSpec

    return NodeSpec(id=NODE_IDS[i], name=f"node-{i}", created_at=CREATED, gpu_uuids=gpus)
