"""The console's price, quota and invoice rules (#20) in a real browser (Playwright on Debian's
Chromium against Django's live server), asserting the values the pages show: a negative price
is refused next to its field (never a 500), a second currency in the list sheet is refused
until it is made explicit, a quota below current use shows its warning and saves only when
confirmed, and no invoice is built or listed for the month before the tenant existed.

The H100 host is a SIMULATED row (``make_host``); prices, quotas and invoices are the real code
on the real database. The invoice build runs the billing worker's task in the test (what the
worker runs for the console's message), so no worker process is needed.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from tests.helpers import running_exclusive_pool
from tests.portal.conftest import TIMEOUT_MS, login

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_price_quota_and_invoice_rules_in_the_browser(
    live_server, browser, catalog, make_host, portal_user
):
    from django.utils import timezone
    from playwright.sync_api import expect

    from billing.aggregation import get_account
    from billing.models import Invoice, Price
    from billing.periods import period_of
    from billing.tasks import build_tenant_invoices
    from tenants.models import Quota, Tenant
    from tenants.principal import Principal

    expect.set_options(timeout=TIMEOUT_MS)
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="sim-h100-01")
    acme = Tenant.objects.create(name="acme")
    portal_user("ops", staff=True)
    owner = Principal(acme, "owner", False, "user:alice")
    running_exclusive_pool(owner, gpus_per_node=1, node_count=1)  # 1 cluster, 1 node, 1 H100
    ops = login(browser, live_server.url, "ops")

    # --- a negative price: refused next to the rate, nothing stored, the page answers
    ops.goto("/console/prices")

    def publish(rate: str, currency: str, when: str):
        ops.get_by_label("GPU model").select_option("h100-sxm5-80gb")
        ops.get_by_label("Hourly rate per GPU-hour").fill(rate)
        ops.get_by_label("Currency (ISO 4217)").fill(currency)
        ops.get_by_label("Effective from (UTC)").fill(when)
        with ops.expect_navigation() as nav:
            ops.get_by_role("button", name="Publish").click()
        return nav.value

    response = publish("-2.50", "USD", "2026-01-01T00:00")
    assert response.status < 500
    expect(ops.locator("#id_hourly_rate-error")).to_contain_text(
        "hourly_rate must lie in [0, 99999999]"
    )
    assert not Price.objects.exists()
    expect(ops.get_by_role("table", name="prices")).to_contain_text(
        "No prices: usage cannot be invoiced until there is one."
    )
    # --- a good one is listed with its value
    publish("2.50", "USD", "2026-01-01T00:00")
    expect(ops.get_by_role("table", name="prices")).to_contain_text("2.5 USD")
    assert Price.objects.get().hourly_rate == Decimal("2.500000")

    # --- a second currency in the list sheet: refused beside the currency field ...
    publish("2.30", "EUR", "2026-02-01T00:00")
    expect(ops.locator("#id_currency-error")).to_contain_text("the list price sheet is in USD")
    expect(ops.locator("#id_currency-error")).to_contain_text("currency_not_of_sheet")
    assert Price.objects.count() == 1
    # ... and accepted once made explicit: the sheet then lists both
    ops.get_by_label(
        "a currency this price sheet does not use yet (a second sheet currency)"
    ).check()
    ops.get_by_role("button", name="Publish").click()
    expect(ops.get_by_role("table", name="prices")).to_contain_text("2.3 EUR")
    assert sorted(Price.objects.values_list("currency", flat=True)) == ["EUR", "USD"]
    Price.objects.filter(currency="EUR").delete()  # the invoice below is in USD

    # --- a quota below current use (1 node, 1 H100 in use) shows its warning, saves nothing
    ops.goto(f"/console/tenants/{acme.id}")
    before = Quota.objects.get(tenant=acme)
    ops.get_by_label("Max clusters").fill("5")
    ops.get_by_label("Max nodes").fill("0")
    ops.get_by_label("Max GPUs per model").fill("h100-sxm5-80gb=0")
    ops.get_by_role("button", name="Set limits").click()
    warning = ops.locator("#below-use")
    expect(warning).to_contain_text("nodes: limit 0 is below the 1 in use (1 reserved)")
    expect(warning).to_contain_text(
        "GPUs h100-sxm5-80gb: limit 0 is below the 1 in use (1 reserved)"
    )
    assert "clusters" not in warning.locator("ul").inner_text()  # 5 >= 1 in use
    after = Quota.objects.get(tenant=acme)
    assert (after.max_nodes, after.max_gpus) == (before.max_nodes, before.max_gpus)
    warning.get_by_role("checkbox").check()
    ops.get_by_role("button", name="Set limits").click()
    expect(ops.locator(".msg").first).to_contain_text(
        "Below use: nodes: limit 0 is below the 1 in use"
    )
    saved = Quota.objects.get(tenant=acme)
    assert (saved.max_clusters, saved.max_nodes, saved.max_gpus) == (
        5,
        0,
        {"h100-sxm5-80gb": 0},
    )

    # --- invoices: "Build drafts now" builds the current month only; the month before the
    # tenant existed is neither built nor listed
    ops.goto("/console/invoices")
    ops.get_by_role("button", name="Build drafts now").click()
    expect(ops.locator(".msg.success")).to_contain_text(
        "Draft invoices of 1 tenant(s) are being built."
    )
    build_tenant_invoices(str(acme.id))  # what the billing worker runs for that message
    now = timezone.now()
    tz = get_account(acme.id).time_zone
    current = period_of(tz, now)
    previous = period_of(tz, current.start - timedelta(seconds=1))
    ops.goto("/console/invoices")
    table = ops.get_by_role("table", name="invoices")
    rows = table.locator("tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("acme")
    expect(rows.first).to_contain_text(current.label)
    expect(rows.first).to_contain_text("DRAFT")
    expect(table).not_to_contain_text(previous.label)
    assert list(Invoice.objects.values_list("period_label", flat=True)) == [current.label]
