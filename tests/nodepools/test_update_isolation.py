"""Changing a pool's isolation: PATCH answers 202 with an UPDATE_ISOLATION operation; the
reconciler drains, repartitions and validates one node at a time, shows each node's per-GPU
layout, and rolls back when a node fails validation. ``?dry_run=true`` changes nothing.

Hosts are SIMULATED INFRASTRUCTURE (``make_host``); the simulated provider "creates" MIG
devices with the catalog's placement rules and fails GPUs listed in
``NVKE_SIMULATED_FAILING_GPUS``.
"""

from __future__ import annotations

import pytest

from tests.helpers import drive_cluster, drive_pool, snapshot

pytestmark = pytest.mark.django_db

SINGLE = {"mode": "mig", "mig_profile": "1g.10gb"}
BALANCED = {"mode": "mig", "mig_layout": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}


@pytest.fixture
def pool(owner, make_host):
    """Tenant A's RUNNING pool: 2 nodes x 2 H100-80GB GPUs, MIG 1g.10gb x7 on every GPU."""
    make_host("h100-sxm5-80gb", gpus=2)
    make_host("h100-sxm5-80gb", gpus=2)
    cluster = owner.post(
        "/api/v1/clusters",
        {"name": "c1", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    ).json()["target_id"]
    drive_cluster(cluster)
    op = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {
            "name": "mig",
            "gpu_model": "h100-sxm5-80gb",
            "gpus_per_node": 2,
            "node_count": 2,
            "isolation": SINGLE,
        },
        format="json",
    ).json()
    drive_pool(op["target_id"])
    return {
        "cluster": cluster,
        "id": op["target_id"],
        "url": f"/api/v1/clusters/{cluster}/nodepools/{op['target_id']}",
    }


