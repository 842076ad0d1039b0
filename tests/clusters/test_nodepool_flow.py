"""Clusters and node pools through the API, reconciled by calling the reconcilers directly
(the end-to-end test runs a real worker)."""

from __future__ import annotations

import pytest

from tests.helpers import drive_cluster, drive_pool

pytestmark = pytest.mark.django_db

A100_UUID = "GPU-513536b6-7d19-9063-b049-1e69664bb298"


def create_cluster(client, name="c1", region="us-east-1", version="1.36"):
    return client.post(
        "/api/v1/clusters",
        {"name": name, "kubernetes_version": version, "region": region},
        format="json",
    )


def create_pool(client, cluster_id, **overrides):
    body = {
        "name": "gpu",
        "gpu_model": "a100-sxm4-80gb",
        "gpus_per_node": 1,
        "node_count": 1,
        "isolation": {"mode": "mig", "mig_profile": "1g.20gb"},
    }
    body.update(overrides)
    return client.post(f"/api/v1/clusters/{cluster_id}/nodepools", body, format="json")


@pytest.fixture
def running_cluster(owner, import_capture):
    import_capture("a100-sxm4-v12.xml", "gpu-a100-01", "us-east-1a")
    op = create_cluster(owner).json()
    drive_cluster(op["target_id"])
    return op["target_id"]


def test_create_cluster_answers_202_with_an_operation_and_reconciles_to_running(
    owner, import_capture
):
    import_capture("a10g.xml", "h1", "us-east-1b")
    resp = create_cluster(owner)
    assert resp.status_code == 202
    op = resp.json()
    assert op["type"] == "CREATE_CLUSTER"
    assert op["target_type"] == "cluster"
    assert op["status"] == "PENDING"
    assert op["error"] is None
    cluster = owner.get(f"/api/v1/clusters/{op['target_id']}").json()
    assert (cluster["phase"], cluster["generation"], cluster["observed_generation"]) == (
        "PROVISIONING",
        1,
        0,
    )
    drive_cluster(op["target_id"])
    cluster = owner.get(f"/api/v1/clusters/{op['target_id']}").json()
    assert (cluster["phase"], cluster["observed_generation"]) == ("RUNNING", 1)
    ready = {c["type"]: c["status"] for c in cluster["conditions"]}
    assert ready["Ready"] == "True"
    assert ready["ControlPlaneReady"] == "True"
    op = owner.get(f"/api/v1/operations/{op['id']}").json()
    assert op["status"] == "DONE"
    assert op["progress"] == {"done": 1, "total": 1, "stage": "done"}


def test_mig_pool_lands_on_the_imported_gpu(owner, running_cluster):
    resp = create_pool(owner, running_cluster)
    assert resp.status_code == 202, resp.content
    op = resp.json()
    assert (op["type"], op["target_type"]) == ("CREATE_NODE_POOL", "nodepool")
    drive_pool(op["target_id"])
    pool = owner.get(f"/api/v1/clusters/{running_cluster}/nodepools/{op['target_id']}").json()
    assert pool["phase"] == "RUNNING"
    (node,) = pool["nodes"]
    assert node["phase"] == "READY"
    assert node["host"] == "gpu-a100-01"
    assert node["gpu_uuids"] == [A100_UUID]
    # GPU Operator inputs (single strategy: 4 x 1g.20gb per A100-80GB, MIG user guide)
    assert pool["gpu_config"]["labels"]["nvidia.com/mig.config"] == "all-1g.20gb"
    assert pool["gpu_config"]["resources"] == {"nvidia.com/gpu": 4}
    assert owner.get(f"/api/v1/operations/{op['id']}").json()["status"] == "DONE"
    cluster = owner.get(f"/api/v1/clusters/{running_cluster}").json()
    nodes_ready = next(c for c in cluster["conditions"] if c["type"] == "NodesReady")
    assert nodes_ready["status"] == "True"


def test_no_free_host_fails_the_operation_with_insufficient_capacity_and_holds_nothing(
    owner, running_cluster
):
    from fleet.models import Gpu
    from nodepools.models import Node

    op = create_pool(owner, running_cluster, node_count=2).json()  # one A100 in the region
    drive_pool(op["target_id"])
    op = owner.get(f"/api/v1/operations/{op['id']}").json()
    assert op["status"] == "FAILED"
    assert op["error"]["code"] == "insufficient_capacity"
    assert op["error"]["retryable"] is True
    assert not Gpu.objects.filter(holder_id__isnull=False).exists()
    assert not Node.objects.exists()
    pool = owner.get(f"/api/v1/clusters/{running_cluster}/nodepools/{op['target_id']}").json()
    assert pool["phase"] == "ERROR"


