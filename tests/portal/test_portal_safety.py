"""Server-side rules of the portal (issue #20): typed-name confirmations, navigation by role,
the one time format, the maintenance policy on the cluster page and the reason a waiting
upgrade gives, the activity feeds, list search/sort/filter/pages, the command-line
equivalents (checked against the real nvkectl commands and API routes)."""

from __future__ import annotations

import re
import shlex
from datetime import UTC, datetime

import pytest
from django.test import Client

from tests.portal.test_portal_access import world  # noqa: F401  (tenant A's cluster + pool)

pytestmark = pytest.mark.django_db


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# ------------------------------------------------------------------------- time format


def test_one_time_format_names_the_zone():
    from portal.templatetags.portal_tags import when

    moment = datetime(2026, 12, 2, 3, 23, 47, tzinfo=UTC)
    assert when(moment) == ('<time datetime="2026-12-02T03:23:47Z">2026-12-02 03:23:47 UTC</time>')
    # a condition's ISO 8601 string (with an offset) is shown the same way, in UTC:
    # 05:23:47+02:00 is 03:23:47 UTC
    assert "2026-12-02 03:23:47 UTC" in when("2026-12-02T05:23:47+02:00")
    assert when(None) == "—"


def test_pages_use_the_one_time_format(alice_client, world):  # noqa: F811
    from clusters.models import Cluster

    cluster = Cluster.objects.get(pk=world["cluster"])
    html = alice_client.get(f"/clusters/{cluster.id}").content.decode()
    created = cluster.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    assert f"{created} UTC</time>" in html
    # no other rendering of a timestamp: every "HH:MM:SS" on the page is followed by " UTC"
    # (the footer says the zone too)
    shown = re.sub(r'datetime="[^"]+"', "", html)  # the machine-readable attribute aside
    assert re.findall(r"\d\d:\d\d:\d\d(?! UTC)", shown) == []


# ------------------------------------------------------------------- navigation by role


def _nav_links(html: str) -> list[tuple[str, str]]:
    nav = html[html.index('<nav aria-label="sections">') : html.index("</nav>")]
    return re.findall(r'<a href="([^"]+)"[^>]*>([^<]+)</a>', nav)


@pytest.mark.parametrize(
    ("role", "expected"),
    [
        ("viewer", ["Clusters", "Activity", "Usage &amp; cost", "Invoices", "Members", "Quotas"]),
        ("member", ["Clusters", "Activity", "Usage &amp; cost", "Invoices", "Members", "Quotas"]),
        (
            "admin",
            [
                "Clusters",
                "Activity",
                "Usage &amp; cost",
                "Invoices",
                "API keys",
                "Members",
                "Quotas",
                "Audit log",
            ],
        ),
    ],
)
def test_the_navigation_offers_only_pages_the_role_opens(portal_user, tenant_a, role, expected):
    client = _client(portal_user(f"u-{role}", tenant_a, role))
    links = _nav_links(client.get("/clusters").content.decode())
    assert [label for _url, label in links] == expected
    for url, label in links:  # every offered page opens for this role (no 403 behind a link)
        assert client.get(url).status_code == 200, (role, label)


# ----------------------------------------------------------------- typed confirmations


def test_deleting_a_cluster_needs_its_name_typed_and_says_what_it_disrupts(
    alice_client,
    viewer_client,
    world,  # noqa: F811
):
    from clusters.models import Cluster

    url = f"/clusters/{world['cluster']}/delete"
    page = alice_client.get(url).content.decode()
    # the world: one pool with one node holding one H100 (1 x 1, exclusive)
    assert '<span data-count="pools">1</span>' in page
    assert '<span data-count="nodes">1</span>' in page
    assert '<span data-count="gpus">1</span>' in page
    assert 'data-confirm-name="llm"' in page
    for typed in ({}, {"confirm_name": "LLM"}, {"confirm_name": "llm "}):
        refused = alice_client.post(url, typed)
        assert refused.status_code == 400, typed
        assert "type the name exactly (llm)" in refused.content.decode()
    assert Cluster.objects.get(pk=world["cluster"]).phase == "RUNNING"
    # a viewer is refused even with the right name
    assert viewer_client.post(url, {"confirm_name": "llm"}).status_code == 403
    assert Cluster.objects.get(pk=world["cluster"]).phase == "RUNNING"
    assert alice_client.post(url, {"confirm_name": "llm"}).status_code == 302
    assert Cluster.objects.get(pk=world["cluster"]).phase == "DELETING"