def nodes(pool_id):
    from nodepools.models import Node

    return list(Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name"))


def step_until_done(pool_id, max_steps=40):
    """Reconcile one step at a time; returns the phases of the nodes after every step."""
    from nodepools.reconcile import reconcile_nodepool

    history = []
    for _ in range(max_steps):
        delay = reconcile_nodepool(pool_id)
        history.append([n.phase for n in nodes(pool_id)])
        if delay is None:
            return history
    raise AssertionError("did not converge")


def profiles(layout):
    return sorted(d["profile"] for d in layout)


def test_new_nodes_show_their_validated_per_gpu_layout(owner, pool):
    body = owner.get(f"{pool['url']}/gpu-config").json()
    assert body["isolation"] == SINGLE
    assert [p["start"] for p in body["gpu_config"]["mig_layout"]] == [0, 1, 2, 3, 4, 5, 6]
    for node in body["nodes"]:
        assert node["phase"] == "READY" and node["config_state"] == ""
        assert len(node["gpu_layout"]) == 2  # one entry per GPU
        for gpu in node["gpu_layout"]:
            assert gpu["gpu_uuid"].startswith("GPU-sim-")
            assert profiles(gpu["mig_devices"]) == ["1g.10gb"] * 7


def test_update_drains_repartitions_and_validates_node_by_node(owner, pool):
    from nodepools.reconcile import reconcile_nodepool

    before = {n.name: n.applied_config for n in nodes(pool["id"])}
    resp = owner.patch(pool["url"], {"isolation": BALANCED}, format="json")
    assert resp.status_code == 202, resp.content
    op = resp.json()
    assert (op["type"], op["status"], op["progress"]["total"]) == ("UPDATE_ISOLATION", "PENDING", 2)
    assert owner.get(pool["url"]).json()["phase"] == "RECONCILING"
    history = step_until_done(pool["id"])
    # never all at once: at most one node out of service after every step
    assert all(sum(p != "READY" for p in phases) <= 1 for phases in history)
    # each node went DRAINING -> CORDONED -> READY in turn: 2 nodes x 3 steps + the final one
    assert history[:6] == [
        ["DRAINING", "READY"],
        ["CORDONED", "READY"],
        ["READY", "READY"],
        ["READY", "DRAINING"],
        ["READY", "CORDONED"],
        ["READY", "READY"],
    ]
    body = owner.get(f"{pool['url']}/gpu-config").json()
    assert body["isolation"] == {
        "mode": "mig",
        "mig_layout": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
    }
    assert body["rollout"] == {}
    for node in body["nodes"]:
        for gpu in node["gpu_layout"]:
            assert sorted((d["profile"], d["start"]) for d in gpu["mig_devices"]) == [
                ("1g.10gb", 2),
                ("1g.10gb", 3),
                ("2g.20gb", 0),
                ("3g.40gb", 4),
            ]
    after = {n.name: n.applied_config for n in nodes(pool["id"])}
    assert set(after) == set(before) and all(after[k] != before[k] for k in after)
    op = owner.get(f"/api/v1/operations/{op['id']}").json()
    assert (op["status"], op["error"]) == ("DONE", None)
    assert op["progress"] == {"done": 2, "total": 2, "stage": "done"}
    listed = owner.get(pool["url"]).json()
    assert (listed["phase"], listed["observed_generation"], listed["generation"]) == (
        "RUNNING",
        2,
        2,
    )
    updated = next(c for c in listed["conditions"] if c["type"] == "IsolationUpdated")
    assert updated["status"] == "True"
    # converged: more calls change nothing
    frozen = snapshot()
    assert reconcile_nodepool(pool["id"]) is None
    assert reconcile_nodepool(pool["id"]) is None
    assert snapshot() == frozen


def test_a_node_failing_validation_rolls_every_changed_node_back(owner, pool, settings):
    first, second = nodes(pool["id"])
    original = first.applied_config
    # MIG Manager fails on one GPU of the second node for the new layout only
    settings.NVKE_SIMULATED_FAILING_GPUS = {second.gpu_uuids[1]: ["nvke-mig"]}
    op = owner.patch(pool["url"], {"isolation": BALANCED}, format="json").json()
    history = step_until_done(pool["id"])
    assert all(sum(p != "READY" for p in phases) <= 1 for phases in history)
    # first node updated; second drained, reconfigured, failed -> rollback: the second (still
    # drained) is put back first, then the first node
    assert history[:11] == [
        ["DRAINING", "READY"],
        ["CORDONED", "READY"],
        ["READY", "READY"],
        ["READY", "DRAINING"],
        ["READY", "CORDONED"],
        ["READY", "CORDONED"],  # validation failed: rollback starts with this (drained) node
        ["READY", "CORDONED"],  # the previous config applied again
        ["READY", "READY"],
        ["DRAINING", "READY"],
        ["CORDONED", "READY"],
        ["READY", "READY"],
    ]
    op = owner.get(f"/api/v1/operations/{op['id']}").json()
    assert op["status"] == "FAILED"
    assert op["error"]["code"] == "isolation_validation_failed"
    assert f"node {second.name} failed validation" in op["error"]["message"]
    assert second.gpu_uuids[1] in op["error"]["message"]
    body = owner.get(f"{pool['url']}/gpu-config").json()
    assert body["isolation"] == SINGLE and body["rollout"] == {}
    assert {n.applied_config for n in nodes(pool["id"])} == {original}
    for node in body["nodes"]:
        assert node["phase"] == "READY"
        for gpu in node["gpu_layout"]:
            assert profiles(gpu["mig_devices"]) == ["1g.10gb"] * 7
    pool_body = owner.get(pool["url"]).json()
    assert pool_body["phase"] == "RUNNING"
    rolled = next(c for c in pool_body["conditions"] if c["type"] == "IsolationUpdated")
    assert (rolled["status"], rolled["reason"]) == ("False", "RolledBack")


def test_a_failing_rollback_leaves_the_pool_degraded(owner, pool, settings):
    first, _ = nodes(pool["id"])
    settings.NVKE_SIMULATED_FAILING_GPUS = [first.gpu_uuids[0]]  # broken both ways
    op = owner.patch(pool["url"], {"isolation": BALANCED}, format="json").json()
    step_until_done(pool["id"])
    op = owner.get(f"/api/v1/operations/{op['id']}").json()
    assert (op["status"], op["error"]["code"]) == ("FAILED", "isolation_rollback_failed")
    body = owner.get(pool["url"]).json()
    assert body["phase"] == "DEGRADED"
    assert [n["phase"] for n in body["nodes"]] == ["NOT_READY", "READY"]
    ready = next(c for c in body["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "IsolationRollbackFailed")
    # it stays so (the broken node needs an operator), however often it is reconciled
    from nodepools.reconcile import reconcile_nodepool

    frozen = snapshot()
    assert reconcile_nodepool(pool["id"]) is None
    assert snapshot() == frozen


def test_sharing_change_without_mig_drains_but_does_not_repartition(owner, make_host):
    make_host("l40s", gpus=2)
    cluster = owner.post(
        "/api/v1/clusters",
        {"name": "c2", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    ).json()["target_id"]
    drive_cluster(cluster)
    op = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {
            "name": "ts",
            "gpu_model": "l40s",
            "gpus_per_node": 2,
            "node_count": 1,
            "isolation": {"mode": "time-slicing", "replicas": 4},
        },
        format="json",
    ).json()
    drive_pool(op["target_id"])
    url = f"/api/v1/clusters/{cluster}/nodepools/{op['target_id']}"
    dry = owner.patch(
        f"{url}?dry_run=true", {"isolation": {"mode": "time-slicing", "replicas": 8}}, format="json"
    )
    assert dry.status_code == 200
    (node,) = dry.json()["disruption"]["nodes"]
    assert (node["drain"], node["repartition"], node["gpus"]) == (True, False, 2)
    assert dry.json()["gpu_config"]["resources"] == {"nvidia.com/gpu": 16}
    assert (
        owner.patch(
            url, {"isolation": {"mode": "time-slicing", "replicas": 8}}, format="json"
        ).status_code
        == 202
    )
    drive_pool(op["target_id"])
    (gpu_a, gpu_b) = owner.get(f"{url}/gpu-config").json()["nodes"][0]["gpu_layout"]
    assert gpu_a["sharing"] == gpu_b["sharing"] == {"strategy": "time-slicing", "replicas": 8}


def test_dry_run_update_changes_nothing_and_names_the_disruption(owner, pool):
    frozen = snapshot()
    resp = owner.patch(f"{pool['url']}?dry_run=true", {"isolation": BALANCED}, format="json")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["dry_run"] is True
    assert body["isolation"] == {
        "mode": "mig",
        "mig_layout": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
    }
    assert body["gpu_config"]["resources"] == {
        "nvidia.com/mig-3g.40gb": 2,
        "nvidia.com/mig-2g.20gb": 2,
        "nvidia.com/mig-1g.10gb": 4,
    }
    assert body["disruption"] == {
        "nodes": [
            {"name": n.name, "drain": True, "repartition": True, "gpus": 2}
            for n in nodes(pool["id"])
        ],
        "drain": 2,
        "repartition": 2,
        "max_unavailable": 1,
    }
    assert snapshot() == frozen


def test_dry_run_create_changes_nothing(owner, pool):
    frozen = snapshot()
    resp = owner.post(
        f"/api/v1/clusters/{pool['cluster']}/nodepools?dry_run=true",
        {
            "name": "nvl",
            "gpu_model": "h100-sxm5-80gb",
            "gpus_per_node": 1,
            "node_count": 3,
            "isolation": {"mode": "mig", "mig_layout": {"4g.40gb": 1, "3g.40gb": 1}},
        },
        format="json",
    )
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["disruption"] == {"nodes": [], "drain": 0, "repartition": 0, "provision": 3}
    assert body["gpu_config"]["labels"]["nvidia.com/mig.config"] == "nvke-nvl"
    assert snapshot() == frozen
    # a refused policy is refused in a dry run too
    bad = owner.post(
        f"/api/v1/clusters/{pool['cluster']}/nodepools?dry_run=true",
        {
            "name": "x",
            "gpu_model": "l40s",
            "gpus_per_node": 1,
            "node_count": 1,
            "isolation": SINGLE,
        },
        format="json",
    )
    assert (bad.status_code, bad.json()["code"]) == (400, "mig_not_supported")


def test_refused_updates(owner, viewer, pool):
    resp = owner.patch(
        pool["url"],
        {"isolation": {"mode": "mig", "mig_layout": {"4g.40gb": 1, "3g.40gb": 2}}},
        format="json",
    )
    assert resp.status_code == 400
    assert resp["Content-Type"] == "application/problem+json"
    assert (resp.json()["code"], resp.json()["field"]) == (
        "mig_layout_does_not_fit",
        "isolation.mig_layout",
    )
    resp = owner.patch(
        pool["url"], {"isolation": {"mode": "mig", "mig_profile": "1g.10gb"}}, format="json"
    )
    assert (resp.status_code, resp.json()["code"]) == (409, "isolation_unchanged")
    resp = owner.patch(pool["url"], {"isolation": BALANCED, "node_count": 5}, format="json")
    assert (resp.status_code, resp.json()["code"], resp.json()["field"]) == (
        400,
        "field_not_updatable",
        "node_count",
    )
    assert viewer.patch(pool["url"], {"isolation": BALANCED}, format="json").status_code == 403
    assert owner.patch(pool["url"], {"isolation": BALANCED}, format="json").status_code == 202
    # a second change while the first runs
    resp = owner.patch(pool["url"], {"isolation": SINGLE}, format="json")
    assert (resp.status_code, resp.json()["code"]) == (409, "nodepool_not_running")


def test_if_match_guards_against_a_lost_update(owner, pool):
    resp = owner.patch(pool["url"], {"isolation": BALANCED}, format="json", HTTP_IF_MATCH='"stale"')
    assert (resp.status_code, resp.json()["code"]) == (412, "precondition_failed")
    etag = owner.get(pool["url"])["ETag"]
    assert (
        owner.patch(
            pool["url"], {"isolation": BALANCED}, format="json", HTTP_IF_MATCH=etag
        ).status_code
        == 202
    )


def test_update_is_audited(owner, pool):
    from tenants.models import AuditEvent

    owner.patch(pool["url"], {"isolation": BALANCED}, format="json")
    event = AuditEvent.objects.get(action="nodepool.update_isolation")
    assert event.before == {"isolation": SINGLE}
    assert event.after == {
        "isolation": {"mode": "mig", "mig_layout": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}
    }


def test_a_provider_that_cannot_reconfigure_nodes_fails_the_update_cleanly(
    owner, pool, monkeypatch
):
    from clusters.providers.base import Provider
    from clusters.providers.simulated import SimulatedProvider

    # the interface's own default: a provider without node reconfiguration
    monkeypatch.setattr(SimulatedProvider, "drain_node", Provider.drain_node)
    op = owner.patch(pool["url"], {"isolation": BALANCED}, format="json").json()
    history = step_until_done(pool["id"])
    assert history == [["READY", "READY"]]
    op = owner.get(f"/api/v1/operations/{op['id']}").json()
    assert (op["status"], op["error"]["code"]) == ("FAILED", "not_supported")
    body = owner.get(pool["url"]).json()
    assert (body["phase"], body["isolation"], body["rollout"]) == ("RUNNING", SINGLE, {})
