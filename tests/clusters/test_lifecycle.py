"""Cluster lifecycle: control plane upgrades with the version skew policy, one operation at a
time, cancel, credential rotation, end-of-life conditions, maintenance windows."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from tests.helpers import drive_cluster, drive_pool

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(owner, import_capture):
    import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b")
    op = owner.post(
        "/api/v1/clusters", {"name": "c1", "kubernetes_version": "1.36", "region": "us-east-1"}
    ).json()
    drive_cluster(op["target_id"])
    return op["target_id"]


def test_control_plane_upgrades_one_minor_at_a_time(owner, cluster):
    body = owner.get(f"/api/v1/clusters/{cluster}").json()
    assert (body["control_plane_version"], body["available_upgrades"]) == ("1.36", ["1.37"])
    for target, code in (("1.35", "invalid_upgrade"), ("1.38", "unsupported_kubernetes_version")):
        resp = owner.patch(f"/api/v1/clusters/{cluster}", {"kubernetes_version": target})
        assert (resp.status_code, resp.json()["code"]) == (400, code), target
    op = owner.patch(f"/api/v1/clusters/{cluster}", {"kubernetes_version": "1.37"}).json()
    assert op["type"] == "UPGRADE_CONTROL_PLANE"
    assert owner.get(f"/api/v1/clusters/{cluster}").json()["phase"] == "RECONCILING"
    drive_cluster(cluster)
    body = owner.get(f"/api/v1/clusters/{cluster}").json()
    assert (body["phase"], body["control_plane_version"], body["observed_generation"]) == (
        "RUNNING",
        "1.37",
        2,
    )
    assert owner.get(f"/api/v1/operations/{op['id']}").json()["status"] == "DONE"


def test_one_mutating_operation_per_cluster(owner, cluster):
    first = owner.patch(f"/api/v1/clusters/{cluster}", {"kubernetes_version": "1.37"}).json()
    resp = owner.post(f"/api/v1/clusters/{cluster}/rotate-credentials")
    assert resp.status_code == 409
    assert resp.json()["code"] == "operation_in_progress"
    assert resp.json()["operation_id"] == first["id"]
    # cancelling the upgrade puts the spec back on the version the control plane runs
    cancelled = owner.post(f"/api/v1/operations/{first['id']}/cancel").json()
    assert cancelled["status"] == "CANCELLED"
    drive_cluster(cluster)
    body = owner.get(f"/api/v1/clusters/{cluster}").json()
    assert (body["kubernetes_version"], body["control_plane_version"]) == ("1.36", "1.36")
    again = owner.post(f"/api/v1/operations/{first['id']}/cancel")
    assert (again.status_code, again.json()["code"]) == (409, "operation_finished")


def test_credential_rotation_issues_a_new_kubeconfig(owner, cluster):
    before = owner.get(f"/api/v1/clusters/{cluster}/kubeconfig").content
    op = owner.post(f"/api/v1/clusters/{cluster}/rotate-credentials").json()
    assert op["type"] == "ROTATE_CREDENTIALS"
    assert owner.get(f"/api/v1/clusters/{cluster}/kubeconfig").status_code == 409  # not yet
    drive_cluster(cluster)
    after = owner.get(f"/api/v1/clusters/{cluster}/kubeconfig").content
    assert after != before and b"token: " in after
    assert owner.get(f"/api/v1/operations/{op['id']}").json()["status"] == "DONE"


def test_end_of_life_versions_get_a_condition_and_an_upgrade_offer(cluster):
    from clusters.models import Cluster
    from clusters.reconcile import refresh_version_conditions

    # 1.36 reaches end of life on 2027-06-28 (catalog): pretend it is July 2027
    Cluster.objects.filter(pk=cluster).update(control_plane_version="1.36")
    assert refresh_version_conditions(datetime(2027, 7, 1, tzinfo=UTC)) == 1
    eol = next(
        c for c in Cluster.objects.get(pk=cluster).conditions if c["type"] == "VersionEndOfLife"
    )
    assert eol["status"] == "True"
    assert eol["message"] == "Kubernetes 1.36 reached end of life on 2027-06-28; upgrade to 1.37"
    assert refresh_version_conditions(datetime(2027, 7, 2, tzinfo=UTC)) == 0  # unchanged


def test_node_pools_block_upgrades_that_break_the_skew(owner, cluster):
    from clusters.versions import node_version_problem

    assert node_version_problem("1.37", "1.34") is None
    assert node_version_problem("1.37", "1.33") == (
        "nodes may be at most 3 minor versions older than the control plane (1.33 under 1.37)"
    )
    assert node_version_problem("1.36", "1.37") == (
        "nodes cannot be newer than the control plane (1.37 > 1.36)"
    )


def test_maintenance_windows_follow_the_time_zone_and_dst():
    from clusters.maintenance import in_window, next_window_start, validate_policy

    policy = validate_policy(
        {
            "time_zone": "Europe/Berlin",
            "windows": [{"days": ["sun"], "start": "02:00", "end": "05:00"}],
            "exclusions": [{"start": "2026-12-20T00:00:00Z", "end": "2027-01-04T00:00:00Z"}],
        }
    )
    # 2026-03-29 is the night Berlin moves from CET (+01) to CEST (+02): 02:00 local does not
    # exist; the window opens at 03:00 CEST = 01:00 UTC and closes 05:00 CEST = 03:00 UTC
    assert not in_window(policy, datetime(2026, 3, 29, 0, 30, tzinfo=UTC))
    assert in_window(policy, datetime(2026, 3, 29, 1, 30, tzinfo=UTC))
    assert not in_window(policy, datetime(2026, 3, 29, 3, 0, tzinfo=UTC))
    # a winter Sunday: 02:00-05:00 CET = 01:00-04:00 UTC
    assert in_window(policy, datetime(2026, 11, 29, 3, 59, tzinfo=UTC))
    assert not in_window(policy, datetime(2026, 11, 29, 4, 0, tzinfo=UTC))
    # inside the exclusion nothing starts, and the next start is the first Sunday after it
    assert not in_window(policy, datetime(2026, 12, 27, 2, 0, tzinfo=UTC))
    assert next_window_start(policy, datetime(2026, 12, 22, tzinfo=UTC)) == datetime(
        2027, 1, 10, 1, 0, tzinfo=UTC
    )
    assert date(2027, 1, 10).weekday() == 6


def test_maintenance_policy_is_validated_and_applied_at_once(owner, cluster):
    bad = owner.patch(
        f"/api/v1/clusters/{cluster}",
        {"maintenance_policy": {"time_zone": "Mars/Olympus", "windows": []}},
    )
    assert (bad.status_code, bad.json()["field"]) == (400, "maintenance_policy.time_zone")
    policy = {"time_zone": "UTC", "windows": [{"days": ["sat"], "start": "22:00", "end": "02:00"}]}
    op = owner.patch(f"/api/v1/clusters/{cluster}", {"maintenance_policy": policy}).json()
    assert (op["type"], op["status"]) == ("UPDATE_CLUSTER", "DONE")
    # one instant: it started 1-2 ms before it was created (found by the hostile trial)
    assert op["created_at"] == op["started_at"] == op["finished_at"]
    stored = owner.get(f"/api/v1/clusters/{cluster}").json()["maintenance_policy"]
    assert stored == {**policy, "exclusions": []}


def test_a_viewer_cannot_cancel(viewer, owner, cluster):
    op = owner.patch(f"/api/v1/clusters/{cluster}", {"kubernetes_version": "1.37"}).json()
    assert viewer.post(f"/api/v1/operations/{op['id']}/cancel").status_code == 403


def test_pool_creation_waits_its_turn(owner, cluster):
    owner.patch(f"/api/v1/clusters/{cluster}", {"kubernetes_version": "1.37"})
    resp = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {"name": "p", "gpu_model": "a10g", "gpus_per_node": 1, "node_count": 1},
    )
    assert (resp.status_code, resp.json()["code"]) == (409, "operation_in_progress")
    drive_cluster(cluster)
    resp = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {"name": "p", "gpu_model": "a10g", "gpus_per_node": 1, "node_count": 1},
    )
    assert resp.status_code == 202
    drive_pool(resp.json()["target_id"])
