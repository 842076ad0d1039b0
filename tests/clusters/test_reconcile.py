"""Each reconciler from each phase: the first call visibly advances it; once converged, a
further call changes no row (snapshot of every control-plane table before and after)."""

from __future__ import annotations

import pytest

from clusters.reconcile import reconcile_cluster
from nodepools.reconcile import reconcile_nodepool
from tests.helpers import drive_cluster, drive_pool, snapshot

pytestmark = pytest.mark.django_db


def assert_idempotent(step, object_id):
    before = snapshot()
    step(object_id)
    assert snapshot() == before


@pytest.fixture
def cluster_id(owner, import_capture):
    import_capture("a100-sxm4-v12.xml", "gpu-a100-01", "us-east-1a")
    import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b")
    return owner.post(
        "/api/v1/clusters",
        {"name": "c1", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    ).json()["target_id"]


def new_pool(owner, cluster_id, **overrides):
    body = {"name": "p1", "gpu_model": "a10g", "gpus_per_node": 1, "node_count": 1}
    body.update(overrides)
    return owner.post(f"/api/v1/clusters/{cluster_id}/nodepools", body, format="json").json()[
        "target_id"
    ]


def phase(model, pk):
    return model.objects.values_list("phase", flat=True).get(pk=pk)


def test_cluster_provisioning_to_running(cluster_id):
    from clusters.models import Cluster, Operation

    assert reconcile_cluster(cluster_id) is None
    assert phase(Cluster, cluster_id) == "RUNNING"
    assert Operation.objects.get(target_id=cluster_id).status == "DONE"
    assert_idempotent(reconcile_cluster, cluster_id)


def test_cluster_waiting_for_its_control_plane(cluster_id, settings):
    from clusters.models import Cluster, Operation

    settings.NVKE_SIMULATED_CONTROL_PLANE_DELAY_S = 600
    delay = reconcile_cluster(cluster_id)
    assert 590 < delay <= 600
    cluster = Cluster.objects.get(pk=cluster_id)
    assert cluster.phase == "PROVISIONING"
    assert {c["type"]: c["status"] for c in cluster.conditions}["ControlPlaneReady"] == "False"
    assert Operation.objects.get(target_id=cluster_id).status == "RUNNING"
    assert_idempotent(reconcile_cluster, cluster_id)


def test_pool_waiting_for_the_control_plane(owner, cluster_id, settings):
    from clusters.models import Cluster
    from nodepools.models import NodePool

    settings.NVKE_SIMULATED_CONTROL_PLANE_DELAY_S = 600
    # the API refuses pools while the cluster's CREATE runs; the reconciler still has to wait
    # whenever the control plane is not RUNNING (e.g. a pool spec change during an upgrade)
    pool_id = NodePool.objects.create(
        tenant=Cluster.objects.get(pk=cluster_id).tenant,
        cluster_id=cluster_id,
        name="p1",
        gpu_model_id="a10g",
        gpus_per_node=1,
        node_count=1,
        isolation={"mode": "exclusive"},
    ).pk
    assert reconcile_nodepool(pool_id) == 1.0
    pool = NodePool.objects.get(pk=pool_id)
    assert pool.conditions[0]["reason"] == "WaitingForControlPlane"
    assert_idempotent(reconcile_nodepool, pool_id)


def test_pool_provisioning_places_nodes_then_converges(owner, cluster_id):
    from fleet.models import Gpu
    from nodepools.models import Node, NodePool

    drive_cluster(cluster_id)
    pool_id = new_pool(owner, cluster_id)
    reconcile_nodepool(pool_id)  # first call: node row + GPU claimed
    (node,) = Node.objects.all()
    assert node.phase == "PROVISIONING"
    assert node.gpu_uuids == ["GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"]
    assert Gpu.objects.get(uuid=node.gpu_uuids[0]).holder_id == node.id
    drive_pool(pool_id)
    assert phase(NodePool, pool_id) == "RUNNING"
    assert_idempotent(reconcile_nodepool, pool_id)


def test_pool_error_on_insufficient_capacity_is_stable(owner, cluster_id):
    from nodepools.models import NodePool

    drive_cluster(cluster_id)
    pool_id = new_pool(owner, cluster_id, node_count=3)
    assert reconcile_nodepool(pool_id) is None
    assert phase(NodePool, pool_id) == "ERROR"
    assert_idempotent(reconcile_nodepool, pool_id)


def test_pool_deleting_releases_everything(owner, cluster_id):
    from billing.models import LedgerEntry
    from fleet.models import Gpu, Host
    from nodepools.models import Node, NodePool

    drive_cluster(cluster_id)
    pool_id = new_pool(owner, cluster_id)
    drive_pool(pool_id)
    owner.delete(f"/api/v1/clusters/{cluster_id}/nodepools/{pool_id}")
    assert reconcile_nodepool(pool_id) is None
    assert phase(NodePool, pool_id) == "DELETED"
    assert Node.objects.get().phase == "DELETED"
    assert not Gpu.objects.filter(holder_id__isnull=False).exists()
    assert set(Host.objects.values_list("state", flat=True)) == {"AVAILABLE"}
    node = Node.objects.get()
    assert LedgerEntry.objects.get().period.upper == node.released_at  # closed at the release
    assert_idempotent(reconcile_nodepool, pool_id)


def test_cluster_deleting_waits_for_pools_then_is_deleted(owner, cluster_id):
    from clusters.models import Cluster
    from nodepools.models import NodePool

    drive_cluster(cluster_id)
    pool_id = new_pool(owner, cluster_id)
    drive_pool(pool_id)
    owner.delete(f"/api/v1/clusters/{cluster_id}")
    assert reconcile_cluster(cluster_id) == 1.0
    assert phase(NodePool, pool_id) == "DELETING"
    assert_idempotent(reconcile_cluster, cluster_id)  # still waiting: nothing changes
    drive_pool(pool_id)
    assert reconcile_cluster(cluster_id) is None
    assert phase(Cluster, cluster_id) == "DELETED"
    assert_idempotent(reconcile_cluster, cluster_id)


def test_tasks_skip_rows_that_are_gone():
    from clusters.tasks import reconcile_cluster as cluster_task
    from nodepools.tasks import reconcile_nodepool as pool_task

    missing = "00000000-0000-0000-0000-000000000000"
    assert cluster_task.run(missing) is None
    assert pool_task.run(missing) is None


def test_cluster_provider_outage_backs_off_then_recovers(cluster_id, settings):
    """A retryable outage backs off 1, 2, 4 s with the attempt named; once it is over the
    cluster goes RUNNING and the retry clock is cleared."""
    from datetime import timedelta

    from django.utils import timezone

    from clusters.models import Cluster, Operation

    settings.NVKE_SIMULATED_CONTROL_PLANE_OUTAGE = ["c1"]
    settings.NVKE_PROVIDER_RETRY_DEADLINE_S = 600
    t0 = timezone.now()
    delays = [reconcile_cluster(cluster_id, now=t0 + timedelta(seconds=s)) for s in (0, 1, 3)]
    assert delays == [1.0, 2.0, 4.0]
    cluster = Cluster.objects.get(pk=cluster_id)
    assert (cluster.phase, cluster.reconcile_failures) == ("PROVISIONING", 3)
    assert cluster.reconcile_retry_since == t0
    ready = next(c for c in cluster.conditions if c["type"] == "Ready")
    assert ready["reason"] == "ProviderRetrying"
    assert ready["message"].startswith("attempt 3 failed, retrying in 4 s:")
    assert "503" in ready["message"]
    settings.NVKE_SIMULATED_CONTROL_PLANE_OUTAGE = []
    assert reconcile_cluster(cluster_id, now=t0 + timedelta(seconds=7)) is None
    cluster.refresh_from_db()
    assert (cluster.phase, cluster.reconcile_failures, cluster.reconcile_retry_since) == (
        "RUNNING",
        0,
        None,
    )
    assert Operation.objects.get(target_id=cluster_id).status == "DONE"


def test_cluster_provider_outage_past_the_deadline_is_an_error_naming_it(cluster_id, settings):
    """The cluster reconciler gives up on the node pools' deadline, not after a fixed count:
    attempts at 0, 1, 3, 7, 15, 31, 63 s go on (63 s < 100 s; the backoff is capped at 60 s),
    the one at 123 s gives up."""
    from datetime import timedelta

    from django.utils import timezone

    from clusters.models import Cluster, Operation

    settings.NVKE_SIMULATED_CONTROL_PLANE_OUTAGE = ["*"]
    settings.NVKE_PROVIDER_RETRY_DEADLINE_S = 100
    t0, at = timezone.now(), 0.0
    delays = []
    while (delay := reconcile_cluster(cluster_id, now=t0 + timedelta(seconds=at))) is not None:
        delays.append(delay)
        at += delay
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]
    assert at == 123
    cluster = Cluster.objects.get(pk=cluster_id)
    assert cluster.phase == "ERROR"
    ready = next(c for c in cluster.conditions if c["type"] == "Ready")
    assert ready["reason"] == "ProviderError"
    assert ready["message"].startswith("gave up after 8 attempt(s) over 123 s (deadline 100 s)")
    op = Operation.objects.get(target_id=cluster_id)
    assert op.status == "FAILED"
    assert op.error["code"] == "infrastructure_unavailable"
    assert op.error["retryable"] is True
    assert_idempotent(reconcile_cluster, cluster_id)
