"""Autoscaling by measured GPU utilization, within min/max, through the real resize path."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.helpers import drive_pool, running_h100_pool

pytestmark = pytest.mark.django_db


@pytest.fixture
def pool(owner, make_host):
    return running_h100_pool(owner, make_host, hosts=4, nodes=2)


SEQ = itertools.count(1)  # report numbers are per host and never reused


def report_utilization(pool_id, values, now):
    """Samples as the nodes' agents would send them (one report per host)."""
    from fleet.ingest import ingest_report
    from nodepools.models import Node

    for node in Node.objects.filter(nodepool_id=pool_id, phase="READY"):
        seq = next(SEQ)
        samples = [
            {
                "ts": (now - timedelta(seconds=30 * i)).isoformat(),
                "gpu_uuid": uuid,
                "utilization_gpu_pct": v,
            }
            for uuid in node.gpu_uuids
            for i, v in enumerate(values)
        ]
        ingest_report(node.host, {"seq": seq, "samples": samples}, now=now)


def test_bounds_are_validated_and_applied(owner, pool):
    cluster, pool_id = pool
    url = f"/api/v1/clusters/{cluster}/nodepools/{pool_id}/autoscaling"
    bad = owner.put(url, {"min_node_count": 3, "max_node_count": 1})
    assert (bad.status_code, bad.json()["field"]) == (400, "autoscaling.min_node_count")
    op = owner.put(url, {"min_node_count": 3, "max_node_count": 4}).json()  # 2 -> clamped to 3
    assert op["type"] == "SET_NODE_POOL_SIZE"
    body = owner.get(f"/api/v1/clusters/{cluster}/nodepools/{pool_id}").json()
    assert (body["node_count"], body["autoscaling"]) == (
        3,
        {"enabled": True, "min_node_count": 3, "max_node_count": 4},
    )
    # within bounds already: an instant DONE operation, created when it started
    done = owner.put(url, {"min_node_count": 1, "max_node_count": 4}).json()
    assert (done["type"], done["status"]) == ("SET_NODE_POOL_SIZE", "DONE")
    assert done["created_at"] == done["started_at"] == done["finished_at"]
    # each accepted change audited with the setting before and after (the refused one: none)
    from tenants.models import AuditEvent

    audits = AuditEvent.objects.filter(action="nodepool.autoscaling", target_id=pool_id)
    assert [(a.before, a.after) for a in audits.order_by("ts", "id")] == [
        (
            {"autoscaling": {}},
            {"autoscaling": {"enabled": True, "min_node_count": 3, "max_node_count": 4}},
        ),
        (
            {"autoscaling": {"enabled": True, "min_node_count": 3, "max_node_count": 4}},
            {"autoscaling": {"enabled": True, "min_node_count": 1, "max_node_count": 4}},
        ),
    ]


def test_busy_gpus_add_a_node_and_idle_gpus_remove_one_within_bounds(owner, pool):
    from nodepools.autoscaling import autoscale
    from nodepools.models import NodePool

    cluster, pool_id = pool
    owner.put(
        f"/api/v1/clusters/{cluster}/nodepools/{pool_id}/autoscaling",
        {"min_node_count": 1, "max_node_count": 3},
    )
    now = timezone.now()
    report_utilization(pool_id, [90, 95, 85], now)  # mean 90 % > 80 %
    (decision,) = autoscale(now)
    assert (decision.utilization_pct, decision.samples, decision.target) == (90.0, 48, 3)
    drive_pool(pool_id)
    assert NodePool.objects.get(pk=pool_id).node_count == 3
    later = now + timedelta(hours=1)
    report_utilization(pool_id, [5, 10, 15], later)  # mean 10 % < 20 %
    (decision,) = autoscale(later)
    assert decision.target == 2
    drive_pool(pool_id)
    report_utilization(pool_id, [5, 10, 15], later + timedelta(hours=1))
    autoscale(later + timedelta(hours=1))
    drive_pool(pool_id)
    assert NodePool.objects.get(pk=pool_id).node_count == 1
    report_utilization(pool_id, [0, 0, 0], later + timedelta(hours=2))
    assert autoscale(later + timedelta(hours=2)) == []  # at the minimum


def test_no_utilization_means_no_decision(owner, pool):
    from nodepools.autoscaling import autoscale

    cluster, pool_id = pool
    owner.put(
        f"/api/v1/clusters/{cluster}/nodepools/{pool_id}/autoscaling",
        {"min_node_count": 1, "max_node_count": 3},
    )
    now = timezone.now()
    report_utilization(pool_id, [None, None], now)  # MIG mode: N/A, stored as null
    assert autoscale(now) == []
