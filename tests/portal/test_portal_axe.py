"""axe-core's whole WCAG 2 A/AA rule set (tags ``wcag2a``, ``wcag2aa``, ``wcag21a``,
``wcag21aa``), not only colour contrast, on the main portal and console pages at 1280 px and
390 px (Playwright on Debian's Chromium; axe-core vendored in tests/portal/vendor/axe-core).

The runner is first shown to fail: on a page with known violations (an image without a text
alternative, an input without a label, a link without a name, a button without a name) it
reports exactly those rules. Hosts are SIMULATED rows (``make_host``).
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import running_exclusive_pool
from tests.portal.conftest import login
from tests.portal.test_portal_ui import AXE, AXE_VERSION

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WCAG_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]

BAD_SNIPPET = """<!doctype html><html lang="en"><head><title>bad</title></head><body>
<main><h1>Bad page</h1>
<img src="data:image/gif;base64,R0lGODlhAQABAAAAACw=">
<input type="text" name="q">
<a href="/x"></a>
<button></button>
</main></body></html>"""


def wcag_violations(page) -> dict[str, list[str]]:
    """``{rule id: [offending element's html, …]}`` of axe-core's WCAG 2.0/2.1 A and AA
    rules on ``page`` (every rule with those tags, colour contrast included)."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    assert page.evaluate("axe.version") == AXE_VERSION
    result = page.evaluate(
        "(tags) => axe.run(document, {runOnly: {type: 'tag', values: tags}})", WCAG_AA
    )
    return {v["id"]: [n["html"][:200] for n in v["nodes"]] for v in result["violations"]}


def test_the_axe_runner_reports_a_page_with_known_violations(browser):
    page = browser.new_context(bypass_csp=True).new_page()
    page.set_content(BAD_SNIPPET)
    found = wcag_violations(page)
    assert {"image-alt", "label", "link-name", "button-name"} <= set(found), found
    assert found["label"] == ['<input type="text" name="q">']


def test_portal_and_console_pages_pass_axe_wcag_a_and_aa(
    live_server, browser, catalog, make_host, portal_user
):
    from fleet.models import Host
    from tenants.models import Tenant
    from tenants.principal import Principal

    host = make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="sim-h100-01")
    acme = Tenant.objects.create(name="acme")
    portal_user("alice", acme, "owner")
    portal_user("ops", staff=True)
    owner = Principal(acme, "owner", False, "user:alice")
    cluster_id, pool_id = running_exclusive_pool(owner, gpus_per_node=1, node_count=1)
    assert Host.objects.filter(pk=host.pk).exists()

    tenant_pages = [
        "/clusters",
        f"/clusters/{cluster_id}",
        f"/clusters/{cluster_id}/nodepools",
        f"/clusters/{cluster_id}/operations",
        f"/clusters/{cluster_id}/nodepools/{pool_id}",
        f"/clusters/{cluster_id}/nodepools/new",
        f"/clusters/{cluster_id}/delete",
        "/activity",
        "/members",
        "/usage",
        "/invoices",
        "/quotas",
        "/api-keys",
        "/audit",
    ]
    console_pages = [
        "/console/",
        "/console/hosts",
        f"/console/hosts/{host.id}",
        f"/console/hosts/{host.id}/confirm/drain",
        "/console/xids",
        "/console/tenants",
        f"/console/tenants/{acme.id}",
        "/console/prices",
        "/console/invoices",
        "/console/defrag",
    ]
    found: dict[str, dict] = {}
    for user, paths in (("alice", tenant_pages), ("ops", console_pages)):
        for width in (1280, 390):
            page = login(browser, live_server.url, user, width=width, bypass_csp=True)
            for path in paths:
                response = page.goto(path)
                assert response.status == 200, (path, response.status)
                page.wait_for_load_state("networkidle")
                violations = wcag_violations(page)
                if violations:
                    found[f"{path} @ {width}px"] = violations
            page.context.close()
    anonymous = browser.new_context(base_url=live_server.url, bypass_csp=True).new_page()
    for path in ("/login", "/password-reset"):
        anonymous.goto(path)
        if violations := wcag_violations(anonymous):
            found[path] = violations
    assert found == {}, json.dumps(found, indent=1)
