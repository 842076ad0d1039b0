"""What one reconcile step of a node pool costs in queries (the reconcile benchmark,
``tests/bench/test_bench_reconcile.py``, is bound by them: docs/development/benchmarks.md).

A whole-GPU pool of one node on the simulated provider converges in two steps: the first
places the node, the second makes it READY once its host's agent reported (in-process here)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.helpers import drive_cluster

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(owner, make_host):
    make_host("h100-sxm5-80gb", gpus=8)
    cluster = owner.post(
        "/api/v1/clusters",
        {"name": "c1", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    ).json()["target_id"]
    drive_cluster(cluster)
    return cluster


def create_pool(owner, cluster, name="p1") -> str:
    return owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {"name": name, "gpu_model": "h100-sxm5-80gb", "gpus_per_node": 1, "node_count": 1},
        format="json",
    ).json()["target_id"]


def _count(queries, table: str) -> int:
    return sum(1 for q in queries if f'FROM "{table}"' in q["sql"])


def _host_facts_reads(queries) -> int:
    """Reads of ``fleet.agent_facts.host_facts`` (its host row: the agent's source error)."""
    return sum(1 for q in queries if '"fleet_host"."agent_source_error" AS' in q["sql"])


def test_the_step_that_makes_a_whole_gpu_node_ready_reads_no_gpu_instances_of_its_own(
    owner, cluster
):
    from nodepools.models import Node, NodePool
    from nodepools.reconcile import reconcile_nodepool

    first = create_pool(owner, cluster, "p0")  # the host's first report is not measured
    assert (reconcile_nodepool(first), reconcile_nodepool(first)) == (0.0, None)
    pool_id = create_pool(owner, cluster)
    assert reconcile_nodepool(pool_id) == 0.0  # placed
    with CaptureQueriesContext(connection) as ready_step:
        assert reconcile_nodepool(pool_id) is None
    node = Node.objects.get(nodepool_id=pool_id)
    assert (node.phase, NodePool.objects.get(pk=pool_id).phase) == ("READY", "RUNNING")
    # the node holds its GPU whole (the host facts say so): neither the gate nor the layout
    # asks for its GPU instances; the simulated host's boot and the ledger's allocations do
    assert _count(ready_step.captured_queries, "fleet_gpuinstance") == 2
    # the host's facts are read once by the gate and once for the layout; the drift check
    # skips the node made READY at this step (the gate compared it with the same report)
    assert _host_facts_reads(ready_step.captured_queries) == 2
    assert len(ready_step) <= 44


def test_the_pool_reconciler_hands_the_cluster_row_to_the_nodes_writer(owner, cluster):
    from clusters.models import Cluster
    from nodepools.tenant_nodes import sync_cluster_nodes

    row = Cluster.objects.get(pk=cluster)
    with CaptureQueriesContext(connection) as sync:
        assert sync_cluster_nodes(row.pk, row) == []  # simulated: publishes no Nodes
    assert len(sync) == 0
