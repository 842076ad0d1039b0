"""Search, sort and pages of a cluster's node-pool and operation lists (issue #20), through the
one list machinery the cluster list uses (portal.list_filters, portal.listing.paginate), and
its refusals of bad values: an unknown sort column, a page past the end, a page in non-ASCII
digits, a NUL; each a 400 whose message says why, never a 500."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db

POOLS = re.compile(r'<tr data-pool="([\w-]+)">')
OPS = re.compile(r'<tr data-operation="[\w-]+">\s*<td>(\w+)</td><td>([\w-]*)</td>')


@pytest.fixture
def three_pools(tenant_a, make_host, catalog):
    """Cluster ``llm`` (RUNNING) with three pools created in this order: ``train`` (2 x H100,
    RUNNING), ``infer`` (1 x A100, RUNNING), ``batch`` (1 x H100, left PROVISIONING)."""
    from clusters.services import create_cluster
    from nodepools.services import create_nodepool
    from tenants.principal import Principal
    from tests.helpers import drive_cluster, drive_pool

    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    make_host("a100-sxm4-80gb", gpus=8, zone="us-east-1a")
    owner = Principal(tenant_a, "owner", False, "user:alice")
    op = create_cluster(principal=owner, name="llm", kubernetes_version="1.36", region="us-east-1")
    drive_cluster(op.target_id)
    pools = {}
    for name, model, count in (
        ("train", "h100-sxm5-80gb", 2),
        ("infer", "a100-sxm4-80gb", 1),
        ("batch", "h100-sxm5-80gb", 1),
    ):
        pool_op = create_nodepool(
            principal=owner,
            cluster=op.cluster,
            name=name,
            gpu_model=model,
            gpus_per_node=1,
            node_count=count,
            isolation={"mode": "exclusive"},
        )
        if name != "batch":
            drive_pool(pool_op.target_id)
        pools[name] = pool_op.target_id
    return {"cluster": op.target_id, "pools": pools}


def test_the_node_pool_list_searches_filters_sorts_and_pages(
    alice_client, three_pools, monkeypatch
):
    url = f"/clusters/{three_pools['cluster']}/nodepools"
    page = lambda query="": alice_client.get(url + query).content.decode()  # noqa: E731
    assert POOLS.findall(page()) == ["batch", "infer", "train"]  # newest first
    assert POOLS.findall(page("?sort=name")) == ["batch", "infer", "train"]
    assert POOLS.findall(page("?sort=-name")) == ["train", "infer", "batch"]
    # nodes wanted: train 2, infer 1, batch 1 (ties keep the newest first)
    assert POOLS.findall(page("?sort=-nodes")) == ["train", "batch", "infer"]
    assert POOLS.findall(page("?q=A100")) == ["infer"]  # the GPU model's catalog name
    assert POOLS.findall(page("?q=RAI")) == ["train"]  # case-insensitive substring
    assert POOLS.findall(page("?phase=PROVISIONING")) == ["batch"]
    running = page("?phase=RUNNING&sort=name")
    assert POOLS.findall(running) == ["infer", "train"]
    # the filters offer the values the cluster's pools hold, nothing else
    phase = re.search(r'<select name="phase".*?</select>', running, re.S).group(0)
    assert re.findall(r'<option value="(\w*)"', phase) == ["", "PROVISIONING", "RUNNING"]
    model = re.search(r'<select name="gpu_model".*?</select>', running, re.S).group(0)
    assert re.findall(r'<option value="([\w-]*)"', model) == [
        "",
        "A100-SXM4-80GB",
        "H100-SXM5-80GB",
    ]
    assert POOLS.findall(page("?gpu_model=H100-SXM5-80GB&sort=name")) == ["batch", "train"]
    monkeypatch.setattr("portal.listing.PAGE_SIZE", 2)
    first, second = page("?sort=name"), page("?sort=name&page=2")
    assert POOLS.findall(first) == ["batch", "infer"] and POOLS.findall(second) == ["train"]
    assert "1\u20132 of 3" in first and 'href="?sort=name&amp;page=2"' in first
    assert "3\u20133 of 3" in second and 'href="?sort=name&amp;page=1" rel="prev"' in second
    bad = page("?sort=size&q=train")
    assert (
        "sort “size” is not a column of this list; sort by one of: name, phase, gpu_model, "
        "nodes, created_at (a leading - sorts descending)"
    ) in bad
    assert 'name="sort"' not in bad  # the refused sort is not carried into the next Apply
    # the sorted column's header says so and links the other direction
    assert 'href="?sort=-name" data-sort="ascending">Name ↑</a>' in first


def test_the_operation_list_searches_filters_sorts_and_pages(
    alice_client, three_pools, monkeypatch
):
    """Four operations: CREATE_CLUSTER llm, then CREATE_NODE_POOL train, infer, batch; the
    first three DONE (driven), batch's still PENDING (not reconciled)."""
    url = f"/clusters/{three_pools['cluster']}/operations"
    page = lambda query="": alice_client.get(url + query).content.decode()  # noqa: E731
    newest_first = [
        ("CREATE_NODE_POOL", "batch"),
        ("CREATE_NODE_POOL", "infer"),
        ("CREATE_NODE_POOL", "train"),
        ("CREATE_CLUSTER", "llm"),
    ]
    assert OPS.findall(page()) == newest_first
    assert OPS.findall(page("?sort=created_at")) == newest_first[::-1]
    assert OPS.findall(page("?type=CREATE_CLUSTER")) == [("CREATE_CLUSTER", "llm")]
    assert OPS.findall(page("?q=cluster")) == [("CREATE_CLUSTER", "llm")]
    html = page()
    status = re.search(r'<select name="status".*?</select>', html, re.S).group(0)
    assert re.findall(r'<option value="(\w*)"', status) == ["", "DONE", "PENDING"]
    assert OPS.findall(page("?status=PENDING")) == [("CREATE_NODE_POOL", "batch")]
    # by status: DONE before PENDING, ties keep the newest first; descending: PENDING first
    assert OPS.findall(page("?sort=status")) == [*newest_first[1:], newest_first[0]]
    assert OPS.findall(page("?sort=-status")) == newest_first
    kinds = re.search(r'<select name="type".*?</select>', html, re.S).group(0)
    assert re.findall(r'<option value="(\w*)"', kinds) == ["", "CREATE_CLUSTER", "CREATE_NODE_POOL"]
    monkeypatch.setattr("portal.listing.PAGE_SIZE", 3)
    assert OPS.findall(page("?page=2")) == [("CREATE_CLUSTER", "llm")]
    # the cluster page links both lists
    detail = alice_client.get(f"/clusters/{three_pools['cluster']}").content.decode()
    assert f'href="/clusters/{three_pools["cluster"]}/nodepools" id="all-pools"' in detail
    assert f'href="/clusters/{three_pools["cluster"]}/operations" id="all-operations"' in detail


