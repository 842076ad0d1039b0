"""Screenshots of the main portal and console pages, taken by the same browser as the browser
test (Debian's Chromium through Playwright) on a live server with a lived-in history.

``NVKE_SCREENSHOTS=docs/screenshots pytest tests/portal/test_portal_screenshots.py`` refreshes the
PNGs the docs show; without the variable they go to the test's tmp dir.

The scene: two tenants; H100 hosts are SIMULATED (``make_host``), the A100, A10G and T4 hosts
are imported from the real ``nvidia-smi -q -x`` captures in ``fleet/captures/``, and the A10G
and T4 agents (real ``nvke-agent`` processes) report those captures' readings (both GPUs were
idle when captured: 0 %), which the utilization heatmap shows. The nine-day history is driven
through the real node pool reconciler with past timestamps (``reconcile_nodepool(id,
now=...)``; clusters are converged now and their ``created_at`` dated back), aggregated by
the real billing code and rated with demo list prices (not NVIDIA's or anyone's real prices).
Each page is also checked for what it must show.
"""

from __future__ import annotations

import subprocess
from datetime import timedelta
from decimal import Decimal

import pytest

from tests.conftest import CAPTURES
from tests.e2e.conftest import BIN, ROOT, service_env
from tests.portal.conftest import login

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

DEMO_PRICES = {  # demo list prices, USD per GPU-hour (made up for the screenshots)
    "h100-sxm5-80gb": Decimal("2.50"),
    "a100-sxm4-80gb": Decimal("1.80"),
    "a10g": Decimal("0.75"),
    "t4": Decimal("0.35"),
}


def _converge(reconcile, object_id, now) -> None:
    for _ in range(20):
        if reconcile(object_id, now=now) is None:
            return
    raise AssertionError(f"{object_id} did not converge")


