"""The operator console in a real browser (Playwright on Debian's Chromium, as in
``test_portal_browser.py``) against Django's live server and a real Celery worker.

An operator drains a host into maintenance: the confirmation page lists the nodes that will
move and wants the host's name typed; then the host page shows, without a reload (htmx polling),
each node moving off the host as the worker's node pool reconciler moves it: its replacement
on the spare host, one node paused by a pod whose PodDisruptionBudget allows no disruption (the
blocker named), the forced drain, the host in MAINTENANCE. The Xid events page filters by
severity, host, code and time, and pages.

Hosts are SIMULATED rows (``make_host``); the blocking pod is the simulated provider's
(:func:`clusters.providers.simulated.simulate_drain_blockers`), as a real cluster's
PodDisruptionBudget would report it. Xid rows are written as agent ingestion stores them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.e2e.conftest import start_worker, stop, wait_for
from tests.helpers import running_exclusive_pool
from tests.portal.conftest import TIMEOUT_MS, login

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

BLOCKER = "default/trainer-0 (PodDisruptionBudget trainer allows 0 disruptions)"


def two_nodes_on_one_host(make_host, portal_user):
    """Tenant acme's pool ``train`` of 2 x 4-GPU H100 nodes, both on sim-h100-01 (8 GPUs)."""
    from tenants.models import Tenant
    from tenants.principal import Principal

    host = make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="sim-h100-01")
    acme = Tenant.objects.create(name="acme")
    portal_user("ops", staff=True)
    owner = Principal(acme, "owner", False, "user:alice")
    _cluster_id, pool_id = running_exclusive_pool(owner, gpus_per_node=4, node_count=2)
    return host, pool_id


def test_an_operator_drains_a_host_and_watches_its_nodes_move_live(
    live_server, browser, catalog, make_host, portal_user, tmp_path
):
    from playwright.sync_api import expect

    from clusters.providers.simulated import simulate_drain_blockers
    from fleet.models import Host
    from nodepools.models import Node

    expect.set_options(timeout=TIMEOUT_MS)
    host, pool_id = two_nodes_on_one_host(make_host, portal_user)
    first, second = Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name")
    assert {first.host_id, second.host_id} == {host.id}
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="sim-h100-02")  # room
    proc, log = start_worker(tmp_path, NVKE_HOST_DRAIN_TIMEOUT_S="1")
    try:
        # after the worker's start: it flushes the broker's Redis database, the cache's too
        simulate_drain_blockers(second.id, [BLOCKER])
        ops = login(browser, live_server.url, "ops")
        ops.goto(f"/console/hosts/{host.id}")
        expect(ops.locator("#host-state")).to_have_text("ALLOCATED")
        ops.get_by_role("link", name="Maintenance…").click()

        # the confirmation: what moves, and the host's name typed (a wrong one is refused)
        disrupted = ops.locator("#disrupted-nodes tbody tr")
        expect(disrupted).to_have_count(2)
        expect(ops.locator("#disrupted-nodes")).to_contain_text(first.name)
        expect(ops.locator("#disrupted-nodes")).to_contain_text(second.name)
        expect(ops.locator("#disruption")).to_contain_text("2 node(s) of 1 tenant(s) (acme)")
        ops.get_by_label("Type the host's name to confirm").fill("sim-h100-1")
        ops.get_by_role("button", name="Enter maintenance sim-h100-01").click()
        expect(ops.locator("#id_confirm_name-error")).to_contain_text("type sim-h100-01")
        assert Host.objects.get(pk=host.pk).state == "ALLOCATED"
        ops.get_by_label("Type the host's name to confirm").fill("sim-h100-01")
        ops.get_by_role("button", name="Enter maintenance sim-h100-01").click()

        # the host page follows the worker's moves without a reload
        expect(ops.locator("#host-state")).to_have_text("CORDONED")
        ops.evaluate("window.__same_page = true")
        first_row = ops.locator(f'#drain-nodes tr[data-node="{first.name}"]')
        second_row = ops.locator(f'#drain-nodes tr[data-node="{second.name}"]')
        expect(first_row.locator(".move")).to_have_text("moved")
        expect(first_row.locator(".replacement")).to_contain_text("READY on sim-h100-02")
        expect(second_row.locator(".move")).to_have_text("drain-blocked")
        expect(second_row.locator(".blocker")).to_contain_text(
            "PodDisruptionBudget trainer allows 0 disruptions"
        )
        expect(ops.locator("#drain-progress h2")).to_contain_text(
            "draining to MAINTENANCE: 1 of 2 node(s) moved, 1 pending"
        )
        assert ops.evaluate("window.__same_page") is True
        assert Host.objects.get(pk=host.pk).state == "CORDONED"

        # drain again with force: the pod is evicted, the last node moves, the host is empty
        ops.get_by_label("Drain, then enter").select_option("MAINTENANCE")
        ops.get_by_role("button", name="Drain…").click()
        ops.get_by_label("Force (evict pods that block a drain)").check()
        ops.get_by_label("Type the host's name to confirm").fill("sim-h100-01")
        ops.get_by_role("button", name="Drain sim-h100-01").click()
        ops.evaluate("window.__same_page = true")
        expect(ops.locator("#host-state")).to_have_text("MAINTENANCE")
        expect(second_row.locator(".move")).to_have_text("moved")
        expect(ops.locator("#host-reason")).to_contain_text(
            "drained to MAINTENANCE: 2 of 2 node(s) moved, none pending"
        )
        assert ops.evaluate("window.__same_page") is True
        ready = wait_for(
            lambda: (
                list(
                    Node.objects.filter(nodepool_id=pool_id, phase="READY").values_list(
                        "host__hostname", flat=True
                    )
                )
                == ["sim-h100-02", "sim-h100-02"]
            ),
            what="two replacements READY on the spare host",
        )
        assert ready
        assert set(
            Node.objects.filter(pk__in=[first.pk, second.pk]).values_list("phase", "move_state")
        ) == {("DELETED", "moved")}
    finally:
        simulate_drain_blockers(second.id, [])
        stop(proc)
        log.close()


