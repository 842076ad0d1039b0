"""Issue 33's portal figures in Chromium (Playwright drives Debian's ``/usr/bin/chromium``
against Django's live server), with screenshots for the docs:
``NVKE_SCREENSHOTS=docs/screenshots pytest tests/portal/test_consistency_browser.py`` writes
``nodepool-shared.png``, ``console-defrag-scrubbing.png`` and ``console-fragmentation.png``.

* A shared MIG pool of 4 nodes, one ``1g.10gb`` instance each, on a shared H100 host: the
  pool page says each node gets ``nvidia.com/gpu: 1`` and ONE instance (not 7), that the
  pool is shared, and each node row its Kubernetes version (1.36) and the driver its host's
  agent reports (570.172.08); deleting it releases 4 GPU instances, not "4 GPU(s)".
* Right after a scale-down the released GPUs wait for their scrub: the defrag dry run says
  so instead of an unexplained empty plan.

Hosts are SIMULATED INFRASTRUCTURE (``make_host``); nodes are driven by the real reconciler.
"""

from __future__ import annotations

import pytest

from tests.helpers import drive_pool, make_cluster
from tests.nodepools.test_shared_hosts import make_pool, shared
from tests.portal.conftest import login

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MODEL = "h100-sxm5-80gb"
DRIVER = "570.172.08"


def test_a_shared_pool_page_says_what_each_node_gets(
    live_server, browser, shots, make_host, operator, owner, portal_user, tenant_a
):
    from playwright.sync_api import expect

    from fleet.models import Host

    host = make_host(MODEL, gpus=1, hostname="hv-shared-01")
    Host.objects.filter(pk=host.pk).update(driver_version=DRIVER)  # as its agent reports
    assert (
        operator.post(
            f"/api/v1/fleet/hosts/{host.id}/tenancy", {"tenancy": "shared"}, format="json"
        ).json()["tenancy"]
        == "shared"
    )
    cluster = make_cluster(owner, "inference")
    pool = make_pool(owner, cluster, "mig1g", shared("1g.10gb"), nodes=4)
    drive_pool(pool)

    portal_user("alice", tenant_a, "owner")
    page = login(browser, live_server.url, "alice")
    page.goto(f"/clusters/{cluster}/nodepools/{pool}")
    facts = page.locator("dl.facts")
    expect(facts).to_contain_text("nvidia.com/gpu: 1")
    expect(page.locator("#shared-tenancy")).to_contain_text("shared")
    expect(page.locator("#node-instances")).to_contain_text("1g.10gb")
    expect(page.locator("#node-instances")).not_to_contain_text("1g.10gb, 1g.10gb")
    expect(page.locator("dl.facts")).not_to_contain_text("GPU instances on each GPU")
    rows = page.locator('table[aria-label="nodes"] tbody tr')
    expect(rows).to_have_count(4)
    expect(page.locator('td[data-col="kubernetes"]')).to_have_text(["1.36"] * 4)
    expect(page.locator('td[data-col="driver"]')).to_have_text([DRIVER] * 4)
    shots(page, "nodepool-shared")

    page.goto(f"/clusters/{cluster}/nodepools/{pool}/delete")
    expect(page.locator('[data-count="nodes"]')).to_have_text("4")
    expect(page.locator('[data-count="gpu_instances"]')).to_have_text("4")
    expect(page.locator("#disruption")).not_to_contain_text("GPU(s) released")
    page.context.close()


def test_the_defrag_dry_run_says_gpus_are_being_scrubbed_after_a_scale_down(
    live_server, browser, shots, make_host, owner, portal_user
):
    from django.utils import timezone
    from playwright.sync_api import expect

    from fleet.choices import ScrubState
    from fleet.models import Gpu, Host

    host = make_host(MODEL, gpus=8, hostname="gpu-h100-07")
    cluster = make_cluster(owner, "train")
    pool = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {"name": "h100", "gpu_model": MODEL, "gpus_per_node": 4, "node_count": 2},
        format="json",
    ).json()["target_id"]
    drive_pool(pool)
    # from now on the host has an agent of its own, as under make run: a released GPU's scrub
    # waits for that agent's next report (a host without one completes it at once)
    Host.objects.filter(pk=host.pk).update(
        registered_at=timezone.now(), credential_hash="agent-credential-of-the-test"
    )
    assert (
        owner.post(
            f"/api/v1/clusters/{cluster}/nodepools/{pool}/set-size", {"node_count": 1}
        ).status_code
        == 202
    )
    drive_pool(pool)
    released = Gpu.objects.filter(host=host, holder_id__isnull=True)
    assert list(released.values_list("scrub_state", flat=True)) == [ScrubState.PENDING] * 4

    portal_user("ops", staff=True)
    ops = login(browser, live_server.url, "ops")
    ops.goto("/console/defrag")
    expect(ops.locator("#defrag-scrubbing")).to_contain_text(
        "4 released GPU(s) on gpu-h100-07 are being scrubbed"
    )
    shots(ops, "console-defrag-scrubbing")
    ops.context.close()


def test_the_console_overview_counts_only_placeable_gpus_as_free(
    live_server, browser, shots, make_host, portal_user
):
    """Issue 33 item 4 in Chromium: the fleet of tests/fleet/test_placeable.py — a shared H100
    host (8 free GPUs), a dedicated H100 host with GPU 0 UNHEALTHY and GPU 1 being scrubbed,
    an A100 host whose agent went silent (NOT_READY). The overview said "whole hosts free 1"
    (the shared host) and listed the silent A100's GPUs as free."""
    from playwright.sync_api import expect

    from fleet.choices import GpuHealth, HostState, HostTenancy
    from fleet.models import Gpu, Host

    shared = make_host(MODEL, gpus=8, hostname="hv-shared-1")
    Host.objects.filter(pk=shared.pk).update(tenancy=HostTenancy.SHARED)
    dedicated = make_host(MODEL, gpus=8, hostname="h100-ded-1")
    Gpu.objects.filter(host=dedicated, index=0).update(health=GpuHealth.UNHEALTHY)
    Gpu.objects.filter(host=dedicated, index=1).update(scrub_state="PENDING")
    silent = make_host("a100-sxm4-80gb", gpus=8, hostname="a100-silent-1")
    Host.objects.filter(pk=silent.pk).update(state=HostState.NOT_READY)

    portal_user("ops", staff=True)
    ops = login(browser, live_server.url, "ops")
    ops.goto("/console/")
    gpus = ops.locator("#gpus-by-model tbody tr")
    # model, GPUs, healthy, unhealthy, held, in instances, free, unavailable
    expect(gpus.filter(has_text="a100-sxm4-80gb").locator("td")).to_have_text(
        ["a100-sxm4-80gb", "8", "8", "0", "0", "0", "0", "8"]
    )
    expect(gpus.filter(has_text=MODEL).locator("td")).to_have_text(
        [MODEL, "16", "15", "1", "0", "0", "14", "2"]
    )
    # fragmentation: the dedicated H100 host only (its 6 placeable GPUs); the shared host apart
    row = ops.locator("#fragmentation tbody tr", has_text=MODEL)
    expect(row.locator("td").nth(2)).to_have_text("1")  # hosts
    expect(row.locator("td").nth(3)).to_have_text("0")  # whole hosts free
    expect(row.locator("td").nth(4)).to_have_text("6")  # free GPUs
    expect(row).to_contain_text("8-GPU: 0")
    expect(row).to_contain_text(
        "+ 1 shared host(s), 8 GPU(s) free, for MIG instances of shared pools only"
    )
    shots(ops, "console-fragmentation")
    ops.context.close()
