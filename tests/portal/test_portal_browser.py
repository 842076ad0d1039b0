"""The portal in a real browser: Playwright drives Debian's Chromium (``/usr/bin/chromium``,
no browser download) against Django's live server and a real Celery worker.

A tenant owner logs in, creates a cluster and watches its phase turn RUNNING in the list (htmx
polling, no reload), is refused a MIG layout that does not fit an H100 (the reason next to the
layout field), creates an H100 MIG pool (1g.10gb on every GPU), watches it reach RUNNING,
downloads the kubeconfig, asks for a usage recomputation and reads GPU-hours and cost. An
operator cordons a host in the console. ``test_portal_screenshots.py`` takes the README's
screenshots with the same browser.

The H100 host is SIMULATED infrastructure (``make_host``): no real H100 capture exists here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from tests.e2e.conftest import wait_for
from tests.portal.conftest import TIMEOUT_MS, login

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_new_tenant_gets_an_h100_mig_pool_and_its_cost_and_an_operator_cordons_a_host(
    live_server, worker, browser, catalog, make_host, portal_user, tmp_path
):
    from playwright.sync_api import expect

    from billing.models import UsageRecord
    from billing.prices import set_price
    from clusters.kubeconfig_names import context_name, rename_kubeconfig
    from clusters.models import Cluster
    from fleet.models import Host, HostEvent
    from nodepools.models import NodePool
    from nvke import crypto
    from tenants.models import AuditEvent, Tenant

    expect.set_options(timeout=TIMEOUT_MS)
    host = make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="sim-h100-01")
    make_host("a10g", gpus=4, zone="us-west-2a", hostname="sim-a10g-01")
    acme = Tenant.objects.create(name="acme")
    portal_user("alice", acme, "owner")
    portal_user("ops", staff=True)
    set_price(
        gpu_model="h100-sxm5-80gb",
        hourly_rate=Decimal("2.50"),
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
        label="demo list price",
    )

    # --- the tenant owner logs in and creates a cluster
    page = login(browser, live_server.url, "alice")
    expect(page).to_have_url(f"{live_server.url}/clusters")
    page.get_by_role("link", name="Create cluster").click()
    page.get_by_label("Name").fill("llm")
    page.get_by_label("Kubernetes version").select_option("1.36")
    page.get_by_label("Region").select_option("us-east-1")
    page.get_by_role("button", name="Create cluster").click()
    expect(page.locator("h1")).to_have_text("Cluster llm")
    cluster = Cluster.objects.get(tenant=acme, name="llm")

    # the list's phase cell turns RUNNING by htmx polling, without reloading the page
    page.goto("/clusters")
    page.evaluate("window.__same_page = true")
    row = page.locator('tr[data-cluster="llm"] .phase')
    expect(row).to_have_text("RUNNING")
    assert page.evaluate("window.__same_page") is True

    # --- a MIG layout that does not fit one H100 is refused next to the layout field
    page.get_by_role("link", name="llm").click()
    page.get_by_role("link", name="Add node pool").click()
    page.get_by_label("Name").fill("mig")
    gpu_models = page.get_by_label("GPU model").locator("option").all_inner_texts()
    assert len(gpu_models) == 1 and gpu_models[0].startswith("H100-SXM5-80GB (h100-sxm5-80gb)")
    page.get_by_label("GPUs per node").fill("1")
    page.get_by_label("Nodes").fill("1")
    page.get_by_label("Isolation").select_option("mig")
    layout = page.get_by_label("or a mixed MIG layout per GPU")
    expect(layout).to_be_visible()  # shown for mode "mig" by CSS alone
    layout.fill("3g.40gb=2, 1g.10gb=1")
    page.get_by_role("button", name="Create node pool").click()
    error = page.locator("#id_mig_layout-error")
    expect(error).to_contain_text("does not fit one h100-sxm5-80gb")
    expect(error).to_contain_text("needs 9 memory slices")
    expect(error.locator("code")).to_have_text("mig_layout_does_not_fit")
    assert not NodePool.objects.filter(cluster=cluster).exists()

    # --- the same form with one profile on every GPU: check, then create
    page.get_by_label("or a mixed MIG layout per GPU").fill("")
    page.get_by_label("MIG profile (the same on every GPU)").select_option("1g.10gb")
    page.get_by_role("button", name="Check (nothing is created)").click()
    expect(page.locator("#dry-run")).to_contain_text("nvidia.com/gpu: 7")
    # capacity, quota and cost of the dry run: 8 H100 free, none reserved; the default quota
    # of 512 GPUs less this pool's 1; 1 GPU x 2.50 USD per hour
    expect(page.locator("#dry-run-capacity")).to_contain_text("needs 1; 8 free on-demand")
    expect(page.locator("#dry-run-quota")).to_contain_text("511 of 512 left after it")
    expect(page.locator("#dry-run-cost")).to_contain_text("2.50 USD")
    assert not NodePool.objects.filter(cluster=cluster).exists()
    page.get_by_role("button", name="Create node pool").click()
    expect(page.locator("h1")).to_have_text("Node pool mig")
    expect(page.locator("#pool-phase")).to_have_text("RUNNING")
    pool = NodePool.objects.get(cluster=cluster, name="mig")
    (node,) = pool.nodes.all()
    assert node.host_id == host.id and len(node.gpu_uuids) == 1
    expect(page.locator(f'tr[data-node="{node.name}"]')).to_contain_text(node.gpu_uuids[0])
    expect(page.locator(f'tr[data-node="{node.name}"]')).to_contain_text("1g.10gb")

    # --- the kubeconfig downloads (served by the API with the same session)
    page.get_by_role("link", name="llm").first.click()
    expect(page.locator("#cluster-phase")).to_have_text("RUNNING")
    with page.expect_download() as download:
        page.get_by_role("link", name="Download kubeconfig").click()
    saved = tmp_path / "llm.kubeconfig"
    download.value.save_as(saved)
    cluster.refresh_from_db()
    assert download.value.suggested_filename == "llm.kubeconfig"
    # the stored kubeconfig, its entries named nvke_<tenant>_<region>_<cluster>
    expected = rename_kubeconfig(
        crypto.decrypt(cluster.kubeconfig_encrypted),
        context_name(tenant=cluster.tenant.name, region=cluster.region, cluster="llm"),
    )
    assert saved.read_text() == expected
    assert "kind: Config" in saved.read_text()
    assert AuditEvent.objects.filter(action="cluster.kubeconfig.read", actor="user:alice").exists()

    # --- usage: the billing worker recomputes on request; GPU-hours and cost appear
    page.get_by_role("link", name="Usage & cost").click()
    page.get_by_role("button", name="Recompute now").click()
    expect(page.locator(".msg.success")).to_contain_text("being recomputed")
    wait_for(lambda: UsageRecord.objects.filter(tenant=acme).exists(), what="usage records")
    page.reload()
    seconds = sum(r.gpu_seconds for r in UsageRecord.objects.filter(tenant=acme))
    hours = seconds / 3600
    cost = (seconds * Decimal("2.50") / 3600).quantize(Decimal("0.01"))
    assert seconds > 0
    expect(page.locator("#total-gpu-hours")).to_have_text(f"{hours:,.3f}")
    expect(page.locator("#total-cost")).to_have_text(f"{cost:f} USD")
    expect(page.locator("#by-cluster")).to_contain_text("llm")
    expect(page.locator("#by-model")).to_contain_text("h100-sxm5-80gb")
    assert page.evaluate("Chart.getChart('usage-chart').data.datasets[0].data.length") >= 1

    # --- an operator cordons the H100 host from the console
    ops = login(browser, live_server.url, "ops")
    expect(ops).to_have_url(f"{live_server.url}/console/")
    expect(ops.locator("#gpus-by-model")).to_contain_text("h100-sxm5-80gb")
    ops.get_by_role("link", name="Hosts", exact=True).click()
    ops.get_by_role("link", name="sim-h100-01").click()
    expect(ops.locator("#host-state")).to_have_text("ALLOCATED")
    ops.get_by_label("Reason (optional)").fill("fan noise")
    ops.get_by_role("button", name="Cordon", exact=True).click()
    expect(ops.locator("#host-state")).to_have_text("CORDONED")
    expect(ops.locator("#host-events")).to_contain_text("cordon: fan noise")
    host.refresh_from_db()
    assert host.state == "CORDONED"
    assert HostEvent.objects.filter(host=host, actor="user:ops", message="cordon: fan noise")
    assert AuditEvent.objects.filter(action="host.cordon", target_id=str(host.id)).exists()
    assert Host.objects.get(hostname="sim-a10g-01").state == "AVAILABLE"
    ops.get_by_role("link", name="Tenants").first.click()
    expect(ops.locator('tr[data-tenant="acme"]')).to_contain_text("1 in use")
