"""Console: a shared host's slice map and the tenancy switch (#18). Hosts are SIMULATED rows
(``make_host``); instances are placed by the real shared placement."""

from __future__ import annotations

import re
import uuid

import pytest
from django.db import transaction

pytestmark = pytest.mark.django_db

MODEL = "h100-sxm5-80gb"


def cells(html: str) -> list[tuple[str, str, str, str]]:
    """(GPU index, data-start, colspan, state) of every slice-map cell, in page order."""
    table = html.split('id="slice-map"')[1].split("</table>")[0]
    out = []
    for row in re.findall(r'<tr data-gpu="(\d+)">(.*?)</tr>', table, re.S):
        for td in re.findall(r"<td([^>]*)>", row[1]):
            colspan = re.search(r'colspan="(\d+)"', td)
            out.append(
                (
                    row[0],
                    re.search(r'data-start="(\d+)"', td).group(1),
                    colspan.group(1) if colspan else "1",
                    re.search(r'data-state="(\w+)"', td).group(1),
                )
            )
    return out


def test_an_operator_makes_a_host_shared_and_sees_who_holds_which_gpu_instance(
    ops_client, make_host, tenant_a, tenant_b
):
    from fleet import shared_hosts
    from fleet.models import Host
    from fleet.shared_hosts import GpuInstanceRequest
    from tenants.models import AuditEvent

    host = make_host(MODEL, gpus=1, hostname="hv-console-1")
    page = ops_client.post(f"/console/hosts/{host.id}/tenancy", {"tenancy": "shared"}, follow=True)
    assert "tenancy now shared" in page.content.decode()
    assert Host.objects.get(pk=host.pk).tenancy == "shared"
    assert AuditEvent.objects.filter(action="host.tenancy", target_id=str(host.pk)).exists()
    b_node = uuid.uuid4()
    with transaction.atomic():
        shared_hosts.claim_gpu_instances(
            [
                GpuInstanceRequest(uuid.uuid4(), tenant_a.id, MODEL, "us-east-1", ("3g.40gb",)),
                GpuInstanceRequest(b_node, tenant_b.id, MODEL, "us-east-1", ("1g.10gb", "1g.10gb")),
            ]
        )
    shared_hosts.release_gpu_instances(b_node)  # B left: its two instances are being scrubbed
    html = ops_client.get(f"/console/hosts/{host.id}").content.decode()
    # 3g.40gb@0 spans slices 0-3 (tenant A), B's 1g.10gb at 4 and 5 scrubbing, 6 and 7 free
    assert cells(html) == [
        ("0", "0", "4", "ACTIVE"),
        ("0", "4", "1", "SCRUBBING"),
        ("0", "5", "1", "SCRUBBING"),
        ("0", "6", "1", "FREE"),
        ("0", "7", "1", "FREE"),
    ]
    slice_map = html.split('id="slice-map"')[1]
    assert "3g.40gb@0" in slice_map and "tenant-a" in slice_map and "tenant-b" in slice_map
    # instances held or scrubbing: it cannot go back to dedicated, and the page says why
    page = ops_client.post(
        f"/console/hosts/{host.id}/tenancy", {"tenancy": "dedicated"}, follow=True
    ).content.decode()
    assert "host_has_gpu_instances" in page
    assert Host.objects.get(pk=host.pk).tenancy == "shared"


def test_tenants_never_see_the_console_slice_map(alice_client, make_host):
    host = make_host(MODEL, gpus=1, hostname="hv-console-2")
    resp = alice_client.get(f"/console/hosts/{host.id}")
    assert resp.status_code == 404  # the console answers non-staff with its 404 page
    assert "slice-map" not in resp.content.decode()
    resp = alice_client.post(f"/console/hosts/{host.id}/tenancy", {"tenancy": "shared"})
    assert resp.status_code == 404  # the console answers non-staff with its 404 page
    host.refresh_from_db()
    assert host.tenancy == "dedicated"
