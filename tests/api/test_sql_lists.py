"""List pages written by PostgreSQL (nvke/sql_lists.py): the path is taken for the three
lists, and the values it writes are the ones DRF writes, checked against values worked out by
hand (datetimes with and without microseconds, a year below 1000, strings with quotes,
backslashes, control characters and U+2028, JSON documents with floats and large integers);
a current timezone other than UTC, and a field it has no SQL for, leave the page to the lean
path. ``tests/api/test_lean_lists.py`` compares whole pages with DRF's own output."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework import serializers

from tests.api.list_rows import seed_lists

pytestmark = pytest.mark.django_db


@pytest.fixture
def rows(tenant_a, make_host):
    return seed_lists(tenant_a, make_host("a10g", gpus=8), n=3)


def _page_queries(client, path: str) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        resp = client.get(path)
    assert resp.status_code == 200, resp.content
    return [q["sql"] for q in queries.captured_queries]


@pytest.mark.parametrize(
    "path",
    ["/api/v1/clusters", "/api/v1/clusters/{cluster}/nodepools", "/api/v1/operations"],
)
def test_the_three_lists_are_written_by_postgresql(owner, rows, path):
    path = path.format(cluster=rows.first_cluster_id)
    owner.get(path)  # the API key is read and cached first
    queries = _page_queries(owner, path)
    assert "JSON_BUILD_OBJECT(" in queries[0], queries
    if "nodepools" in path:  # the nodes come in the same query, as a JSON array
        assert len(queries) == 1 and "JSON_AGG(" in queries[0], queries


def test_datetimes_are_written_as_drf_writes_them_in_utc(owner, rows):
    from clusters.models import Cluster

    Cluster.objects.filter(name="c000").update(
        created_at=datetime(2026, 12, 2, 13, 33, 56, tzinfo=UTC),  # no microseconds
        updated_at=datetime(2026, 12, 2, 13, 33, 56, 5, tzinfo=UTC),  # 5 microseconds
        deletion_requested_at=datetime(999, 1, 2, 3, 4, 5, 120000, tzinfo=UTC),
        deleted_at=None,
    )
    body = owner.get("/api/v1/clusters").json()
    (row,) = [r for r in body["results"] if r["name"] == "c000"]
    # datetime.isoformat(): the fraction only when not 0, always 6 digits; 4-digit years
    assert row["created_at"] == "2026-12-02T13:33:56Z"
    assert row["updated_at"] == "2026-12-02T13:33:56.000005Z"
    assert row["deletion_requested_at"] == "0999-01-02T03:04:05.120000Z"
    assert row["deleted_at"] is None


def test_strings_and_json_documents_keep_their_values(owner, rows):
    from clusters.models import Cluster

    text = 'a"b\\c\n\t\x01é\u2028—'
    policy = {"windows": [{"days": ["sun"], "start": "02:00", "hours": 4.5}], "n": 2**53 + 1}
    Cluster.objects.filter(name="c001").update(endpoint=text, maintenance_policy=policy)
    resp = owner.get("/api/v1/clusters")
    (row,) = [r for r in resp.json()["results"] if r["name"] == "c001"]
    assert row["endpoint"] == text
    assert row["maintenance_policy"] == policy
    assert type(row["maintenance_policy"]["n"]) is int
    assert type(row["maintenance_policy"]["windows"][0]["hours"]) is float
    assert b"\\u2028" in resp.content and "\u2028".encode() not in resp.content  # as DRF
    # the method field between the SQL-written parts, in the serializer's field order
    assert list(row)[:5] == [
        "id",
        "name",
        "kubernetes_version",
        "control_plane_version",
        "available_upgrades",
    ]


def test_another_current_timezone_leaves_the_page_to_the_lean_path(owner, rows):
    from clusters.models import Cluster

    Cluster.objects.filter(name="c002").update(
        deleted_at=datetime(2026, 11, 30, 23, 59, 59, 123456, tzinfo=UTC)
    )
    with timezone.override("Europe/Berlin"):
        sql = "\n".join(_page_queries(owner, "/api/v1/clusters"))
        body = owner.get("/api/v1/clusters").json()
    assert "JSON_BUILD_OBJECT" not in sql
    (row,) = [r for r in body["results"] if r["name"] == "c002"]
    assert row["deleted_at"] == "2026-12-01T00:59:59.123456+01:00"  # CET, worked by hand


def test_a_pretty_printed_page_is_the_same_json(owner, rows):
    compact = owner.get("/api/v1/operations")
    pretty = owner.get("/api/v1/operations", HTTP_ACCEPT="application/json; indent=2")
    assert pretty.status_code == 200
    assert b'\n  "count": 3' in pretty.content
    assert json.loads(pretty.content) == json.loads(compact.content)


def test_a_field_without_sql_leaves_the_serializer_to_the_lean_path():
    from clusters.models import Cluster
    from nodepools.models import Node
    from nvke.sql_lists import sql_plan

    class WithDecimal(serializers.ModelSerializer):
        price = serializers.DecimalField(source="generation", max_digits=8, decimal_places=2)

        class Meta:
            model = Cluster
            fields = ["id", "price"]

    class DottedWithoutDefault(serializers.ModelSerializer):
        host = serializers.CharField(source="host.hostname", read_only=True)

        class Meta:
            model = Node
            fields = ["id", "host"]

    class DottedWithDefault(serializers.ModelSerializer):
        host = serializers.CharField(source="host.hostname", read_only=True, default=None)

        class Meta:
            model = Node
            fields = ["id", "host"]

    assert sql_plan(WithDecimal) is None
    assert sql_plan(DottedWithoutDefault) is None  # DRF would drop the key without a host
    plan = sql_plan(DottedWithDefault)
    assert plan is not None and [n for n, _ in plan.segments[0]] == ["id", "host"]


def test_a_node_without_a_host_shows_null(owner, rows):
    from nodepools.models import Node

    Node.objects.filter(name="p000-n1").update(host=None)
    body = owner.get(f"/api/v1/clusters/{rows.first_cluster_id}/nodepools").json()
    (pool,) = [p for p in body["results"] if p["name"] == "p000"]
    hosts = {n["name"]: n["host"] for n in pool["nodes"]}
    assert hosts["p000-n1"] is None and hosts["p000-n0"].startswith("sim-a10g-")
    assert [n["name"] for n in pool["nodes"]] == ["p000-n0", "p000-n1"]
