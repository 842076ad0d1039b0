"""Who may see which portal page: every route classified, login required, another tenant's
objects answer the same 404 as missing ones (the API's scoping helper), the console is for
operators, viewers read but never write; pages carry their content without JavaScript and
every form control has a label."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from tests.helpers import running_exclusive_pool
from tests.portal.conftest import without_tokens

pytestmark = pytest.mark.django_db

MISSING = "00000000-0000-0000-0000-000000000000"

#: route name -> kind: "public" (no login), "tenant" (tenant A's object ids in the URL),
#: "tenant-list" (no ids), "console" (operators only)
PAGES = {
    "portal:home": "public",
    "portal:login": "public",
    "portal:logout": "public",
    "portal:password-reset": "public",
    "portal:password-reset-done": "public",
    "portal:password-reset-confirm": "public",
    "portal:password-reset-complete": "public",
    "portal:invite": "public",
    "portal:invitation-revoke": "tenant",
    "portal:tenant-choose": "tenant-list",
    "portal:cluster-list": "tenant-list",
    "portal:activity": "tenant-list",
    "portal:cluster-activity": "tenant",
    "portal:nodepool-activity": "tenant",
    "portal:cluster-create": "tenant-list",
    "portal:cluster-detail": "tenant",
    "portal:cluster-upgrade": "tenant",
    "portal:cluster-delete": "tenant",
    "portal:nodepool-create": "tenant",
    "portal:nodepool-list": "tenant",
    "portal:operation-list": "tenant",
    "portal:nodepool-detail": "tenant",
    "portal:nodepool-scale": "tenant",
    "portal:nodepool-isolation": "tenant",
    "portal:nodepool-upgrade": "tenant",
    "portal:nodepool-resume": "tenant",
    "portal:nodepool-delete": "tenant",
    "portal:node-detail": "tenant",
    "portal:api-keys": "tenant-list",
    "portal:api-key-revoke": "tenant",
    "portal:members": "tenant-list",
    "portal:member-role": "tenant",
    "portal:member-remove": "tenant",
    "portal:quotas": "tenant-list",
    "portal:audit": "tenant-list",
    "portal:usage": "tenant-list",
    "portal:usage-refresh": "tenant-list",
    "portal:invoices": "tenant-list",
    "portal:invoice-detail": "tenant",
    "console:overview": "console",
    "console:hosts": "console",
    "console:defrag": "console",
    "console:defrag-start": "console",
    "console:defrag-run": "console",
    "console:host": "console",
    "console:host-action": "console",
    "console:host-confirm": "console",
    "console:xids": "console",
    "console:health-rules": "console",
    "console:health-rule-save": "console",
    "console:health-rule-restore": "console",
    "console:breaker-resume": "console",
    "console:control-planes": "console",
    "console:tenants": "console",
    "console:tenant": "console",
    "console:prices": "console",
    "console:invoices": "console",
    "console:invoices-build": "console",
    "console:invoice-finalize": "console",
}


def portal_routes() -> list[str]:
    out = []

    def walk(patterns, namespace):
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, p.namespace or namespace)
            elif isinstance(p, URLPattern) and namespace in ("portal", "console"):
                out.append(f"{namespace}:{p.name}")

    walk(get_resolver().url_patterns, None)
    return out


def test_every_portal_and_console_route_is_classified():
    routes = portal_routes()
    assert sorted(set(routes) - set(PAGES)) == [], "classify new pages in PAGES and test them"
    assert sorted(set(PAGES) - set(routes)) == []


@pytest.fixture
def world(tenant_a, h100_host, catalog):
    """Tenant A's running cluster with a running 1 x 1 H100 pool (exclusive) and its node."""
    from nodepools.models import Node
    from tenants.principal import Principal

    owner = Principal(tenant_a, "owner", False, "user:alice")
    cluster_id, pool_id = running_exclusive_pool(owner, gpus_per_node=1, node_count=1)
    node = Node.objects.get(nodepool_id=pool_id)
    return {"cluster": cluster_id, "pool": pool_id, "node": node.id}


