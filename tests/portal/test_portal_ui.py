"""The portal of issue #20 in a real browser (Playwright driving Debian's Chromium against
Django's live server): live object views that refresh header, actions and badges; typed-name
confirmations; an invitation link used by a new member; the activity feed with the reason a
node upgrade waits; the role's navigation; copyable command-line equivalents; every page at
390 px without horizontal overflow; and axe-core (vendored, tests/portal/vendor/axe-core)
finding no WCAG 2 AA colour-contrast violation, at 1360 px and at 390 px.

The H100 host is SIMULATED infrastructure (``make_host``): no real H100 capture exists here.
Reconcilers are driven from the test (``tests.helpers.drive_cluster`` / ``drive_pool``), so the
page's changes come from the database the live server reads, picked up by htmx polling.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.helpers import drive_cluster, drive_pool
from tests.portal.conftest import TIMEOUT_MS, login

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"
AXE_VERSION = "4.14.1"
STRONG = "violet-anchor-harbour-42"


def axe_violations(page, rules: list[str] | None = None) -> list[dict]:
    """Run axe-core on the page; the violations of WCAG 2 A/AA rules (``rules``: only these)
    as ``[{"id", "impact", "nodes": [html …]}]``."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    assert page.evaluate("axe.version") == AXE_VERSION
    options = (
        {"runOnly": {"type": "rule", "values": rules}}
        if rules
        else {"runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa"]}}
    )
    result = page.evaluate("(options) => axe.run(document, options)", options)
    return [
        {
            "id": v["id"],
            "impact": v["impact"],
            "nodes": [
                n["html"][:160] + " " + n.get("failureSummary", "")[:200] for n in v["nodes"]
            ],
        }
        for v in result["violations"]
    ]


def overflow(page) -> int:
    """How many CSS pixels the page is wider than the viewport (0: no horizontal scroll)."""
    return page.evaluate(
        "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        " - window.innerWidth"
    )


def widest(page) -> list[str]:
    """The elements that reach past the viewport's right edge (to say what overflows)."""
    return page.evaluate(
        """() => Array.from(document.querySelectorAll('body *'))
            .filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5)
            .slice(0, 8).map(e => e.tagName + '.' + e.className + '#' + e.id
                + ' ' + Math.round(e.getBoundingClientRect().right))"""
    )