def test_deleting_a_pool_needs_its_name_typed(alice_client, world):  # noqa: F811
    from nodepools.models import NodePool

    pool = NodePool.objects.get(pk=world["pool"])
    url = f"/clusters/{world['cluster']}/nodepools/{pool.id}/delete"
    assert alice_client.post(url, {"confirm_name": "llm"}).status_code == 400  # the cluster's
    assert NodePool.objects.get(pk=pool.id).phase == "RUNNING"
    assert alice_client.post(url, {"confirm_name": pool.name}).status_code == 302
    assert NodePool.objects.get(pk=pool.id).phase == "DELETING"


# ------------------------------------------------- maintenance policy and waiting reasons


def test_the_waiting_reason_names_the_local_window_and_zone():
    from clusters.maintenance import validate_policy, waiting_message

    policy = validate_policy(
        {
            "time_zone": "Europe/Berlin",
            "windows": [{"days": ["sat"], "start": "02:00", "end": "06:00"}],
        }
    )
    # Wed 2026-12-02 03:00 UTC: the next window opens Sat 2026-12-05 02:00 CET = 01:00 UTC
    now = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)
    opens = datetime(2026, 12, 5, 1, 0, tzinfo=UTC)
    assert waiting_message(policy, opens, now) == (
        "waiting for the maintenance window Sat 02:00 Europe/Berlin"
    )
    # a week or more ahead, the date is added (the weekday alone would be ambiguous)
    later = datetime(2026, 12, 12, 1, 0, tzinfo=UTC)
    assert waiting_message(policy, later, now) == (
        "waiting for the maintenance window 2026-12-12 Sat 02:00 Europe/Berlin"
    )


def test_the_policy_is_edited_on_the_cluster_page_and_a_waiting_upgrade_says_why(
    alice_client,
    world,  # noqa: F811
):
    from clusters.models import Cluster, Operation
    from nodepools.models import NodePool
    from nodepools.reconcile import reconcile_nodepool
    from nodepools.upgrades import upgrade_nodepool
    from tenants.principal import Principal

    cluster = Cluster.objects.get(pk=world["cluster"])
    url = f"/clusters/{cluster.id}"
    bad = alice_client.post(
        url,
        {
            "policy": '{"time_zone": "Europe/Berlin", "windows": '
            '[{"days": ["sat"], "start": "25:00", "end": "06:00"}]}'
        },
    )
    assert bad.status_code == 400
    html = bad.content.decode()
    # the refusal of clusters.maintenance.validate_policy, next to the policy field
    error = re.search(r'id="id_policy-error">(.*?)</div>', html, re.S).group(1)
    assert "maintenance_policy.windows[0].start" in error or "HH:MM" in error
    assert "invalid_maintenance_policy" in error
    assert Cluster.objects.get(pk=cluster.id).maintenance_policy == {}
    not_json = alice_client.post(url, {"policy": "{windows"})
    assert not_json.status_code == 400 and "not JSON" in not_json.content.decode()
    good = alice_client.post(
        url,
        {
            "policy": '{"time_zone": "Europe/Berlin", "windows": '
            '[{"days": ["sat"], "start": "02:00", "end": "06:00"}]}'
        },
    )
    assert good.status_code == 302
    stored = Cluster.objects.get(pk=cluster.id).maintenance_policy
    assert stored["time_zone"] == "Europe/Berlin"
    assert stored["windows"][0]["days"] == ["sat"]
    page = alice_client.get(url).content.decode()
    assert "<td>sat</td><td>02:00</td><td>06:00</td><td>Europe/Berlin</td>" in page

    # a node upgrade started on Wednesday waits for Saturday's window, and says so
    pool = NodePool.objects.get(pk=world["pool"])
    owner = Principal(cluster.tenant, "owner", False, "user:alice")
    upgrade_nodepool(principal=owner, pool=pool, driver_version="580.95.05")
    wednesday = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)
    assert reconcile_nodepool(pool.id, now=wednesday) == 60.0  # re-checked every minute
    op = Operation.objects.get(target_id=pool.id, type="UPGRADE_NODES")
    reason = "waiting for the maintenance window Sat 02:00 Europe/Berlin"
    assert op.progress["stage"] == reason
    feed = alice_client.get(f"/clusters/{cluster.id}/nodepools/{pool.id}/activity")
    assert reason in feed.content.decode()
    assert reason in alice_client.get("/activity").content.decode()