def tenant_urls(ids: dict) -> dict[str, str]:
    c, p, n = ids["cluster"], ids["pool"], ids["node"]
    return {
        "portal:cluster-detail": f"/clusters/{c}",
        "portal:cluster-upgrade": f"/clusters/{c}/upgrade",
        "portal:cluster-activity": f"/clusters/{c}/activity",
        "portal:nodepool-activity": f"/clusters/{c}/nodepools/{p}/activity",
        "portal:cluster-delete": f"/clusters/{c}/delete",
        "portal:nodepool-create": f"/clusters/{c}/nodepools/new",
        "portal:nodepool-list": f"/clusters/{c}/nodepools",
        "portal:operation-list": f"/clusters/{c}/operations",
        "portal:nodepool-detail": f"/clusters/{c}/nodepools/{p}",
        "portal:nodepool-scale": f"/clusters/{c}/nodepools/{p}/scale",
        "portal:nodepool-isolation": f"/clusters/{c}/nodepools/{p}/isolation",
        "portal:nodepool-delete": f"/clusters/{c}/nodepools/{p}/delete",
        "portal:node-detail": f"/clusters/{c}/nodepools/{p}/nodes/{n}",
    }


def test_anonymous_visitors_are_sent_to_the_login_page(client, world, h100_host):
    urls = [*tenant_urls(world).values(), "/clusters", "/usage", "/audit", "/api-keys"]
    urls += ["/console/", f"/console/hosts/{h100_host.id}", "/console/tenants"]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"] == f"/login?next={url}", url
    assert client.get("/login").status_code == 200
    assert client.get("/").headers["Location"] == "/login"


def test_an_outsider_gets_the_same_404_on_tenant_as_objects_as_on_missing_ones(
    outsider_client, alice_client, world
):
    from clusters.models import Cluster

    missing = tenant_urls({"cluster": MISSING, "pool": MISSING, "node": MISSING})
    for name, url in tenant_urls(world).items():
        mine = alice_client.get(url)
        # scale / isolation take POSTs; a GET goes back to the pool page
        expected = 302 if name in ("portal:nodepool-scale", "portal:nodepool-isolation") else 200
        assert mine.status_code == expected, (name, mine.status_code)
        theirs = outsider_client.get(url)
        assert theirs.status_code == 404, name
        nothing = outsider_client.get(missing[name])
        assert nothing.status_code == 404, name
        assert without_tokens(theirs.content.decode()) == without_tokens(
            nothing.content.decode()
        ), name
    # writes too: the outsider cannot delete tenant A's cluster, and learns nothing
    response = outsider_client.post(f"/clusters/{world['cluster']}/delete")
    assert response.status_code == 404
    assert Cluster.objects.get(pk=world["cluster"]).phase == "RUNNING"
    # and tenant A's cluster is not in the outsider's list
    assert "llm" not in outsider_client.get("/clusters").content.decode()


def test_tenant_users_get_404_on_every_console_page(alice_client, h100_host, tenant_a):
    urls = ["/console/", "/console/hosts", f"/console/hosts/{h100_host.id}"]
    urls += ["/console/tenants", f"/console/tenants/{tenant_a.id}", "/console/prices"]
    urls += ["/console/defrag", f"/console/defrag/runs/{tenant_a.id}"]
    urls += ["/console/xids", f"/console/hosts/{h100_host.id}/confirm/retire"]
    urls += ["/console/control-planes", "/console/health-rules"]
    urls += [f"/console/hosts/{h100_host.id}?fragment=live"]
    for url in urls:
        assert alice_client.get(url).status_code == 404, url
    response = alice_client.post(f"/console/hosts/{h100_host.id}/cordon", {"reason": "x"})
    assert response.status_code == 404
    retire = {"confirm_name": h100_host.hostname}
    assert alice_client.post(f"/console/hosts/{h100_host.id}/retire", retire).status_code == 404
    h100_host.refresh_from_db()
    assert h100_host.state == "AVAILABLE"