def test_hosts_outside_the_region_are_not_used(owner, import_capture):
    import_capture("a100-sxm4-v12.xml", "gpu-a100-01", "us-west-2a")
    import_capture("a10g.xml", "h1", "us-east-1b")
    cluster = create_cluster(owner, region="us-east-1").json()["target_id"]
    drive_cluster(cluster)
    op = create_pool(owner, cluster).json()
    drive_pool(op["target_id"])
    assert owner.get(f"/api/v1/operations/{op['id']}").json()["error"]["code"] == (
        "insufficient_capacity"
    )


@pytest.mark.parametrize(
    ("overrides", "code", "field"),
    [
        ({"gpu_model": "a100-sxm4-81gb"}, "unknown_gpu_model", "gpu_model"),
        (
            {"isolation": {"mode": "mig", "mig_profile": "1g.18gb"}},
            "unknown_mig_profile",
            "isolation.mig_profile",
        ),
        (
            {"gpu_model": "a10g", "isolation": {"mode": "mig", "mig_profile": "1g.10gb"}},
            "mig_not_supported",
            "isolation.mode",
        ),
        (
            {"gpu_model": "t4", "isolation": {"mode": "mig", "mig_profile": "1g.10gb"}},
            "mig_not_supported",
            "isolation.mode",
        ),
        ({"gpus_per_node": 2}, "gpus_per_node_too_large", "gpus_per_node"),
        ({"isolation": {"mode": "mig"}}, "mig_profile_required", "isolation.mig_profile"),
        ({"isolation": {"mode": "banana"}}, "invalid_isolation", "isolation.mode"),
        ({"name": "Not_A_Label"}, "invalid_field", "name"),
        ({"node_count": 0}, "min_value", "node_count"),
    ],
)
def test_bad_node_pools_are_refused_naming_the_field(
    owner, running_cluster, import_capture, overrides, code, field
):
    from nodepools.models import NodePool

    import_capture("tesla-t4.xml", "t4-1", "us-east-1c")
    import_capture("a10g.xml", "a10g-1", "us-east-1c")
    resp = create_pool(owner, running_cluster, **overrides)
    assert resp.status_code == 400, resp.content
    assert resp["Content-Type"] == "application/problem+json"
    body = resp.json()
    assert (body["code"], body["field"]) == (code, field)
    assert not NodePool.objects.exists()


def test_unknown_mig_profile_lists_the_valid_ones(owner, running_cluster):
    body = create_pool(
        owner, running_cluster, isolation={"mode": "mig", "mig_profile": "1g.18gb"}
    ).json()
    assert "1g.20gb" in body["valid_profiles"]
    assert "1g.18gb" not in body["valid_profiles"]  # an H200 profile


def test_unsupported_kubernetes_version_is_refused(owner, import_capture):
    import_capture("a10g.xml", "h1", "us-east-1b")
    resp = create_cluster(owner, version="1.19")
    assert resp.status_code == 400
    assert resp.json()["code"] == "unsupported_kubernetes_version"
    assert resp.json()["field"] == "kubernetes_version"


def test_duplicate_cluster_name_conflicts(owner, import_capture):
    import_capture("a10g.xml", "h1", "us-east-1b")
    assert create_cluster(owner).status_code == 202
    resp = create_cluster(owner)
    assert resp.status_code == 409
    assert resp.json()["code"] == "duplicate_cluster_name"


def test_delete_cluster_releases_hosts_and_closes_the_ledger(owner, running_cluster):
    from billing.models import LedgerEntry
    from fleet.models import Gpu, Host

    op = create_pool(owner, running_cluster).json()
    drive_pool(op["target_id"])
    assert Host.objects.get().state == "ALLOCATED"
    resp = owner.delete(f"/api/v1/clusters/{running_cluster}")
    assert resp.status_code == 202
    delete_op = resp.json()
    assert delete_op["type"] == "DELETE_CLUSTER"
    # deletion is idempotent while it runs
    assert owner.delete(f"/api/v1/clusters/{running_cluster}").json()["id"] == delete_op["id"]
    from clusters.reconcile import reconcile_cluster

    assert reconcile_cluster(running_cluster) == 1.0  # asks the pool to go, then waits for it
    assert owner.get(f"/api/v1/clusters/{running_cluster}").json()["phase"] == "DELETING"
    drive_pool(op["target_id"])
    drive_cluster(running_cluster)
    cluster = owner.get(f"/api/v1/clusters/{running_cluster}").json()
    assert cluster["phase"] == "DELETED"
    assert owner.get(f"/api/v1/operations/{delete_op['id']}").json()["status"] == "DONE"
    assert Host.objects.get().state == "AVAILABLE"
    assert not Gpu.objects.filter(holder_id__isnull=False).exists()
    from nodepools.models import Node

    (entry,) = LedgerEntry.objects.all()
    (node,) = Node.objects.all()
    assert (entry.period.lower, entry.period.upper) == (node.ready_at, node.released_at)
    assert node.released_at > node.ready_at