# ------------------------------------------------------------------------ activity feed


def test_the_activity_feed_reads_operations_and_deliveries_of_the_tenant_only(
    alice_client,
    outsider_client,
    world,  # noqa: F811
):
    from clusters.models import Operation
    from webhooks.models import WebhookDelivery, WebhookEndpoint

    ops = Operation.objects.filter(cluster_id=world["cluster"])
    assert sorted(ops.values_list("type", flat=True)) == ["CREATE_CLUSTER", "CREATE_NODE_POOL"]
    endpoint = WebhookEndpoint.objects.create(
        tenant_id=ops[0].tenant_id, url="https://hooks.example.com/nvke", secret_encrypted="x"
    )
    WebhookDelivery.objects.create(
        tenant_id=ops[0].tenant_id,
        endpoint=endpoint,
        event_id="ev-1",
        event_type="operation.finished",
        event={"data": {"cluster_id": str(world["cluster"]), "target_id": str(world["pool"])}},
        status="FAILED",
        attempts=3,
        log=[{"at": "2026-12-02T03:00:00Z", "status_code": 503, "error": "HTTP 503"}],
        deadline=datetime(2026, 12, 3, tzinfo=UTC),
    )
    html = alice_client.get("/activity").content.decode()
    for op in ops:
        assert f'data-entry="{op.id}"' in html
    assert "operation.finished" in html and "attempt 3: HTTP 503" in html
    # per object: the pool's feed holds its own operation and the delivery about it
    pool_feed = alice_client.get(
        f"/clusters/{world['cluster']}/nodepools/{world['pool']}/activity"
    ).content.decode()
    assert pool_feed.count('data-kind="operation"') == 1 and "CREATE_NODE_POOL" in pool_feed
    assert 'data-kind="webhook"' in pool_feed
    only_webhooks = alice_client.get("/activity?kind=webhook").content.decode()
    assert only_webhooks.count("data-entry=") == 1
    # search over title/target/reason, status filter offered from the entries' own statuses
    searched = alice_client.get("/activity?q=node_pool").content.decode()
    assert re.findall(r"<strong>(\w+)</strong>", searched) == ["CREATE_NODE_POOL"]
    select = re.search(r'<select name="status".*?</select>', html, re.S).group(0)
    assert re.findall(r'<option value="(\w*)"', select) == ["", "DONE", "FAILED"]
    failed = alice_client.get("/activity?status=FAILED").content.decode()
    assert failed.count("data-entry=") == 1 and "operation.finished" in failed
    # another tenant sees none of it, and the object feeds answer 404
    theirs = outsider_client.get("/activity").content.decode()
    assert "data-entry=" not in theirs and "Nothing happened yet." in theirs
    assert outsider_client.get(f"/clusters/{world['cluster']}/activity").status_code == 404


# --------------------------------------------------------------------- live object views