def test_an_operator_filters_xid_events_and_pages_through_them(
    live_server, browser, catalog, make_host, portal_user
):
    """alpha: 55 x Xid 31 (warning, RESTART_APP) from 2026-10-01 00:00, one a second; beta:
    Xid 79 (critical, RESTART_BM) at 2026-11-01 00:00 and Xid 48 (critical) at 00:05."""
    from playwright.sync_api import expect

    from fleet.models import XidEvent

    expect.set_options(timeout=TIMEOUT_MS)
    portal_user("ops", staff=True)
    alpha = make_host("h100-sxm5-80gb", gpus=1, hostname="alpha")
    beta = make_host("h100-sxm5-80gb", gpus=1, hostname="beta")
    a0 = alpha.gpus.get().uuid
    b0 = beta.gpus.get().uuid
    start = datetime(2026, 10, 1, tzinfo=UTC)
    XidEvent.objects.bulk_create(
        XidEvent(host=alpha, gpu_uuid=a0, ts=start + timedelta(seconds=i), xid=31, report_seq=i)
        for i in range(55)
    )
    nov = datetime(2026, 11, 1, tzinfo=UTC)
    XidEvent.objects.create(host=beta, gpu_uuid=b0, ts=nov, xid=79, report_seq=1)
    XidEvent.objects.create(
        host=beta, gpu_uuid=b0, ts=nov + timedelta(minutes=5), xid=48, report_seq=2
    )

    ops = login(browser, live_server.url, "ops")
    ops.get_by_role("link", name="Xid events").first.click()
    rows = ops.locator("#xid-events tbody tr")
    expect(rows).to_have_count(50)  # 57 events, 50 a page
    expect(ops.locator("h2").filter(has_text="event(s)")).to_contain_text("57 event(s)")
    expect(rows.first).to_contain_text("48")  # newest first
    ops.get_by_role("link", name="older →").click()
    expect(rows).to_have_count(7)

    ops.get_by_label("Severity (catalog)").select_option("critical")
    ops.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("ROBUST_CHANNEL_GPU_ECC_DBE")
    expect(rows.nth(1)).to_contain_text("RESTART_BM")

    ops.get_by_label("Xid", exact=True).select_option("79")
    ops.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("beta")

    ops.get_by_role("link", name="Clear").click()
    ops.get_by_label("Host").select_option(label="alpha")
    ops.get_by_label("Action (catalog)").select_option("RESTART_APP")
    ops.get_by_label("From (UTC)").fill("2026-10-01T00:00")
    ops.get_by_label("To (UTC)").fill("2026-10-01T00:01")  # the first 60 s: all 55
    ops.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(50)
    expect(ops.locator("h2").filter(has_text="event(s)")).to_contain_text("55 event(s)")
    ops.get_by_role("link", name="older →").click()
    expect(rows).to_have_count(5)
    assert "host=" in ops.url and "page=2" in ops.url
