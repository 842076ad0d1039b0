"""Rolling node upgrades (UPGRADE_NODES): Kubernetes and driver versions node by node, the
version skew policy, blocked drains that pause the rollout, maintenance windows, surge."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.helpers import drive_cluster, drive_pool, running_h100_pool

pytestmark = pytest.mark.django_db

BLOCKER = "default/trainer-0 (PodDisruptionBudget trainer allows 0 disruptions)"


@pytest.fixture
def pool(owner, make_host):
    return running_h100_pool(owner, make_host, hosts=4, nodes=3)


def url(pool, suffix=""):
    cluster, pool_id = pool
    return f"/api/v1/clusters/{cluster}/nodepools/{pool_id}{suffix}"


def step_until_done(pool_id, max_steps=60, now=None, watch=None):
    from nodepools.reconcile import reconcile_nodepool

    for _ in range(max_steps):
        if watch:
            watch()
        if reconcile_nodepool(pool_id, now=now) is None:
            return
    raise AssertionError("did not converge")


def test_nodes_cannot_overtake_the_control_plane(owner, pool):
    resp = owner.post(url(pool, "/upgrade"), {"kubernetes_version": "1.37"})
    assert (resp.status_code, resp.json()["code"]) == (400, "version_skew")
    assert resp.json()["detail"] == "nodes cannot be newer than the control plane (1.37 > 1.36)"


def test_kubernetes_upgrade_rolls_one_node_at_a_time(owner, pool):
    from nodepools.models import Node

    cluster, pool_id = pool
    owner.patch(f"/api/v1/clusters/{cluster}", {"kubernetes_version": "1.37"})
    drive_cluster(cluster)
    op = owner.post(url(pool, "/upgrade"), {"kubernetes_version": "1.37"}).json()
    assert op["type"] == "UPGRADE_NODES"
    out_of_service = []

    def watch():
        out_of_service.append(
            Node.objects.filter(nodepool_id=pool_id).exclude(phase="READY").count()
        )

    step_until_done(pool_id, watch=watch)
    assert max(out_of_service) == 1  # max_unavailable = 1
    assert set(
        Node.objects.filter(nodepool_id=pool_id).values_list("kubernetes_version", "phase")
    ) == {("1.37", "READY")}
    assert owner.get(f"/api/v1/operations/{op['id']}").json()["status"] == "DONE"
    assert owner.get(url(pool)).json()["phase"] == "RUNNING"


def test_a_bare_minor_is_the_control_planes_patch_release(owner, pool):
    """Issue 33 (D3): a pool upgraded to ``1.36`` under a control plane at ``1.36.3`` (the
    hosted provider's version, the patch its binaries pin) stores ``1.36.3`` on the pool and
    its nodes, the version their kubelets report; asked again, there is nothing to upgrade."""
    from clusters.models import Cluster
    from nodepools.models import Node, NodePool
    from nodepools.tenant_nodes import cluster_tenant_nodes

    cluster, pool_id = pool
    Cluster.objects.filter(pk=cluster).update(control_plane_version="1.36.3")
    assert set(Node.objects.filter(nodepool_id=pool_id).values_list("kubernetes_version")) == {
        ("1.36",)  # booted while the control plane said its minor
    }
    op = owner.post(url(pool, "/upgrade"), {"kubernetes_version": "1.36"})
    assert op.status_code == 202, op.content
    step_until_done(pool_id)
    assert NodePool.objects.get(pk=pool_id).kubernetes_version == "1.36.3"
    assert set(
        Node.objects.filter(nodepool_id=pool_id).values_list("kubernetes_version", "phase")
    ) == {("1.36.3", "READY")}
    assert {n.kubelet_version for n in cluster_tenant_nodes(cluster)} == {"v1.36.3"}
    nodes = owner.get(url(pool)).json()["nodes"]
    assert [n["kubernetes_version"] for n in nodes] == ["1.36.3"] * 3
    again = owner.post(url(pool, "/upgrade"), {"kubernetes_version": "1.36"})
    assert (again.status_code, again.json()["code"]) == (400, "nothing_to_upgrade")


def test_a_blocked_drain_pauses_the_rollout_names_the_pods_and_force_resumes(owner, pool):
    from clusters.providers.simulated import simulate_drain_blockers
    from nodepools.models import Node
    from nodepools.reconcile import reconcile_nodepool

    _, pool_id = pool
    first = Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name").first()
    simulate_drain_blockers(first.id, [BLOCKER])
    try:
        op = owner.post(
            url(pool, "/upgrade"), {"driver_version": "580.95.05", "drain_timeout_s": 300}
        ).json()
        t0 = timezone.now()
        assert reconcile_nodepool(pool_id, now=t0) == 2.0  # draining, blocked, within timeout
        assert reconcile_nodepool(pool_id, now=t0 + timedelta(seconds=299)) == 2.0
        assert reconcile_nodepool(pool_id, now=t0 + timedelta(seconds=301)) is None  # paused
        body = owner.get(url(pool)).json()
        blocked = next(c for c in body["conditions"] if c["type"] == "UpgradeBlocked")
        assert blocked["status"] == "True" and BLOCKER in blocked["message"]
        states = dict(Node.objects.filter(nodepool_id=pool_id).values_list("name", "upgrade_state"))
        assert states[first.name] == "drain-blocked"
        assert sorted(states.values()) == ["", "", "drain-blocked"]  # the next node did not start
        op_now = owner.get(f"/api/v1/operations/{op['id']}").json()
        assert op_now["status"] == "RUNNING" and op_now["progress"]["stage"].startswith("paused")
        assert reconcile_nodepool(pool_id, now=t0 + timedelta(seconds=400)) is None  # stays put
        assert owner.post(url(pool, "/resume-upgrade"), {"force": True}).status_code == 200
        step_until_done(pool_id)
    finally:
        simulate_drain_blockers(first.id, [])
    assert set(
        Node.objects.filter(nodepool_id=pool_id).values_list("driver_version", flat=True)
    ) == {"580.95.05"}
    assert owner.get(f"/api/v1/operations/{op['id']}").json()["status"] == "DONE"


def test_upgrades_wait_for_the_maintenance_window_unless_urgent(owner, pool):
    from nodepools.models import Node
    from nodepools.reconcile import reconcile_nodepool

    cluster, pool_id = pool
    now = timezone.now()
    closed_day = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"][(now.weekday() + 3) % 7]
    owner.patch(
        f"/api/v1/clusters/{cluster}",
        {
            "maintenance_policy": {
                "windows": [{"days": [closed_day], "start": "00:00", "end": "23:59"}]
            }
        },
    )
    owner.post(url(pool, "/upgrade"), {"driver_version": "580.95.05"})
    delay = reconcile_nodepool(pool_id, now=now)
    assert 0 < delay <= 300
    assert not Node.objects.filter(nodepool_id=pool_id).exclude(upgrade_state="").exists()
    condition = next(
        c for c in owner.get(url(pool)).json()["conditions"] if c["type"] == "Upgrading"
    )
    assert condition["reason"] == "WaitingForMaintenanceWindow"


def test_urgent_upgrades_ignore_the_window(owner, pool):
    from nodepools.models import Node

    cluster, pool_id = pool
    now = timezone.now()
    closed_day = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"][(now.weekday() + 3) % 7]
    owner.patch(
        f"/api/v1/clusters/{cluster}",
        {
            "maintenance_policy": {
                "windows": [{"days": [closed_day], "start": "00:00", "end": "23:59"}]
            }
        },
    )
    owner.post(url(pool, "/upgrade"), {"driver_version": "580.95.05", "urgent": True})
    step_until_done(pool_id)
    assert set(
        Node.objects.filter(nodepool_id=pool_id).values_list("driver_version", flat=True)
    ) == {"580.95.05"}


def test_surge_adds_capacity_first_and_removes_it_at_the_end(owner, pool):
    from nodepools.models import Node

    _, pool_id = pool
    owner.post(url(pool, "/upgrade"), {"driver_version": "580.95.05", "max_surge": 1})
    live_counts = []

    def watch():
        live_counts.append(
            Node.objects.filter(nodepool_id=pool_id).exclude(phase__in=["DELETED"]).count()
        )

    step_until_done(pool_id, watch=watch)
    assert max(live_counts) == 4  # 3 nodes + 1 surge (4 hosts in the fleet)
    live = Node.objects.filter(nodepool_id=pool_id).exclude(phase="DELETED")
    assert live.count() == 3
    assert set(live.values_list("driver_version", flat=True)) == {"580.95.05"}


def test_cancelling_an_upgrade_stops_it(owner, pool):
    from nodepools.reconcile import reconcile_nodepool

    _, pool_id = pool
    op = owner.post(url(pool, "/upgrade"), {"driver_version": "580.95.05"}).json()
    reconcile_nodepool(pool_id)  # the first node starts draining
    assert owner.post(f"/api/v1/operations/{op['id']}/cancel").json()["status"] == "CANCELLED"
    drive_pool(pool_id)
    body = owner.get(url(pool)).json()
    assert body["phase"] == "RUNNING"
    assert {n["phase"] for n in body["nodes"]} == {"READY"}


@pytest.mark.parametrize(
    "isolation",
    [
        {"mode": "mig", "mig_layout": {"1g.12gb+me": 1, "3g.47gb": 1}},
        {"mode": "mig", "mig_profile": "1g.12gb+me"},
    ],
)
def test_media_extension_profiles_render_valid_label_values(catalog, isolation):
    """A review found ``…-MIG-1g.12gb+me`` in a label value: '+' is not allowed there, and
    kubelet refuses to start with an invalid --node-labels value."""
    import re

    from catalog.models import GpuModel
    from nodepools.gpu_config import render_gpu_config

    config = render_gpu_config(
        gpu_model=GpuModel.objects.get(slug="h100-nvl-94gb"),
        gpus_per_node=1,
        isolation=isolation,
        pool_name="p",
    )
    value = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
    bad = {k: v for k, v in config["labels"].items() if len(v) > 63 or not value.fullmatch(v)}
    assert bad == {}
    assert "1g.12gb.me" in " ".join(config["labels"].values())


def test_force_on_resume_only_overrides_the_paused_nodes_blockers(owner, pool):
    """Review finding: force stayed on and later nodes' disruption budgets were ignored."""
    from clusters.providers.simulated import simulate_drain_blockers
    from nodepools.models import Node
    from nodepools.reconcile import reconcile_nodepool

    _, pool_id = pool
    first, second, _ = Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name")
    simulate_drain_blockers(first.id, [BLOCKER])
    simulate_drain_blockers(second.id, ["default/trainer-1 (PDB trainer allows 0 disruptions)"])
    try:
        owner.post(url(pool, "/upgrade"), {"driver_version": "580.95.05", "drain_timeout_s": 10})
        t0 = timezone.now()
        reconcile_nodepool(pool_id, now=t0)
        assert reconcile_nodepool(pool_id, now=t0 + timedelta(seconds=11)) is None  # paused
        owner.post(url(pool, "/resume-upgrade"), {"force": True})
        for step in range(10):
            if reconcile_nodepool(pool_id, now=t0 + timedelta(seconds=20 + 11 * step)) is None:
                break
        body = owner.get(url(pool)).json()
        assert body["upgrade"]["blocked"]["node"] == second.name  # paused again, on node 2
        blocked = next(c for c in body["conditions"] if c["type"] == "UpgradeBlocked")
        assert "trainer-1" in blocked["message"]
    finally:
        simulate_drain_blockers(first.id, [])
        simulate_drain_blockers(second.id, [])


def test_cancelling_before_any_node_upgraded_restores_the_versions(owner, pool):
    """Review finding: the pool kept claiming the new version its nodes did not run."""
    from nodepools.models import NodePool

    _, pool_id = pool
    before = owner.get(url(pool)).json()["driver_version"]
    op = owner.post(url(pool, "/upgrade"), {"driver_version": "580.95.05"}).json()
    owner.post(f"/api/v1/operations/{op['id']}/cancel")
    drive_pool(pool_id)
    pool_row = NodePool.objects.get(pk=pool_id)
    assert (pool_row.driver_version, pool_row.upgrade) == (before, {})
    assert owner.post(url(pool, "/upgrade"), {"driver_version": "580.95.05"}).status_code == 202


def test_scale_down_waits_for_blocked_drains_then_evicts(owner, pool, settings):
    """Review finding: scale-down removed a node whose pods a budget protected."""
    from clusters.providers.simulated import simulate_drain_blockers
    from nodepools.models import Node, NodePool
    from nodepools.reconcile import reconcile_nodepool

    _, pool_id = pool
    settings.NVKE_SCALE_DOWN_DRAIN_TIMEOUT_S = 60
    newest = Node.objects.filter(nodepool_id=pool_id).order_by("-created_at", "-name").first()
    simulate_drain_blockers(newest.id, [BLOCKER])
    try:
        op = owner.post(url(pool, "/set-size"), {"node_count": 2}).json()
        t0 = timezone.now()
        assert reconcile_nodepool(pool_id, now=t0) == 2.0
        assert Node.objects.get(pk=newest.pk).phase == "DRAINING"
        # a scale-down's progress counts the nodes it removes: 3 -> 2 removes 1, none yet
        # (a trial read "2/2" here, the nodes left, and "0/0 done" for 1 -> 0)
        progress = owner.get(f"/api/v1/operations/{op['id']}").json()["progress"]
        assert (progress["done"], progress["total"]) == (0, 1)
        assert progress["stage"].startswith(f"removing 1 node(s): {newest.name}: ")
        cond = next(
            c
            for c in NodePool.objects.get(pk=pool_id).conditions
            if c["type"] == "ScaleDownBlocked"
        )
        assert cond["status"] == "True" and "trainer-0" in cond["message"]
        for step in range(5):
            if reconcile_nodepool(pool_id, now=t0 + timedelta(seconds=61 + step)) is None:
                break
        assert Node.objects.get(pk=newest.pk).phase == "DELETED"
        done = owner.get(f"/api/v1/operations/{op['id']}").json()
        assert (done["status"], done["progress"]["done"], done["progress"]["total"]) == (
            "DONE",
            1,
            1,
        )
        # down to 0: its 2 nodes removed, "2/2", not "0/0"
        zero = owner.post(url(pool, "/set-size"), {"node_count": 0}).json()
        assert zero["progress"]["total"] == 2
        for step in range(10):
            if reconcile_nodepool(pool_id, now=t0 + timedelta(seconds=80 + step)) is None:
                break
        done = owner.get(f"/api/v1/operations/{zero['id']}").json()
        assert (done["status"], done["progress"]["done"], done["progress"]["total"]) == (
            "DONE",
            2,
            2,
        )
    finally:
        simulate_drain_blockers(newest.id, [])
