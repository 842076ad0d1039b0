"""Rows for the list tests and the list benchmark: ``n`` RUNNING clusters of one tenant, ``n``
node pools (two nodes each, on a SIMULATED host) in the first cluster, ``n`` operations."""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone


@dataclass(frozen=True)
class ListRows:
    first_cluster_id: str
    clusters: int
    nodepools: int
    operations: int


def seed_lists(tenant, host, n: int = 50) -> ListRows:
    """Bulk-create the rows (one INSERT per table); ``host`` is a simulated fleet host."""
    from clusters.models import Cluster, Operation
    from nodepools.models import Node, NodePool

    now = timezone.now()
    clusters = Cluster.objects.bulk_create(
        [
            Cluster(
                tenant=tenant,
                name=f"c{i:03d}",
                kubernetes_version="1.34",
                control_plane_version="1.34",
                region="us-east-1",
                phase="RUNNING",
                observed_generation=1,
                endpoint=f"https://c{i:03d}.example.invalid:6443",
            )
            for i in range(n)
        ]
    )
    first = clusters[0]
    pools = NodePool.objects.bulk_create(
        [
            NodePool(
                tenant=tenant,
                cluster=first,
                name=f"p{i:03d}",
                gpu_model_id=host.gpu_model_id,
                gpus_per_node=1,
                node_count=2,
                isolation={"mode": "exclusive"},
                kubernetes_version="1.34",
                phase="RUNNING",
            )
            for i in range(n)
        ]
    )
    Node.objects.bulk_create(
        [
            Node(
                tenant=tenant,
                cluster=first,
                nodepool=pool,
                name=f"{pool.name}-n{j}",
                phase="READY",
                host=host,
                zone=host.zone,
                gpu_uuids=[],
            )
            for pool in pools
            for j in range(2)
        ]
    )
    Operation.objects.bulk_create(
        [
            Operation(
                tenant=tenant,
                cluster=clusters[i % len(clusters)],
                type="CREATE_CLUSTER",
                target_type="cluster",
                target_id=clusters[i % len(clusters)].id,
                status="DONE",
                progress={"done": 1, "total": 1, "stage": "done"},
                requested_by="bench",
                started_at=now,
                finished_at=now,
            )
            for i in range(n)
        ]
    )
    return ListRows(str(first.id), n, n, n)
