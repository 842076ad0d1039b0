"""The lean list path (nvke/lean_lists.py) gives the bytes DRF's serializers give, row by row:
nulls, JSON columns, arrays, choices, method fields, nested nodes, DELETED rows and a current
timezone other than UTC (where DRF writes ``+01:00`` instead of ``Z``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from tests.api.list_rows import seed_lists

pytestmark = pytest.mark.django_db


@pytest.fixture
def varied(tenant_a, make_host):
    """The list rows with the columns a fresh seed leaves empty filled in on some rows."""
    from clusters.models import Cluster, Operation
    from nodepools.models import Node, NodePool

    rows = seed_lists(tenant_a, make_host("a10g", gpus=8), n=6)
    gone = datetime(2026, 11, 30, 23, 59, 59, 123456, tzinfo=UTC)
    Cluster.objects.filter(name="c001").update(
        phase="DELETED", deleted_at=gone, deletion_requested_at=gone - timedelta(hours=1)
    )
    Cluster.objects.filter(name="c002").update(phase="PROVISIONING", control_plane_version="")
    Cluster.objects.filter(name="c003").update(
        maintenance_policy={"windows": [{"days": ["sun"], "start": "02:00", "hours": 4}]},
        conditions=[{"type": "Ready", "status": "True", "reason": "Ok"}],
    )
    NodePool.objects.filter(name="p001").update(phase="DELETED", deleted_at=gone)
    Node.objects.filter(name="p002-n0").update(
        phase="DELETED", released_at=gone, gpu_uuids=["GPU-sim-0001", "GPU-sim-0002"]
    )
    Node.objects.filter(name="p001-n1").update(phase="DELETED", host=None, observed_problem="x")
    Node.objects.filter(name="p003-n0").update(gpu_layout=[{"gpu": 0, "mig": "1g.10gb"}])
    op = Operation.objects.filter(tenant=tenant_a).order_by("created_at").first()
    Operation.objects.filter(pk=op.pk).update(
        status="FAILED", error={"code": "insufficient_capacity", "detail": "ü"}, finished_at=None
    )
    return rows


def _drf(serializer_class, rows, context):
    """DRF's own path: ``Serializer.to_representation`` per row."""
    return [serializer_class(r, context=context).data for r in rows]


def _lean(serializer_class, rows, context):
    return serializer_class(rows, many=True, context=context).data


@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin"])
def test_the_lean_lists_render_the_bytes_drf_renders(varied, tz):
    from clusters.api.serializers import ClusterSerializer, OperationSerializer
    from clusters.models import Cluster, Operation
    from nodepools.api.serializers import NodePoolSerializer, NodeSerializer
    from nodepools.models import Node, NodePool
    from nvke.lean_lists import LeanListSerializer, row_builder

    render = JSONRenderer().render
    cases = [
        (ClusterSerializer, list(Cluster.objects.order_by("name"))),
        (OperationSerializer, list(Operation.objects.all())),
        (NodePoolSerializer, list(NodePool.objects.prefetch_related("nodes__host"))),
    ]
    with timezone.override(tz):
        for serializer_class, rows in cases:
            assert isinstance(serializer_class(many=True), LeanListSerializer)
            drf, lean = _drf(serializer_class, rows, {}), _lean(serializer_class, rows, {})
            assert render(lean) == render(drf), serializer_class.__name__
        nodes = list(Node.objects.select_related("host").order_by("name"))
        build = row_builder(NodeSerializer())
        assert render([build(n) for n in nodes]) == render([NodeSerializer(n).data for n in nodes])
    # worked by hand: 23:59:59.123456 UTC on Nov 30 is 00:59:59.123456 on Dec 1 in Berlin (CET)
    with timezone.override(tz):
        deleted = _lean(ClusterSerializer, [Cluster.objects.get(name="c001")], {})[0]
    expected = {
        "UTC": "2026-11-30T23:59:59.123456Z",
        "Europe/Berlin": "2026-12-01T00:59:59.123456+01:00",
    }[tz]
    assert deleted["deleted_at"] == expected
    # the method field and the nested nodes are the same too
    provisioning = _lean(ClusterSerializer, [Cluster.objects.get(name="c002")], {})[0]
    assert provisioning["available_upgrades"] == []
    pool = _lean(NodePoolSerializer, [NodePool.objects.get(name="p002")], {})[0]
    assert [n["name"] for n in pool["nodes"]] == ["p002-n1"]  # p002-n0 DELETED, pool is not
    deleted_pool = _lean(NodePoolSerializer, [NodePool.objects.get(name="p001")], {})[0]
    hosts = {n["name"]: n["host"] for n in deleted_pool["nodes"]}
    assert hosts["p001-n1"] is None and hosts["p001-n0"].startswith("sim-a10g-")


def test_a_related_field_is_refused():
    from rest_framework import serializers

    from clusters.models import Operation
    from nvke.lean_lists import plan_for

    class WithCluster(serializers.ModelSerializer):
        class Meta:
            model = Operation
            fields = ["id", "cluster"]

    with pytest.raises(TypeError, match="cluster"):
        plan_for(WithCluster)


def _ordered(body: bytes):
    """A JSON body parsed with every object as its list of (key, value) pairs: equal only
    with the same keys in the same order and equal values."""
    return json.loads(body, object_pairs_hook=list)


def test_the_list_responses_are_drfs_values(owner, varied):
    """End to end: each list response (written by PostgreSQL, nvke/sql_lists.py) is, parsed,
    the page DRF's per-row serializers render — values and key order; only the whitespace
    differs (the node pools' nodes read by a subquery in the API, from instances here)."""
    from clusters.api.serializers import ClusterSerializer, OperationSerializer
    from clusters.models import Cluster, Operation
    from nodepools.api.serializers import NodePoolSerializer
    from nodepools.models import NodePool

    render = JSONRenderer().render
    first = varied.first_cluster_id
    cases = [
        ("/api/v1/clusters", ClusterSerializer, Cluster.objects.all()),
        ("/api/v1/operations", OperationSerializer, Operation.objects.all()),
        (
            f"/api/v1/clusters/{first}/nodepools",
            NodePoolSerializer,
            NodePool.objects.filter(cluster_id=first).prefetch_related("nodes__host"),
        ),
    ]
    for path, serializer_class, queryset in cases:
        # show_deleted: the DELETED cluster and pool are rendered too
        resp = owner.get(path, {"limit": 50, "show_deleted": "true"})
        assert resp.status_code == 200, resp.content
        rows = list(queryset)
        expected = {
            "count": len(rows),
            "next": None,
            "previous": None,
            "results": _drf(serializer_class, rows, {}),
        }
        assert _ordered(resp.content) == _ordered(render(expected)), path