def _scene(live_server, make_host, import_capture, portal_user, tmp_path) -> dict:
    from django.utils import timezone

    from billing.aggregation import aggregate_usage
    from billing.invoices import build_invoice
    from billing.periods import period_of
    from billing.prices import set_price
    from clusters.models import Cluster
    from clusters.reconcile import reconcile_cluster
    from clusters.services import create_cluster
    from fleet.rollups import rollup_pending
    from nodepools.reconcile import reconcile_nodepool
    from nodepools.services import create_nodepool, delete_nodepool
    from tenants.choices import Role
    from tenants.models import Tenant
    from tenants.principal import Principal
    from tenants.services import create_api_key

    now = timezone.now()
    t0 = now.replace(minute=0, second=0, microsecond=0) - timedelta(days=9)
    for model, rate in DEMO_PRICES.items():
        set_price(gpu_model=model, hourly_rate=rate, effective_from=t0 - timedelta(days=30))
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="sim-h100-01")
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1b", hostname="sim-h100-02")
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1b", hostname="sim-h100-03")
    a100 = import_capture("a100-sxm4-v12.xml", "gpu-a100-01", "us-east-1a")
    a10g = import_capture("a10g.xml", "gpu-a10g-01", "us-west-2a")
    t4 = import_capture("tesla-t4.xml", "gpu-t4-01", "us-west-2b")

    acme, globex = Tenant.objects.create(name="acme"), Tenant.objects.create(name="globex")
    portal_user("alice", acme, "owner")
    portal_user("bob", acme, "member")
    portal_user("gina", globex, "owner")
    portal_user("ops", staff=True)
    alice = Principal(acme, Role.OWNER, False, "user:alice")
    gina = Principal(globex, Role.OWNER, False, "user:gina")
    create_api_key(tenant=acme, name="ci", role="member")

    def cluster(principal, name, region, at):
        op = create_cluster(
            principal=principal, name=name, kubernetes_version="1.36", region=region
        )
        # the simulated control plane is ready a delay after the row's creation (real time):
        # converge now, then date the cluster back to when the scene says it was created
        _converge(reconcile_cluster, op.target_id, timezone.now())
        Cluster.objects.filter(pk=op.target_id).update(created_at=at)
        return Cluster.objects.get(pk=op.target_id)

    def pool(principal, c, at, **spec):
        op = create_nodepool(principal=principal, cluster=c, **spec)
        _converge(reconcile_nodepool, op.target_id, at)
        return op.target_id

    llm = cluster(alice, "llm", "us-east-1", t0)
    pool(
        alice, llm, t0 + timedelta(hours=1), name="train", gpu_model="h100-sxm5-80gb",
        gpus_per_node=8, node_count=1, isolation={"mode": "exclusive"},
    )  # fmt: skip
    mig = pool(
        alice, llm, t0 + timedelta(days=2), name="mig", gpu_model="h100-sxm5-80gb",
        gpus_per_node=2, node_count=1, isolation={"mode": "mig", "mig_profile": "1g.10gb"},
    )  # fmt: skip
    burst = pool(
        alice, llm, t0 + timedelta(days=3), name="burst", gpu_model="h100-sxm5-80gb",
        gpus_per_node=8, node_count=1, isolation={"mode": "exclusive"},
    )  # fmt: skip
    from nodepools.models import NodePool

    delete_nodepool(principal=alice, pool=NodePool.objects.get(pk=burst))
    _converge(reconcile_nodepool, burst, t0 + timedelta(days=5))
    serve = cluster(alice, "serve", "us-west-2", t0 + timedelta(days=4))
    pool(
        alice, serve, t0 + timedelta(days=4, hours=2), name="a10g", gpu_model="a10g",
        gpus_per_node=1, node_count=1, isolation={"mode": "exclusive"},
    )  # fmt: skip
    batch = cluster(gina, "batch", "us-west-2", t0 + timedelta(days=1))
    pool(
        gina, batch, t0 + timedelta(days=1, hours=1), name="t4", gpu_model="t4",
        gpus_per_node=1, node_count=1, isolation={"mode": "time-slicing", "replicas": 4},
    )  # fmt: skip
    for tenant in (acme, globex):
        aggregate_usage(tenant.id, t0 - timedelta(days=1), now, now)
        for instant in {t0, now}:
            build_invoice(tenant.id, period_of("UTC", instant).label, now)

    # two real agents report the A10G and T4 captures' readings; rollups feed the heatmap
    agents = [
        subprocess.Popen(
            [
                str(BIN / "nvke-agent"),
                "run",
                "--server",
                live_server.url,
                "--state-dir",
                str(tmp_path / name),
                "--source",
                "nvidia-smi-xml",
                "--xml",
                str(CAPTURES / xml),
                "--interval",
                "1",
                "--max-reports",
                "2",
                "--bootstrap-token",
                imported.bootstrap_token,
            ],
            cwd=ROOT,
            env=service_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for name, xml, imported in (("a10g", "a10g.xml", a10g), ("t4", "tesla-t4.xml", t4))
    ]
    for agent in agents:
        assert agent.wait(60) == 0, agent.stderr.read()[-2000:]
    rollup_pending(now=timezone.now() + timedelta(seconds=5))  # past the rollups' settle time
    return {"acme": acme, "llm": llm, "mig": mig, "a100": a100.host}


def test_screenshots_of_the_main_pages(
    live_server, browser, shots, catalog, make_host, import_capture, portal_user, tmp_path,
    monkeypatch,
):  # fmt: skip
    from playwright.sync_api import expect

    from billing.models import UsageRecord

    expect.set_options(timeout=30_000)
    scene = _scene(live_server, make_host, import_capture, portal_user, tmp_path)
    llm, mig = scene["llm"], scene["mig"]

    anonymous = browser.new_page(viewport={"width": 1360, "height": 800})
    anonymous.goto(f"{live_server.url}/login")
    shots(anonymous, "login")

    page = login(browser, live_server.url, "alice")
    expect(page.locator('tr[data-cluster="llm"] .phase')).to_have_text("RUNNING")
    expect(page.locator('tr[data-cluster="serve"] .phase')).to_have_text("RUNNING")
    shots(page, "clusters")

    page.goto(f"/clusters/{llm.id}")
    expect(page.locator('tr[data-pool="train"]')).to_contain_text("1 / 1")
    expect(page.locator('tr[data-pool="mig"]')).to_contain_text("1g.10gb (single)")
    shots(page, "cluster")
    # the cluster's own node-pool and operation lists: search, filter choices, sort, pages
    page.locator("#all-pools").click()
    page.get_by_label("Search").fill("h100")
    page.get_by_role("button", name="Apply").click()
    expect(page.locator('tr[data-pool="train"]')).to_be_visible()
    page.get_by_role("link", name="Name", exact=True).click()
    expect(page.locator("a.sort[data-sort]")).to_have_text("Name \u2191")
    shots(page, "nodepools-search")
    page.goto(f"/clusters/{llm.id}/operations?sort=-finished_at")
    expect(page.locator("tr[data-operation]").first).to_be_visible()
    shots(page, "operations")

    page.goto(f"/clusters/{llm.id}/nodepools/{mig}")
    expect(page.locator("#pool-phase")).to_have_text("RUNNING")
    shots(page, "nodepool")

    page.goto(f"/clusters/{llm.id}/nodepools/new")
    page.get_by_label("Name").fill("inference")
    page.get_by_label("GPUs per node").fill("1")
    page.get_by_label("Nodes").fill("2")
    page.get_by_label("Isolation").select_option("mig")
    page.get_by_label("or a mixed MIG layout per GPU").fill("4g.40gb=1, 3g.40gb=1, 1g.10gb=1")
    page.get_by_role("button", name="Check (nothing is created)").click()
    expect(page.locator("#id_mig_layout-error code")).to_have_text("mig_layout_does_not_fit")
    shots(page, "nodepool-refusal")

    # the scene's nine days (the page's default window is this billing month so far)
    from django.utils import timezone

    today = timezone.now().date()
    page.goto(f"/usage?start={today - timedelta(days=10)}&end={today}")
    seconds = sum(r.gpu_seconds for r in UsageRecord.objects.filter(tenant=scene["acme"]))
    assert seconds > 0
    expect(page.locator("#total-gpu-hours")).to_have_text(f"{seconds / 3600:,.3f}")
    expect(page.locator("#utilization")).to_contain_text("serve")
    shots(page, "usage")

    page.goto("/quotas")
    shots(page, "quotas")
    page.goto("/api-keys")
    page.get_by_label("Name").fill("deploy-bot")
    page.get_by_label("Role").select_option("member")
    page.get_by_role("button", name="Create key").click()
    expect(page.locator("#new-key")).to_contain_text("copy it now")
    shots(page, "api-keys")
    page.goto("/audit")
    shots(page, "audit")
    page.goto("/invoices")
    expect(page.locator("table")).to_contain_text("DRAFT")
    shots(page, "invoices")
    # issue #20: the activity feed, an invitation link, a typed-name confirmation, 390 px
    page.goto("/activity")
    expect(page.locator("#feed")).to_contain_text("DELETE_NODE_POOL")
    shots(page, "activity")
    page.goto("/members")
    page.get_by_label("Email").fill("bob@example.com")
    page.locator("#invite_role").select_option("member")
    page.get_by_role("button", name="Create invitation link").click()
    expect(page.locator("#invite-link")).to_contain_text("works once")
    shots(page, "members")
    page.goto(f"/clusters/{llm.id}/delete")
    expect(page.locator("#disruption")).to_contain_text("GPU(s) released")
    page.get_by_label("Type llm to confirm").fill("ll")
    shots(page, "confirm-delete")
    phone = login(browser, live_server.url, "alice", width=390)
    phone.goto(f"/clusters/{llm.id}")
    expect(phone.locator("#cluster-phase")).to_have_text("RUNNING")
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    shots(phone, "cluster-390")

    # SIMULATED Xid rows for the overview and the Xid events page: stored as agent ingestion
    # stores them, without the health intervals ingestion would also open (the a100 stays
    # healthy in the other screenshots)
    from django.utils import timezone

    from fleet.models import XidEvent

    now = timezone.now()
    a100 = scene["a100"]
    a100_gpus = list(a100.gpus.order_by("index").values_list("uuid", flat=True))
    for minutes, code in ((300, 43), (200, 13), (90, 31), (30, 79), (5, 48)):
        XidEvent.objects.create(
            host=a100, gpu_uuid=a100_gpus[minutes % len(a100_gpus)],
            ts=now - timedelta(minutes=minutes), xid=code, report_seq=minutes,
            message=f"NVRM: Xid (PCI:0000:07:00): {code}, pid=1234",
        )  # fmt: skip
    ops = login(browser, live_server.url, "ops")
    expect(ops.locator("#heatmap")).to_contain_text("gpu-a10g-01")
    shots(ops, "console-overview")
    ops.goto(f"/console/hosts/{scene['a100'].id}")
    expect(ops.locator("table[aria-label=GPUs]")).to_contain_text("enabled")
    shots(ops, "console-host")
    ops.goto("/console/tenants")
    shots(ops, "console-tenants")
    ops.goto("/console/prices")
    shots(ops, "console-prices")

    # --- console pages of #20: Xid events, a drain's confirmation and live progress, a quota
    # below use. The blocking pod is the simulated provider's (a PodDisruptionBudget a real
    # cluster reports).
    from django.conf import settings

    from clusters.providers.simulated import simulate_drain_blockers
    from fleet.models import Host
    from fleet.services import drain_host
    from nodepools.models import Node, NodePool
    from nodepools.reconcile import reconcile_nodepool

    ops.goto("/console/xids")
    expect(ops.locator("#xid-events tbody tr")).to_have_count(5)
    shots(ops, "console-xids")
    ops.get_by_label("Severity (catalog)").select_option("critical")
    ops.get_by_role("button", name="Filter").click()
    expect(ops.locator("#xid-events tbody tr")).to_have_count(2)
    shots(ops, "console-xids-filtered")

    train = NodePool.objects.get(cluster=llm, name="train")
    old = Node.objects.get(nodepool=train, phase="READY")
    busy = Host.objects.get(pk=old.host_id)
    ops.goto(f"/console/hosts/{busy.id}/confirm/maintenance")
    expect(ops.locator("#disrupted-nodes")).to_contain_text(old.name)
    ops.get_by_label("Type the host's name to confirm").fill(busy.hostname)
    shots(ops, "console-host-drain-confirm")

    pdb = "default/trainer-0 (PodDisruptionBudget trainer allows 0 disruptions)"
    simulate_drain_blockers(old.id, [pdb])
    try:
        drain_host(busy, actor="user:ops", target="MAINTENANCE")
        step = timedelta(seconds=settings.NVKE_HOST_DRAIN_TIMEOUT_S + 1)
        for i in range(12):  # replacement placed and READY, then the drain pauses on the pod
            reconcile_nodepool(train.id, now=timezone.now() + step * i)
            if Node.objects.get(pk=old.pk).move_state == "drain-blocked":
                break
        ops.goto(f"/console/hosts/{busy.id}")
        expect(ops.locator(f'tr[data-node="{old.name}"] .move')).to_have_text("drain-blocked")
        shots(ops, "console-host-drain")
    finally:
        simulate_drain_blockers(old.id, [])

    ops.goto(f"/console/tenants/{scene['acme'].id}")
    ops.get_by_label("Max nodes").fill("1")
    ops.get_by_role("button", name="Set limits").click()
    expect(ops.locator("#below-use")).to_contain_text("nodes: limit 1 is below the")
    shots(ops, "console-quota-below-use")


def test_the_docs_show_every_screenshot_and_only_existing_ones():
    """Each ``screenshots/*.png`` a docs page names exists, and each file there is named."""
    import re

    pages = "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    named = set(re.findall(r"screenshots/([\w-]+\.png)", pages))
    files = {p.name for p in (ROOT / "docs" / "screenshots").glob("*.png")}
    assert named == files, {"missing files": named - files, "not in the docs": files - named}
    assert {"nodepools-search.png", "operations.png", "console-xids.png"} <= files
