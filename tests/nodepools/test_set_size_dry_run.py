"""``POST …/set-size?dry_run=true`` says what a resize would do and changes nothing (a
fresh-user trial's dry run of a scale-down was silently applied): the nodes a scale-down
removes, in the reconciler's order (unhealthy first, then the newest), what a scale-up would
provision and whether it fits; answered while another operation holds the cluster.

Fleet: three simulated 8-GPU H100 hosts; pool ``h100`` of three 8-GPU nodes, one per host.
"""

from __future__ import annotations

import datetime as dt

import pytest

from tests.helpers import running_h100_pool

pytestmark = pytest.mark.django_db


def test_a_scale_down_dry_run_names_the_unhealthy_node_first_and_changes_nothing(owner, make_host):
    from clusters.models import Operation
    from nodepools.models import Node, NodePool

    cluster, pool_id = running_h100_pool(owner, make_host, hosts=3, nodes=3)
    oldest, middle, newest = Node.objects.filter(nodepool_id=pool_id).order_by("created_at")
    base = oldest.created_at
    for i, node in enumerate((oldest, middle, newest)):  # distinct ages, oldest first
        Node.objects.filter(pk=node.pk).update(created_at=base + dt.timedelta(minutes=i))
    Node.objects.filter(pk=oldest.pk).update(phase="NOT_READY")
    url = f"/api/v1/clusters/{cluster}/nodepools/{pool_id}/set-size"
    before = NodePool.objects.get(pk=pool_id)
    ops_before = Operation.objects.count()

    resp = owner.post(url + "?dry_run=true", {"node_count": 1}, format="json")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert (body["dry_run"], body["node_count"]) == (True, {"from": 3, "to": 1})
    # the broken node leaves first although it is the oldest; then the newest healthy one
    assert [(n["name"], n["unhealthy"], n["gpus"]) for n in body["disruption"]["nodes"]] == [
        (oldest.name, True, 8),
        (newest.name, False, 8),
    ]
    assert (body["disruption"]["drain"], body["disruption"]["provision"]) == (2, 0)
    assert (body["capacity"], body["quota"]) == (None, None)
    after = NodePool.objects.get(pk=pool_id)
    assert (after.node_count, after.generation) == (before.node_count, before.generation)
    assert Operation.objects.count() == ops_before


def test_a_dry_run_is_answered_while_an_operation_runs_and_says_a_scale_up_does_not_fit(
    owner, make_host
):
    from clusters.models import Operation
    from nodepools.models import NodePool

    cluster, pool_id = running_h100_pool(owner, make_host, hosts=3, nodes=3)
    url = f"/api/v1/clusters/{cluster}/nodepools/{pool_id}/set-size"
    real = owner.post(url, {"node_count": 2}, format="json")
    assert real.status_code == 202, real.content
    busy = owner.post(url, {"node_count": 5}, format="json")
    assert (busy.status_code, busy.json()["code"]) == (409, "operation_in_progress")

    resp = owner.post(url + "?dry_run=1", {"node_count": 5}, format="json")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    # three live nodes (the scale-down has not run yet), five wanted: two to provision,
    # 16 GPUs the fleet does not have (every host holds one of the pool's nodes)
    assert body["node_count"] == {"from": 2, "to": 5}
    assert (body["disruption"]["provision"], body["disruption"]["nodes"]) == (2, [])
    assert (body["capacity"]["needed_gpus"], body["capacity"]["placeable_now"]) == (16, False)
    assert (body["quota"]["nodes"]["requested"], body["quota"]["gpus"]["requested"]) == (3, 24)
    assert NodePool.objects.get(pk=pool_id).node_count == 2
    assert Operation.objects.filter(status__in=["PENDING", "RUNNING"]).count() == 1


def test_a_mistyped_dry_run_is_400_and_applies_nothing(owner, make_host):
    from nodepools.models import NodePool

    cluster, pool_id = running_h100_pool(owner, make_host, hosts=1, nodes=1)
    url = f"/api/v1/clusters/{cluster}/nodepools/{pool_id}/set-size"
    resp = owner.post(url + "?dry_run=maybe", {"node_count": 0}, format="json")
    assert (resp.status_code, resp.json()["code"], resp.json()["field"]) == (
        400,
        "invalid_boolean",
        "dry_run",
    )
    assert NodePool.objects.get(pk=pool_id).node_count == 1