def test_a_viewer_reads_every_page_but_every_change_answers_403(viewer_client, world):
    from clusters.models import Cluster
    from nodepools.models import NodePool

    urls = tenant_urls(world)
    for name in ("portal:cluster-detail", "portal:nodepool-detail", "portal:node-detail"):
        assert viewer_client.get(urls[name]).status_code == 200
    page = viewer_client.get(urls["portal:cluster-detail"]).content.decode()
    assert "Delete…" not in page and "Add node pool" not in page and "kubeconfig" not in page
    assert viewer_client.get("/clusters/new").status_code == 403
    for name in (
        "portal:cluster-upgrade",
        "portal:cluster-delete",
        "portal:nodepool-create",
        "portal:nodepool-delete",
    ):
        assert viewer_client.get(urls[name]).status_code == 403, name
        assert viewer_client.post(urls[name]).status_code == 403, name
    assert viewer_client.post(urls["portal:nodepool-scale"], {"node_count": 3}).status_code == 403
    assert NodePool.objects.get(pk=world["pool"]).node_count == 1
    assert Cluster.objects.get(pk=world["cluster"]).phase == "RUNNING"
    assert viewer_client.get("/api-keys").status_code == 403
    assert viewer_client.get("/audit").status_code == 403


def test_pages_carry_their_content_in_the_html_without_javascript(alice_client, world):
    """Phase, pools, nodes and GPU UUIDs are in the server's HTML (htmx only refreshes it)."""
    from nodepools.models import Node

    node = Node.objects.get(pk=world["node"])
    html = alice_client.get(f"/clusters/{world['cluster']}").content.decode()
    assert '<span id="cluster-phase"><span class="badge ok">RUNNING</span></span>' in html
    assert 'data-pool="train"' in html
    assert node.name in html and node.gpu_uuids[0] in html
    # the live part polls its own URL every 2 s
    assert f'hx-get="/clusters/{world["cluster"]}?fragment=live" hx-trigger="every 2s"' in html
    fragment = alice_client.get(
        f"/clusters/{world['cluster']}?fragment=live", HTTP_HX_REQUEST="true"
    ).content.decode()
    assert fragment.startswith('<div id="cluster-live"') and "<html" not in fragment


class _Controls(HTMLParser):
    """Form controls (besides hidden inputs and buttons) and the ids labels point at."""

    def __init__(self) -> None:
        super().__init__()
        self.controls: list[str] = []
        self.labelled: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "label" and a.get("for"):
            self.labelled.add(a["for"])
        if tag in ("input", "select", "textarea") and a.get("type") not in ("hidden", "submit"):
            self.controls.append(a.get("id") or f"<{tag} name={a.get('name')} without id>")


def test_every_form_control_has_a_label(alice_client, ops_client, world, h100_host, tenant_a):
    pages = [
        (alice_client, "/clusters/new"),
        (alice_client, f"/clusters/{world['cluster']}/nodepools/new"),
        (alice_client, f"/clusters/{world['cluster']}/nodepools/{world['pool']}"),
        (alice_client, "/api-keys"),
        (alice_client, "/members"),
        (alice_client, "/audit"),
        (alice_client, "/usage"),
        (ops_client, f"/console/hosts/{h100_host.id}"),
        (ops_client, "/console/tenants"),
        (ops_client, f"/console/tenants/{tenant_a.id}"),
        (ops_client, "/console/prices"),
        (ops_client, "/console/hosts"),
        (ops_client, "/console/defrag"),
        (ops_client, "/console/xids"),
        (ops_client, "/console/health-rules"),
        (ops_client, f"/console/hosts/{h100_host.id}/confirm/drain"),
        (ops_client, f"/console/hosts/{h100_host.id}/confirm/retire"),
    ]
    for client, url in pages:
        parser = _Controls()
        parser.feed(client.get(url).content.decode())
        assert parser.controls, url
        unlabelled = [c for c in parser.controls if c not in parser.labelled]
        assert unlabelled == [], (url, unlabelled)


def test_the_portal_serves_its_vendored_assets_locally(client):
    """htmx and Chart.js come from /static (no CDN), with their licence headers."""
    from django.contrib.staticfiles import finders

    htmx = Path(finders.find("portal/vendor/htmx.min.js")).read_text()
    chart = Path(finders.find("portal/vendor/chart.umd.min.js")).read_text()
    assert htmx.startswith("/*! htmx.org 2.0.11") and "Zero-Clause BSD" in htmx.splitlines()[0]
    assert "Chart.js v4.6.1" in chart[:200] and "MIT License" in chart[:200]
    page = client.get("/login").content.decode()
    assert '<script src="/static/portal/vendor/htmx.min.js" defer></script>' in page
    assert "https://" not in page.split("<body")[0]