def test_live_views_confirmations_invitations_activity_layout_and_contrast(
    live_server, browser, catalog, make_host, portal_user, tmp_path, settings
):
    from playwright.sync_api import expect

    # invitation links name the public URL (issue 26), here the live server
    settings.NVKE_PUBLIC_URL = live_server.url

    from clusters.models import Cluster
    from clusters.services import create_cluster, update_cluster
    from nodepools.models import NodePool
    from nodepools.reconcile import reconcile_nodepool
    from nodepools.services import create_nodepool
    from nodepools.upgrades import upgrade_nodepool
    from tenants.models import Membership, Tenant
    from tenants.principal import Principal

    expect.set_options(timeout=TIMEOUT_MS)
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="sim-h100-01")
    acme = Tenant.objects.create(name="acme")
    portal_user("alice", acme, "owner")
    portal_user("vera", acme, "viewer")
    owner = Principal(acme, "owner", False, "user:alice")
    op = create_cluster(principal=owner, name="llm", kubernetes_version="1.36", region="us-east-1")
    cluster = Cluster.objects.get(pk=op.target_id)

    # --- live object view: header actions and badges change without a reload
    page = login(browser, live_server.url, "alice", bypass_csp=True)
    expect(page).to_have_url(f"{live_server.url}/clusters")
    page.goto(f"/clusters/{cluster.id}")
    page.evaluate("window.__same_page = true")
    expect(page.locator("#cluster-phase")).to_have_text("PROVISIONING")
    expect(page.get_by_role("link", name="Download kubeconfig")).to_have_count(0)
    drive_cluster(cluster.id)  # the reconciler brings the control plane up
    expect(page.locator("#cluster-phase")).to_have_text("RUNNING")
    expect(page.get_by_role("link", name="Download kubeconfig")).to_be_visible()  # header action
    cluster.refresh_from_db()
    expect(page.locator("#cluster-live dl.facts")).to_contain_text(cluster.endpoint)
    assert page.evaluate("window.__same_page") is True

    pool_op = create_nodepool(
        principal=owner,
        cluster=cluster,
        name="train",
        gpu_model="h100-sxm5-80gb",
        gpus_per_node=2,
        node_count=1,
        isolation={"mode": "exclusive"},
    )
    pool = NodePool.objects.get(pk=pool_op.target_id)
    page.goto(f"/clusters/{cluster.id}/nodepools/{pool.id}")
    page.evaluate("window.__same_page = true")
    drive_pool(pool.id)
    expect(page.locator("#pool-phase")).to_have_text("RUNNING")
    expect(page.locator("#pool-live tr[data-node]")).to_have_count(1)
    assert page.evaluate("window.__same_page") is True

    # --- the copyable command line of the scale form is the real nvkectl command
    scale_cli = page.locator("details[data-cli]").first
    scale_cli.locator("summary").click()
    expect(scale_cli.locator('pre[data-cli="nvkectl"]')).to_have_text(
        "nvkectl nodepools scale llm train --nodes 1"
    )

    # --- a node upgrade outside the maintenance window says why it waits, in the feed
    update_cluster(
        principal=owner,
        cluster=cluster,
        maintenance_policy={
            "time_zone": "Europe/Berlin",
            "windows": [{"days": ["sat"], "start": "02:00", "end": "06:00"}],
        },
    )
    upgrade_nodepool(principal=owner, pool=pool, driver_version="580.95.05")
    # Wed 2026-12-02 03:00 UTC: the window opens Sat 02:00 Berlin time
    reconcile_nodepool(pool.id, now=datetime(2026, 12, 2, 3, 0, tzinfo=UTC))
    page.locator("#pool-live .actions").get_by_role("link", name="Activity").click()
    expect(page.locator("h1")).to_have_text("Activity of node pool train")
    upgrade_entry = page.locator('li[data-kind="operation"]', has_text="UPGRADE_NODES")
    expect(upgrade_entry).to_contain_text(
        "waiting for the maintenance window Sat 02:00 Europe/Berlin"
    )

    # --- typed-name confirmation: the button stays disabled until the name is typed
    page.goto(f"/clusters/{cluster.id}/nodepools/{pool.id}/delete")
    expect(page.locator("#disruption")).to_contain_text("1 node(s)")
    expect(page.locator("#disruption")).to_contain_text("2 GPU(s)")
    button = page.get_by_role("button", name="Delete node pool")
    expect(button).to_be_disabled()
    page.get_by_label("Type train to confirm").fill("trai")
    expect(button).to_be_disabled()
    page.get_by_label("Type train to confirm").fill("train")
    expect(button).to_be_enabled()
    button.click()
    expect(page.locator(".msg.success")).to_contain_text("Node pool train is being deleted.")
    assert NodePool.objects.get(pk=pool.id).phase == "DELETING"

    # --- an owner invites bob; bob opens the link, sets his own password and is in
    page.goto("/members")
    page.get_by_label("Email").fill("bob@example.com")
    page.locator("#invite_role").select_option("member")
    page.get_by_role("button", name="Create invitation link").click()
    link = page.locator("#invite-url").input_value()
    assert "/invite/" in link
    guest = browser.new_context(base_url=live_server.url).new_page()
    guest.goto(link)
    expect(guest.locator("h1")).to_have_text("Join acme")
    guest.get_by_label("Username").fill("bob")
    guest.get_by_label("Password", exact=True).fill("short")
    guest.get_by_label("Password again").fill("short")
    guest.get_by_role("button", name="Create account and join").click()
    expect(guest.locator("#id_new_password1-error")).to_contain_text("too short")
    guest.get_by_label("Password", exact=True).fill(STRONG)
    guest.get_by_label("Password again").fill(STRONG)
    guest.get_by_role("button", name="Create account and join").click()
    expect(guest.locator(".msg.success")).to_contain_text("Welcome to acme: you are member.")
    assert Membership.objects.get(user__username="bob", tenant=acme).role == "member"
    guest.goto(link)  # single use
    expect(guest.locator("#invite-reason")).to_have_text("this invitation link was already used")

    # --- the navigation shows what the role can do (a viewer: no API keys, no audit log)
    viewer = login(browser, live_server.url, "vera")
    sections = viewer.locator('nav[aria-label="sections"] a').all_inner_texts()
    assert sections == ["Clusters", "Activity", "Usage & cost", "Invoices", "Members", "Quotas"]
    viewer.goto(f"/clusters/{cluster.id}")
    expect(viewer.get_by_role("link", name="Add node pool")).to_have_count(0)

    # --- every tenant page fits 390 px and passes axe-core's colour-contrast rule
    pages = [
        "/clusters",
        f"/clusters/{cluster.id}",
        f"/clusters/{cluster.id}/nodepools/{pool.id}",
        f"/clusters/{cluster.id}/nodepools/new",
        f"/clusters/{cluster.id}/delete",
        f"/clusters/{cluster.id}/activity",
        "/activity",
        "/members",
        "/usage",
        "/quotas",
        "/api-keys",
        "/audit",
    ]
    narrow = login(browser, live_server.url, "alice", width=390, bypass_csp=True)
    found: dict[str, list] = {}
    for path in pages:
        for p in (page, narrow):
            p.goto(path)
            p.wait_for_load_state("networkidle")
            width = p.viewport_size["width"]
            if width == 390:
                assert overflow(p) <= 0, (path, overflow(p), widest(p))
            violations = axe_violations(p, ["color-contrast"])
            if violations:
                found[f"{path} @ {width}px"] = violations
    assert found == {}, json.dumps(found, indent=1)
    # the login page too (anonymous)
    anonymous = browser.new_context(
        viewport={"width": 390, "height": 844}, base_url=live_server.url, bypass_csp=True
    ).new_page()
    anonymous.goto("/login")
    assert overflow(anonymous) <= 0
    assert axe_violations(anonymous, ["color-contrast"]) == []
    # the favicon is served
    icon = anonymous.locator('link[rel="icon"]').get_attribute("href")
    assert anonymous.request.get(live_server.url + icon).status == 200