def test_the_live_part_carries_the_header_actions_and_the_failure(alice_client, world):  # noqa: F811
    from clusters.models import Operation
    from nodepools.models import NodePool

    url = f"/clusters/{world['cluster']}/nodepools/{world['pool']}"
    live = alice_client.get(url + "?fragment=live", HTTP_HX_REQUEST="true").content.decode()
    assert live.startswith('<div id="pool-live"')
    assert "<h1>Node pool" in live and "Delete…" in live and 'id="pool-phase"' in live
    assert 'hx-swap-oob="true"' not in live  # nothing failed
    NodePool.objects.filter(pk=world["pool"]).update(phase="ERROR")
    Operation.objects.filter(target_id=world["pool"]).update(
        status="FAILED", error={"code": "placement_failed", "message": "no H100 free"}
    )
    failed = alice_client.get(url + "?fragment=live", HTTP_HX_REQUEST="true").content.decode()
    # the page's (green) flash messages are replaced out of band by the failure
    assert '<ul class="messages" id="messages" hx-swap-oob="true" role="status">' in failed
    assert "CREATE_NODE_POOL failed — no H100 free" in failed and "placement_failed" in failed


# ------------------------------------------------------------------------------- lists


def test_the_cluster_list_searches_filters_sorts_and_pages(
    alice_client, tenant_a, h100_host, catalog, monkeypatch
):
    from clusters.services import create_cluster
    from tenants.principal import Principal
    from tests.helpers import drive_cluster

    owner = Principal(tenant_a, "owner", False, "user:alice")
    for name in ("alpha", "beta", "gamma"):
        op = create_cluster(
            principal=owner, name=name, kubernetes_version="1.36", region="us-east-1"
        )
        if name != "beta":
            drive_cluster(op.target_id)  # alpha and gamma RUNNING, beta PROVISIONING
    names = lambda html: re.findall(r'<tr data-cluster="([\w-]+)">', html)  # noqa: E731
    assert names(alice_client.get("/clusters?q=AMM").content.decode()) == ["gamma"]
    assert names(alice_client.get("/clusters?sort=-name").content.decode()) == [
        "gamma",
        "beta",
        "alpha",
    ]
    running = alice_client.get("/clusters?phase=RUNNING&sort=name").content.decode()
    assert names(running) == ["alpha", "gamma"]
    # the phase filter offers the phases the tenant's clusters are in, nothing else
    select = re.search(r'<select name="phase".*?</select>', running, re.S).group(0)
    assert re.findall(r'<option value="(\w*)"', select) == ["", "PROVISIONING", "RUNNING"]
    # an unknown choice is a form error on the page (400), not a 500
    nope = alice_client.get("/clusters?phase=NOPE")
    assert nope.status_code == 400
    assert "Select a valid choice. NOPE is not one of the available choices." in (
        nope.content.decode()
    )
    monkeypatch.setattr("portal.listing.PAGE_SIZE", 2)
    first = alice_client.get("/clusters?sort=name").content.decode()
    second = alice_client.get("/clusters?sort=name&page=2").content.decode()
    assert names(first) == ["alpha", "beta"] and names(second) == ["gamma"]
    assert "1\u20132 of 3" in first and 'href="?sort=name&amp;page=2"' in first


def test_the_member_list_searches_and_filters_by_role(alice_client, portal_user, tenant_a):
    portal_user("bob", tenant_a, "viewer")
    portal_user("carol", tenant_a, "member")
    rows = lambda html: re.findall(r'<tr data-member="(\w+)">', html)  # noqa: E731
    assert rows(alice_client.get("/members").content.decode()) == ["alice", "bob", "carol"]
    assert rows(alice_client.get("/members?role=viewer").content.decode()) == ["bob"]
    assert rows(alice_client.get("/members?q=car").content.decode()) == ["carol"]


# ---------------------------------------------------------------- command-line equivalents


