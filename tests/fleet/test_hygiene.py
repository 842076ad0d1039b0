"""Host hygiene (fleet/hygiene.py): the onboarding check read from the import report, the
agent's re-verification, scrubs driven by the agent through report acknowledgements."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from fleet import hygiene, placement
from fleet.models import Gpu, GpuHealthInterval, GpuScrub, Host, HostCheck
from fleet.placement import GpuRequest
from tests.conftest import capture

pytestmark = pytest.mark.django_db

A10G = "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"
T4 = "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"


def import_xml(operator, xml, hostname="h1"):
    return operator.post(
        "/api/v1/fleet/hosts",
        {"hostname": hostname, "zone": "us-east-1a", "nvidia_smi_xml": xml},
        format="json",
    )


def test_the_real_captures_pass_the_onboarding_check(operator, catalog):
    for i, name in enumerate(("a100-sxm4-v12.xml", "a10g.xml", "tesla-t4.xml")):
        host = import_xml(operator, capture(name), f"h{i}").json()
        check = HostCheck.objects.get(host_id=host["id"])
        assert (check.kind, check.status, check.findings) == ("onboarding", "PASSED", []), name
        assert host["state"] == "AVAILABLE"
        assert {g["health"] for g in host["gpus"]} == {"HEALTHY"}


def test_a_pending_row_remap_fails_the_gpu_but_the_host_is_imported(operator, catalog):
    # the real A10G capture with remapped_row_pending changed from No to Yes
    xml = capture("a10g.xml").replace(
        "<remapped_row_pending>No</remapped_row_pending>",
        "<remapped_row_pending>Yes</remapped_row_pending>",
    )
    resp = import_xml(operator, xml)
    assert resp.status_code == 201, resp.content
    (gpu,) = resp.json()["gpus"]
    assert (gpu["uuid"], gpu["health"]) == (A10G, "UNHEALTHY")
    assert gpu["health_reason"] == (
        "onboarding check: row remapping pending: a GPU reset is needed to apply it"
    )
    check = HostCheck.objects.get()
    assert check.status == "FAILED"
    assert check.findings == [
        {
            "gpu_uuid": A10G,
            "check": "remapped_rows",
            "status": "FAILED",
            "detail": "row remapping pending: a GPU reset is needed to apply it",
        }
    ]
    interval = GpuHealthInterval.objects.get()
    assert (interval.reason, interval.needs_operator, interval.ended_at) == (
        "check_failed",
        True,
        None,
    )
    # the failed GPU is never handed out
    tenant = uuid.uuid4()
    from tenants.models import Tenant

    Tenant.objects.create(id=tenant, name="t")
    with pytest.raises(placement.InsufficientCapacity), transaction.atomic():
        placement.claim_gpus([GpuRequest(uuid.uuid4(), tenant, "a10g", 1, "us-east-1")])


def test_lifetime_ecc_errors_are_a_warning_and_the_gpu_stays_usable(operator, catalog):
    # the real T4 capture with 2 lifetime (aggregate) uncorrectable DRAM errors
    xml = capture("tesla-t4.xml")
    start = xml.index("<aggregate>")
    end = xml.index("</aggregate>")
    section = xml[start:end].replace(
        "<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>2</dram_uncorrectable>"
    )
    host = import_xml(operator, xml[:start] + section + xml[end:]).json()
    check = HostCheck.objects.get()
    assert check.status == "WARNING"
    assert check.findings == [
        {
            "gpu_uuid": T4,
            "check": "ecc",
            "status": "WARNING",
            "detail": "2 uncorrectable ECC error(s) over the GPU's lifetime",
        }
    ]
    assert host["gpus"][0]["health"] == "HEALTHY"


def test_findings_rules_by_hand():
    findings = hygiene.gpu_findings(
        "GPU-x",
        {
            "reset_required": True,
            "ecc_volatile_uncorrected": 3,
            "retired_pages_dbe": 1,
            "mig_mode": "disabled",
            "mig_mode_pending": "enabled",
            "remapped_rows_failure": None,
        },
    )
    assert [(f["check"], f["status"]) for f in findings] == [
        ("reset_required", "FAILED"),
        ("ecc", "FAILED"),
        ("retired_pages_dbe", "WARNING"),
        ("mig_mode", "WARNING"),
    ]
    assert findings[1]["detail"] == "3 uncorrectable ECC error(s) since the driver loaded"
    assert hygiene.overall(findings) == "FAILED"
    assert hygiene.gpu_findings("GPU-x", {"remapped_rows_pending": None}) == []
    assert hygiene.gpu_findings("GPU-x", {"gpu_recovery_action": 0}) == []
    [reboot] = hygiene.gpu_findings("GPU-x", {"gpu_recovery_action": 2})
    assert (reboot["status"], reboot["detail"]) == (
        "FAILED",
        "NVIDIA recovery action: Node Reboot Required",
    )
    [p2p] = hygiene.gpu_findings("GPU-x", {"gpu_recovery_action": 3})
    assert p2p["status"] == "WARNING"


@pytest.fixture
def agent_host(operator, anonymous, catalog):
    """The T4 capture imported, its agent registered; returns (host, agent client)."""
    body = import_xml(operator, capture("tesla-t4.xml")).json()
    reg = anonymous.post(
        "/api/v1/agent/register", {"bootstrap_token": body["bootstrap_token"]}, format="json"
    ).json()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {reg['credential']}")
    return Host.objects.get(pk=body["id"]), client


def report(client, host, seq, **extra):
    body = {"host_id": str(host.id), "seq": seq, "samples": [], **extra}
    resp = client.post("/api/v1/agent/reports", body, format="json")
    assert resp.status_code == 200, resp.content
    return resp.json()


def test_the_agents_inventory_reverifies_the_host(agent_host):
    host, client = agent_host
    inventory = {"gpus": [{"uuid": T4, "index": 0, "health": {"remapped_rows_failure": True}}]}
    report(client, host, 1, inventory=inventory)
    check = HostCheck.objects.filter(kind="agent").get()
    assert (check.status, check.source) == ("FAILED", "NVML via nvke-agent")
    assert Gpu.objects.get(uuid=T4).health == "UNHEALTHY"
    report(client, host, 2, inventory=inventory)  # same result: not recorded again
    assert HostCheck.objects.filter(kind="agent").count() == 1


def test_a_released_gpu_is_scrubbed_by_the_agent_before_anyone_gets_it(agent_host, tenant_a):
    host, client = agent_host
    holder = uuid.uuid4()
    with transaction.atomic():
        placement.claim_gpus([GpuRequest(holder, tenant_a.id, "t4", 1, "us-east-1")])
    placement.release_gpus(holder)
    scrub = GpuScrub.objects.get()
    assert (scrub.status, scrub.previous_tenant_id, scrub.mig_teardown) == (
        "PENDING",
        tenant_a.id,
        False,
    )
    ack = report(client, host, 1)
    assert ack["commands"] == [
        {
            "type": "scrub",
            "scrub_id": scrub.id,
            "gpu_uuid": T4,
            "gpu_index": 0,
            "steps": ["gpu_reset", "memory_clear"],
        }
    ]
    assert report(client, host, 2)["commands"] == ack["commands"]  # until the agent answers
    steps = [
        {"step": "gpu_reset", "status": "ok", "detail": "nvidia-smi --gpu-reset -i 0"},
        {"step": "memory_clear", "status": "ok", "detail": "no process, 0 MiB used"},
    ]
    ack = report(
        client,
        host,
        3,
        scrub_results=[
            {"scrub_id": scrub.id, "ok": True, "executor": "nvke-agent nvml", "steps": steps}
        ],
    )
    scrub.refresh_from_db()
    assert (scrub.status, scrub.executor, scrub.steps) == ("DONE", "nvke-agent nvml", steps)
    assert ack["commands"] == []
    assert Gpu.objects.get(uuid=T4).scrub_state == "CLEAN"


def test_a_failed_scrub_takes_the_gpu_out_until_an_operator_repairs_it(
    agent_host, tenant_a, operator
):
    host, client = agent_host
    holder = uuid.uuid4()
    with transaction.atomic():
        placement.claim_gpus([GpuRequest(holder, tenant_a.id, "t4", 1, "us-east-1")])
    placement.release_gpus(holder)
    scrub = GpuScrub.objects.get()
    failed = [{"step": "gpu_reset", "status": "failed", "detail": "processes still running"}]
    report(client, host, 1, scrub_results=[{"scrub_id": scrub.id, "ok": False, "steps": failed}])
    gpu = Gpu.objects.get(uuid=T4)
    assert (gpu.scrub_state, gpu.health) == ("FAILED", "UNHEALTHY")
    interval = GpuHealthInterval.objects.get()
    assert (interval.reason, interval.detail) == ("scrub_failed", "scrub failed at gpu_reset")
    operator.post(f"/api/v1/fleet/hosts/{host.id}/mark-healthy", {}, format="json")
    gpu.refresh_from_db()
    assert (gpu.scrub_state, gpu.health) == ("CLEAN", "HEALTHY")


def test_a_scrub_the_agent_never_confirms_fails_after_the_timeout(agent_host, tenant_a, settings):
    settings.NVKE_SCRUB_TIMEOUT_S = 600
    holder = uuid.uuid4()
    with transaction.atomic():
        placement.claim_gpus([GpuRequest(holder, tenant_a.id, "t4", 1, "us-east-1")])
    placement.release_gpus(holder)
    now = timezone.now()
    assert hygiene.fail_overdue_scrubs(now + timedelta(seconds=599)) == 0
    assert hygiene.fail_overdue_scrubs(now + timedelta(seconds=601)) == 1
    scrub = GpuScrub.objects.get()
    assert (scrub.status, scrub.executor) == ("FAILED", "control plane: timeout")
    assert Gpu.objects.get(uuid=T4).scrub_state == "FAILED"