BAD = [
    ("?sort=bogus", "sort “bogus” is not a column of this list; sort by one of: "),
    ("?page=9", "page 9 does not exist: this list has 1 page"),
    ("?page=0", "page 0 does not exist: this list has 1 page"),
    ("?page=%D9%A1", "page “\u0661” is not a whole number written in the digits 0-9"),
    ("?page=-1", "page “-1” is not a whole number written in the digits 0-9"),
    ("?page=1%012", r"page &#x27;1\x012&#x27; is not a whole number written in the digits"),
    ("?page=" + "9" * 30, "page “" + "9" * 30 + "” does not exist: this list has 1 page"),
    ("?sort=na%01me", r"sort &#x27;na\x01me&#x27; is not a column of this list"),
    ("?q=" + "x" * 101, "Ensure this value has at most 100 characters (it has 101)."),
    ("?phase=NOPE", "Select a valid choice. NOPE is not one of the available choices."),
]


@pytest.mark.parametrize("kind", ["", "/nodepools", "/operations"])
def test_bad_list_values_answer_400_with_the_reason(alice_client, three_pools, kind):
    """The cluster list and both of a cluster's lists refuse the same way (one machinery);
    the page still shows the list (first page, unfiltered) under the message."""
    base = f"/clusters/{three_pools['cluster']}{kind}" if kind else "/clusters"
    for query, message in BAD:
        if kind == "/operations":
            query = query.replace("phase", "status")
        response = alice_client.get(base + query)
        html = response.content.decode()
        assert response.status_code == 400, (query, html[-2000:])
        assert message in html, query
        assert "\x01" not in html  # quoted back escaped, never raw
        rows = re.findall(r'<tr data-(?:pool|operation|cluster)="', html)
        assert len(rows) == {"": 1, "/nodepools": 3, "/operations": 4}[kind], query
    # a NUL anywhere in the query is refused before the view (nvke's request guard)
    for key in ("q", "sort", "page"):
        response = alice_client.get(f"{base}?{key}=a%00b")
        assert response.status_code == 400
        assert f"{key}: text may not contain NUL bytes" in response.content.decode()


def test_an_operation_with_nothing_to_do_shows_a_full_bar(alice_client, three_pools):
    """A scale to 0 of a pool with no node left is DONE with progress 0 of 0: it showed
    "0 % 0/1" (found by the new-user trial). Before its first report an operation shows 0/?."""
    from clusters.models import Operation

    ops = Operation.objects.filter(cluster_id=three_pools["cluster"])
    Operation.objects.filter(pk=ops.get(target_id=three_pools["pools"]["train"]).pk).update(
        progress={"done": 0, "total": 0, "stage": "done"}
    )
    Operation.objects.filter(pk=ops.get(target_id=three_pools["pools"]["infer"]).pk).update(
        progress={"done": 1, "total": 4, "stage": "provisioning"}
    )
    Operation.objects.filter(pk=ops.get(target_id=three_pools["pools"]["batch"]).pk).update(
        progress={}
    )
    html = alice_client.get(f"/clusters/{three_pools['cluster']}/operations").content.decode()
    cells = re.findall(
        r'<td>\w+</td><td>([\w-]*)</td><td>.*?<progress max="(\d+)" value="(\d+)" '
        r'aria-label="progress">(\d+) %</progress>\s*<small>([^<]*)</small>',
        html,
        re.S,
    )
    shown = {
        target: (int(mx), int(val), int(pct), label.strip())
        for target, mx, val, pct, label in cells
    }
    assert shown["train"] == (1, 1, 100, "0/0 done")
    assert shown["infer"] == (4, 1, 25, "1/4 provisioning")  # 1 of 4 = 25 %
    assert shown["batch"] == (1, 0, 0, "0/?")