def _parse_nvkectl(command: str) -> None:
    """Parse ``command`` with the real nvkectl (typer/click) without running it."""
    import click
    import typer
    from nvkectl.main import app

    args = shlex.split(command)
    assert args[0] == "nvkectl"
    cmd = typer.main.get_command(app)
    args = args[1:]
    ctx = cmd.make_context("nvkectl", list(args), resilient_parsing=False)
    while isinstance(cmd, click.Group):
        name, *args = ctx.protected_args + ctx.args if ctx.protected_args else ctx.args
        cmd = cmd.get_command(ctx, name)
        assert cmd is not None, name
        ctx = cmd.make_context(name, list(args), parent=ctx)


def test_each_form_shows_a_real_nvkectl_command_and_api_call(alice_client, world):  # noqa: F811
    import html as html_lib

    from django.urls import resolve

    c, p = world["cluster"], world["pool"]
    pages = [
        "/clusters/new",
        f"/clusters/{c}",
        f"/clusters/{c}/delete",
        f"/clusters/{c}/nodepools/new",
        f"/clusters/{c}/nodepools/{p}",
        f"/clusters/{c}/nodepools/{p}/delete",
    ]
    seen = {"nvkectl": 0, "curl": 0}
    for page in pages:
        html = alice_client.get(page).content.decode()
        blocks = re.findall(r'<pre class="mono" data-cli="(\w+)">(.*?)</pre>', html, re.S)
        assert blocks, page
        for kind, text in blocks:
            text = html_lib.unescape(text)
            seen[kind] += 1
            if kind == "nvkectl":
                _parse_nvkectl(text)
            else:
                path = re.search(r'"\$NVKE(/api/v1/[^"]+)"', text).group(1)
                assert resolve(path).url_name, path  # a route the API serves
    assert seen["nvkectl"] >= 6 and seen["curl"] >= 8
    delete = alice_client.get(f"/clusters/{c}/delete").content.decode()
    assert "nvkectl clusters delete llm --wait" in delete
    assert f'curl -sf -X DELETE -H "Authorization: Bearer $TOKEN" "$NVKE/api/v1/clusters/{c}"' in (
        html_lib.unescape(delete)
    )


def test_a_search_that_finds_nothing_says_so_instead_of_inviting_a_first_cluster(
    alice_client,
    world,  # noqa: F811
):
    """Found by a new-user trial: /clusters?q=zzz said "No clusters yet. Create one."."""
    html = alice_client.get("/clusters?q=zzz").content.decode()
    assert "No cluster matches these filters." in html
    assert "No clusters yet." not in html
    assert "No clusters yet." not in alice_client.get("/clusters").content.decode()


def test_console_pages_use_the_one_time_format(ops_client, h100_host):
    """The console's host page shows the agent's last report in the one format (zone named)."""
    from fleet.models import Host

    seen = datetime(2026, 12, 2, 4, 45, 11, tzinfo=UTC)
    Host.objects.filter(pk=h100_host.pk).update(registered_at=seen, last_seen_at=seen)
    html = ops_client.get(f"/console/hosts/{h100_host.id}").content.decode()
    shown = '<time datetime="2026-12-02T04:45:11Z">2026-12-02 04:45:11 UTC</time>'
    assert f"last report {shown}" in html


def test_a_nul_byte_in_a_portal_path_is_404_not_500(alice_client, portal_user, tenant_a):
    """Found by the re-probe: ``/members/alice%00/remove`` and ``/api-keys/<prefix>%00/revoke``
    reached the database with the NUL (DataError, 500). The portal's name and token path
    segments use converters that do not match it (404); nobody is removed."""
    from tenants.models import Membership

    portal_user("bob", tenant_a, "member")
    for path in (
        "/members/bob%00/remove",
        "/members/bob%00/role",
        "/api-keys/abc%00/revoke",
        "/invite/tok%00en",
    ):
        resp = alice_client.post(path, {"role": "viewer"})
        assert resp.status_code == 404, (path, resp.status_code)
    assert Membership.objects.get(user__username="bob", tenant=tenant_a).role == "member"
    # the same paths without the NUL reach the views (the member is removed)
    assert alice_client.post("/members/bob/remove").status_code == 302
    assert not Membership.objects.filter(user__username="bob", tenant=tenant_a).exists()
