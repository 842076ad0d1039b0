"""The console's Health rules page in a real browser (Playwright on Debian's Chromium against
Django's live server): an operator overrides Xid 31 ("3 times in 10 min -> GPU reset, then a
node reboot"), sees it in the table as the operator's version 1, has a bad threshold refused
next to its field, restores the catalog default, and resumes an open circuit breaker."""

from __future__ import annotations

import pytest

from tests.portal.conftest import TIMEOUT_MS, login

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_an_operator_tunes_a_rule_and_resumes_a_breaker_in_the_browser(
    live_server, browser, catalog, portal_user
):
    from django.utils import timezone
    from playwright.sync_api import expect

    from fleet.models import BreakerTrip, HealthRule

    expect.set_options(timeout=TIMEOUT_MS)
    portal_user("ops", staff=True)
    BreakerTrip.objects.create(
        scope="model:h100-sxm5-80gb", tripped_at=timezone.now(), reason="budget 1 used up"
    )
    ops = login(browser, live_server.url, "ops")
    ops.goto("/console/health-rules")
    expect(ops.locator('tr[data-key="xid-79"]')).to_contain_text(
        "node_reboot → replace → hardware_ticket"
    )

    def save(threshold: str):
        ops.get_by_label("Rule key").fill("xid-31")
        ops.get_by_label("Occurrences").fill(threshold)
        ops.get_by_label("Within (s, 0 = no window)").fill("600")
        ops.get_by_label("Condition").fill("GpuMemoryFaults")
        ops.get_by_label("GPU reset", exact=True).check()
        ops.get_by_label("node reboot", exact=True).check()
        ops.get_by_label("Escalate if it recurs within (s)").fill("3600")
        with ops.expect_navigation() as nav:
            ops.get_by_role("button", name="Save rule").click()
        return nav.value

    response = save("0")
    assert response.status == 400
    expect(ops.locator("#id_threshold_count-error")).to_be_visible()
    assert not HealthRule.objects.exists()

    ops.goto("/console/health-rules")
    save("3")
    row = ops.locator('tr[data-key="xid-31"]')
    expect(row).to_contain_text("operator v1")
    expect(row).to_contain_text("gpu_reset → node_reboot")
    assert HealthRule.objects.get().threshold_count == 3

    with ops.expect_navigation():
        row.get_by_role("button", name="restore default").click()
    expect(ops.locator('tr[data-key="xid-31"]')).to_have_count(0)

    trip = ops.locator('tr[data-scope="model:h100-sxm5-80gb"]')
    expect(trip).to_contain_text("budget 1 used up")
    with ops.expect_navigation():
        trip.get_by_role("button", name="Resume automation").click()
    expect(ops.locator("#breaker-trips")).to_contain_text("No breaker is open")
    assert BreakerTrip.objects.get().resumed_by.startswith("user:")
