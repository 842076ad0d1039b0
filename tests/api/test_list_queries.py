"""Lists run a fixed number of queries whatever the page size (issue 15: the cluster list ran
one catalog query per cluster through ``available_upgrades``)."""

from __future__ import annotations

import pytest

from tests.api.list_rows import seed_lists

pytestmark = pytest.mark.django_db


@pytest.fixture
def rows(tenant_a, make_host):
    return seed_lists(tenant_a, make_host("a10g", gpus=8), n=50)


@pytest.mark.parametrize(
    ("path", "queries"),
    [
        # page, the catalog's supported versions (once, not per cluster)
        ("/api/v1/clusters", 2),
        # page with its nodes and their hosts' names in a subquery (nvke/sql_lists.py; the
        # cluster is read only for an empty page)
        ("/api/v1/clusters/{cluster}/nodepools", 1),
        # page
        ("/api/v1/operations", 1),
    ],
)
def test_a_page_of_50_runs_as_many_queries_as_a_page_of_1(
    owner, rows, path, queries, django_assert_num_queries
):
    path = path.format(cluster=rows.first_cluster_id)
    # the first request reads the API key (then cached: tenants/key_cache.py) and writes its
    # last_used_at (at most once a minute): not measured
    owner.get(path)
    # a page of 1 of the 50 rows needs the count query; a page of 50 ends the list, so its
    # count is the rows read (nvke/pagination.py) and no count query runs
    for limit, count_query in ((1, 1), (50, 0)):
        with django_assert_num_queries(queries + count_query):
            resp = owner.get(path, {"limit": limit})
        assert resp.status_code == 200, resp.content
        assert len(resp.json()["results"]) == limit
        assert resp.json()["count"] == 50


@pytest.mark.parametrize(
    ("limit", "offset", "names", "count", "queries"),
    [
        # the whole list (newest first): no count query
        (50, 0, [f"c{49 - i:03d}" for i in range(50)], 50, 2),
        (51, 0, [f"c{49 - i:03d}" for i in range(50)], 50, 2),
        (49, 0, [f"c{49 - i:03d}" for i in range(49)], 50, 3),  # one row more exists: counted
        (20, 40, [f"c{49 - i:03d}" for i in range(40, 50)], 50, 2),  # the last page
        (10, 40, [f"c{49 - i:03d}" for i in range(40, 50)], 50, 2),  # ends exactly there
        # past the end: counted (an empty page needs no catalog query)
        (10, 50, [], 50, 2),
        (10, 900, [], 50, 2),
    ],
)
def test_the_count_is_the_lists_wherever_the_page_ends(
    owner, rows, limit, offset, names, count, queries, django_assert_num_queries
):
    owner.get("/api/v1/clusters")
    with django_assert_num_queries(queries):
        body = owner.get("/api/v1/clusters", {"limit": limit, "offset": offset}).json()
    assert [c["name"] for c in body["results"]] == names
    assert body["count"] == count
    assert (body["next"] is None) == (offset + limit >= count)


def test_an_empty_page_counts_zero_and_another_tenants_cluster_is_404(owner, outsider, rows):
    from clusters.models import Cluster

    empty = Cluster.objects.get(name="c001")  # the seeded pools are all in c000
    body = owner.get(f"/api/v1/clusters/{empty.pk}/nodepools").json()
    assert (body["count"], body["results"]) == (0, [])
    assert owner.get("/api/v1/operations", {"cluster": empty.pk, "limit": 5}).json()["count"] == 1
    missing = outsider.get(f"/api/v1/clusters/{rows.first_cluster_id}/nodepools")
    assert missing.status_code == 404
    assert missing.json()["code"] == "not_found"


def test_the_cluster_list_offers_the_same_upgrades_as_the_catalog(owner, rows):
    from clusters.versions import available_upgrades

    expected = available_upgrades("1.34")
    assert expected  # the vendored catalog supports a newer minor than 1.34
    page = owner.get("/api/v1/clusters", {"limit": 50}).json()["results"]
    assert {tuple(c["available_upgrades"]) for c in page} == {tuple(expected)}


def test_the_request_id_in_the_logs_is_the_one_echoed(owner, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="django_structlog.middlewares.request")
    resp = owner.get("/healthz")
    echoed = resp["X-Request-ID"]
    logged = {
        r.msg.get("request_id")
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg.get("event") in ("request_started", "request_finished")
    }
    assert logged == {echoed}
    assert len(echoed) == 32
    sent = owner.get("/healthz", HTTP_X_REQUEST_ID="client-chosen-1")
    assert sent["X-Request-ID"] == "client-chosen-1"


def test_the_filters_still_run_when_a_request_names_one(owner, rows):
    """The filter backend skips django-filter only for a request without filter parameters
    (nvke/filters.py): a named filter still filters, and a bad value still answers 400."""
    from clusters.models import Cluster

    Cluster.objects.filter(name__in=["c000", "c007"]).update(phase="DELETING")
    assert owner.get("/api/v1/clusters", {"limit": 50}).json()["count"] == 50
    deleting = owner.get("/api/v1/clusters", {"limit": 50, "phase": "DELETING"}).json()
    assert sorted(c["name"] for c in deleting["results"]) == ["c000", "c007"]
    assert deleting["count"] == 2
    ops = owner.get("/api/v1/operations", {"cluster": rows.first_cluster_id}).json()
    # seed_lists gives operation i to cluster i % 50: one operation each
    assert ops["count"] == 1
    bad = owner.get("/api/v1/clusters", {"phase": "NOT_A_PHASE"})
    assert bad.status_code == 400, bad.content


def test_node_pools_filter_by_phase_and_gpu_model(owner, rows):
    """``?phase=`` on a cluster's node pools was ignored, every pool listed (found by the
    hostile trial); a value that is no phase or model is a 400 naming it."""
    from nodepools.models import NodePool

    NodePool.objects.filter(name__in=["p003", "p011"]).update(phase="ERROR")
    path = f"/api/v1/clusters/{rows.first_cluster_id}/nodepools"
    failed = owner.get(path, {"phase": "ERROR"}).json()
    assert (failed["count"], sorted(p["name"] for p in failed["results"])) == (2, ["p003", "p011"])
    assert owner.get(path, {"gpu_model": "a10g", "limit": 1}).json()["count"] == 50
    assert owner.get(path, {"gpu_model": "a10g", "phase": "ERROR"}).json()["count"] == 2
    for name, value in (("phase", "bogus"), ("gpu_model", "h999")):
        bad = owner.get(path, {name: value})
        assert bad.status_code == 400 and bad.json()["field"] == name, bad.content
