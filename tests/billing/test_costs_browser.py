"""The usage page and the console's invoice alerts in Chromium (issue 33 items 1 and 2), with
screenshots for the docs: ``NVKE_SCREENSHOTS=docs/screenshots pytest
tests/billing/test_costs_browser.py`` writes ``usage-costs.png`` and
``console-missing-price.png`` (the month of ``test_costs_agree.py``: 19.86 USD, the invoice's
total, with the 0.93 USD reservation line; a GB200 node without a price)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.billing.test_costs_agree import NOW, build_month
from tests.portal.conftest import browser, login, portal_user, shots  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_usage_page_and_the_missing_price_alert_in_chromium(
    live_server,
    browser,  # noqa: F811
    shots,  # noqa: F811
    world,
    tenant_a,
    portal_user,  # noqa: F811
):
    from playwright.sync_api import expect

    from billing.invoices import build_invoice

    build_month(world, tenant_a)
    build_invoice(tenant_a.id, "2026-03", now=NOW)
    portal_user("alice", tenant_a, "owner")
    portal_user("ops", staff=True)
    page = login(browser, live_server.url, "alice", width=1280)
    page.goto("/usage?start=2026-03-01&end=2026-03-31")
    expect(page.locator("#total-cost")).to_have_text("19.86 USD")
    expect(page.locator("#by-reservation")).to_contain_text("short-block")
    expect(page.locator("#by-reservation")).to_contain_text("0.93 USD")
    expect(page.locator("#by-pool")).to_contain_text("10.00 USD")
    # the reserved pool's usage is named as covered (issue 33, a fresh-user trial)
    expect(page.locator("#by-pool")).to_contain_text(
        "0.493 GPU-h covered by reservation short-block"
    )
    expect(page.locator("#cost-window")).to_contain_text("2026-03-01 00:00 to 2026-04-01 00:00")
    shots(page, "usage-costs")
    page.context.close()

    # a GB200 node ran 2 h this week and the price sheet has no GB200 price
    host = world.make_host("gb200", gpus=4)
    pool = world.pool(tenant_a, name="gb", model="gb200", gpus_per_node=4)
    start = datetime.now(UTC) - timedelta(days=2)
    world.hold(pool, host, start, end=start + timedelta(hours=2))
    ops = login(browser, live_server.url, "ops", width=1280)
    ops.goto("/console/invoices")
    ops.get_by_role("button", name="Build drafts now").click()
    expect(ops.locator("body")).to_contain_text(
        "Cannot build tenant-a's invoice: no USD price for gb200 (whole GPU)"
    )
    expect(ops.locator("#missing-prices")).to_contain_text("no USD price for gb200")
    shots(ops, "console-missing-price")
    ops.context.close()
