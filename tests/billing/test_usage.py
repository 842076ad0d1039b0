"""GPU-hours from the ledger and utilization from samples, checked against hand-worked values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from tests.helpers import drive_cluster

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 10, 40, tzinfo=UTC)  # nodes become READY at 10:40


@pytest.fixture
def h100_pool(owner, make_host):
    """2 nodes x 8 H100 (SIMULATED hosts), READY at 10:40 UTC."""
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1b")
    cluster = owner.post(
        "/api/v1/clusters",
        {"name": "train", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    ).json()["target_id"]
    drive_cluster(cluster)
    op = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {"name": "h100", "gpu_model": "h100-sxm5-80gb", "gpus_per_node": 8, "node_count": 2},
        format="json",
    ).json()
    from nodepools.reconcile import reconcile_nodepool

    for _ in range(5):
        if reconcile_nodepool(op["target_id"], now=T0) is None:
            break
    return cluster, op["target_id"]


def usage(client, cluster, start, end):
    resp = client.get(
        f"/api/v1/clusters/{cluster}/usage",
        {"start": start.isoformat(), "end": end.isoformat()},
    )
    assert resp.status_code == 200, resp.content
    return resp.json()


def test_gpu_hours_inside_the_allocation_are_gpus_times_hours(owner, h100_pool):
    cluster, _ = h100_pool
    body = usage(owner, cluster, T0 + timedelta(minutes=20), T0 + timedelta(minutes=110))
    # 16 GPUs x 1.5 h = 24 GPU-hours (whole GPUs bill 1.0 per GPU-hour)
    assert Decimal(str(body["gpu_hours"])) == Decimal("24")
    assert Decimal(str(body["gpu_seconds"])) == Decimal(16 * 90 * 60)
    assert body["by_gpu_model"][0]["gpu_model"] == "h100-sxm5-80gb"
    assert body["mean_gpu_utilization_pct"] is None
    assert body["sample_count"] == 0


def test_window_before_the_allocation_counts_nothing(owner, h100_pool):
    cluster, _ = h100_pool
    body = usage(owner, cluster, T0 - timedelta(hours=2), T0)
    assert body["gpu_hours"] == 0
    assert body["by_gpu_model"] == []


def test_released_nodes_stop_counting_and_reads_are_stable(owner, h100_pool):
    from nodepools.reconcile import reconcile_nodepool

    cluster, pool = h100_pool
    assert owner.delete(f"/api/v1/clusters/{cluster}/nodepools/{pool}").status_code == 202
    reconcile_nodepool(pool, now=T0 + timedelta(minutes=90))  # released at 12:10
    window = (T0 - timedelta(hours=1), T0 + timedelta(hours=3))
    first = usage(owner, cluster, *window)
    # 16 GPUs x 1.5 h (10:40 -> 12:10)
    assert Decimal(str(first["gpu_hours"])) == Decimal("24")
    assert usage(owner, cluster, *window) == first


def test_mean_utilization_ignores_na_and_mig_samples(owner, h100_pool):
    from fleet.ingest import ingest_report
    from nodepools.models import Node

    cluster, _ = h100_pool
    node = Node.objects.order_by("name").first()
    gpu = node.gpu_uuids[0]
    t = T0 + timedelta(minutes=30)
    samples = [
        {"ts": (t + timedelta(seconds=i)).isoformat(), "gpu_uuid": gpu, "utilization_gpu_pct": u}
        for i, u in enumerate([10, 40, 70, None])
    ]
    # a MIG GPU-instance sample never counts as a GPU sample
    samples.append(
        {"ts": t.isoformat(), "gpu_uuid": gpu, "mig_gpu_instance_id": 3, "utilization_gpu_pct": 99}
    )
    ack = ingest_report(node.host, {"seq": 1, "samples": samples}, now=t + timedelta(minutes=1))
    assert (ack.samples_stored, ack.samples_rejected) == (5, 0)
    body = usage(owner, cluster, T0, T0 + timedelta(hours=1))
    assert body["mean_gpu_utilization_pct"] == 40.0
    assert body["sample_count"] == 4
    assert body["utilization_sample_count"] == 3


def test_another_tenants_usage_is_404(outsider, owner, h100_pool):
    cluster, _ = h100_pool
    missing = outsider.get("/api/v1/clusters/00000000-0000-0000-0000-000000000000/usage")
    foreign = outsider.get(f"/api/v1/clusters/{cluster}/usage")
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json() == missing.json()


def test_bad_time_window_is_refused(owner, h100_pool):
    cluster, _ = h100_pool
    resp = owner.get(f"/api/v1/clusters/{cluster}/usage", {"start": "yesterday"})
    assert resp.status_code == 400
    assert (resp.json()["code"], resp.json()["field"]) == ("invalid_time", "start")
