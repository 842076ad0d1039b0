"""The console's shared-host pages in a real browser: Playwright drives Debian's Chromium
(``/usr/bin/chromium``) against Django's live server. An operator makes a host shared, then
reads its slice map after two tenants' instances were placed and one was released.

The H100 hypervisor is SIMULATED infrastructure (``make_host``); the instances are placed by
the real shared placement (``fleet.shared_hosts``).
"""

from __future__ import annotations

import uuid

import pytest
from django.db import transaction

from tests.portal.conftest import login

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MODEL = "h100-sxm5-80gb"


def test_an_operator_makes_a_host_shared_and_reads_its_slice_map(
    live_server, browser, catalog, make_host, portal_user, shots, tenant_a, tenant_b
):
    from playwright.sync_api import expect

    from fleet import shared_hosts
    from fleet.shared_hosts import GpuInstanceRequest

    host = make_host(MODEL, gpus=2, hostname="hv-browser-1")
    portal_user("ops", staff=True)
    ops = login(browser, live_server.url, "ops")
    ops.goto(f"/console/hosts/{host.id}")
    expect(ops.locator("#host-tenancy")).to_have_text("dedicated")
    ops.get_by_role("button", name="Make shared").click()
    expect(ops.locator("#host-tenancy")).to_contain_text("shared")
    expect(ops.locator("#slice-map")).to_contain_text("free")

    leaving = uuid.uuid4()
    with transaction.atomic():
        shared_hosts.claim_gpu_instances(
            [
                GpuInstanceRequest(uuid.uuid4(), tenant_a.id, MODEL, "us-east-1", ("3g.40gb",)),
                GpuInstanceRequest(leaving, tenant_b.id, MODEL, "us-east-1", ("2g.20gb",)),
            ]
        )
    shared_hosts.release_gpu_instances(leaving)
    ops.reload()
    gpu0 = ops.locator('#slice-map tr[data-gpu="0"]')
    # 3g.40gb at 0 spans 4 slices (tenant A); B's 2g.20gb at 4 (2 slices) is scrubbing
    expect(gpu0.locator('td[data-start="0"]')).to_contain_text("3g.40gb@0")
    expect(gpu0.locator('td[data-start="0"]')).to_contain_text("tenant-a")
    expect(gpu0.locator('td[data-start="0"]')).to_have_attribute("colspan", "4")
    expect(gpu0.locator('td[data-start="4"]')).to_have_attribute("data-state", "SCRUBBING")
    expect(gpu0.locator('td[data-state="FREE"]')).to_have_count(2)  # slices 6 and 7
    expect(ops.locator('#slice-map tr[data-gpu="1"] td[data-state="FREE"]')).to_have_count(8)
    shots(ops, "console-slice-map")
