"""Unknown is not unhealthy: the agent still reports but NVML does not initialise (the
simulated host's ``nvml-init-fails`` fault, read by the agent's own simulated source and
ingested by the real ingestion). Its healthy GPUs become UNKNOWN: not placeable, no repair,
no SLA credit, a host warning for the operator; an Xid (evidence from the GPU) still makes
one UNHEALTHY, and reading the GPUs again brings the others back (EKS replaced healthy nodes
when its agent lost DCGM: aws/containers-roadmap#2555)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.health import credit_intervals
from clusters.providers import simhosts
from fleet import health_rules
from fleet.health import handle_xid
from fleet.models import Gpu, GpuHealthInterval, HealthRuleFiring, Host, HostEvent, XidEvent
from fleet.placeable import placeable_gpus_q
from nodepools.models import Node
from tenants.models import Tenant
from tenants.principal import Principal
from tests.helpers import running_exclusive_pool

pytestmark = pytest.mark.django_db


def fault(host, on: bool) -> None:
    simhosts.change(host, lambda state: simhosts.set_fault(state, "nvml-init-fails", on))
    assert simhosts.report_in_process(host)  # the host's agent reports (in-process)


def test_the_collector_failing_on_a_healthy_gpu_repairs_nothing_and_credits_nothing(make_host):
    host = make_host("h100-sxm5-80gb", gpus=2, hostname="nvml-fails-01")
    owner = Principal(Tenant.objects.create(name="acme"), "owner", False, "user:alice")
    start = timezone.now()
    running_exclusive_pool(owner, gpus_per_node=1, node_count=1)
    node = Node.objects.get()
    held = Gpu.objects.get(uuid=node.gpu_uuids[0])
    free = Gpu.objects.exclude(pk=held.pk).get(host=host)
    assert Gpu.objects.filter(placeable_gpus_q(), pk=free.pk).exists()

    fault(host, True)
    assert dict(Gpu.objects.filter(host=host).values_list("uuid", "health")) == {
        held.uuid: "UNKNOWN",
        free.uuid: "UNKNOWN",
    }
    assert not Gpu.objects.filter(placeable_gpus_q(), host=host).exists()  # not placeable
    assert not GpuHealthInterval.objects.exists()  # no unhealthy time: no SLA credit
    node.refresh_from_db()
    assert (node.phase, node.repair_state) == ("READY", "")  # no repair
    warnings = Host.objects.get(pk=host.pk).warnings
    assert [w for w in warnings if w.startswith("gpu health unknown:")] == [
        "gpu health unknown: 2 GPU(s) not placeable: the agent reports but cannot read them "
        f"(NVML: {simhosts.NVML_FAILS}); no repair and no SLA credit until it reads them again"
    ]
    assert credit_intervals(start=start, end=timezone.now() + timedelta(hours=1)) == []
    # an nvml_init_failure occurrence is logged (the dry run's record), but no rule: no firing
    assert HostEvent.objects.filter(host=host, data__signal="nvml_init_failure").count() == 1
    assert not HealthRuleFiring.objects.exists()

    # the agent reads the GPUs again: HEALTHY, placeable, the warning gone
    fault(host, False)
    assert set(Gpu.objects.filter(host=host).values_list("health", flat=True)) == {"HEALTHY"}
    assert Gpu.objects.filter(placeable_gpus_q(), pk=free.pk).exists()
    assert not [w for w in Host.objects.get(pk=host.pk).warnings if w.startswith("gpu health")]
    node.refresh_from_db()
    assert node.repair_state == ""


def test_evidence_from_the_gpu_still_makes_an_unknown_gpu_unhealthy(make_host):
    host = make_host("h100-sxm5-80gb", gpus=1, hostname="nvml-fails-02")
    gpu = Gpu.objects.get(host=host)
    fault(host, True)
    assert Gpu.objects.get(pk=gpu.pk).health == "UNKNOWN"
    # an Xid from the driver's log (the agent reads it without NVML): evidence from the GPU
    event = XidEvent.objects.create(
        host=host, gpu_uuid=gpu.uuid, ts=timezone.now(), xid=79, report_seq=1
    )
    handle_xid(host, event, event.ts)
    gpu.refresh_from_db()
    assert gpu.health == "UNHEALTHY"
    assert GpuHealthInterval.objects.get(gpu=gpu).needs_operator
    # the next failing report does not turn it back to UNKNOWN
    fault(host, True)
    assert Gpu.objects.get(pk=gpu.pk).health == "UNHEALTHY"


def test_an_operator_rule_on_nvml_init_failure_fires_on_each_gpu_at_the_third_report(make_host):
    host = make_host("h100-sxm5-80gb", gpus=2, hostname="nvml-fails-03")
    rule = {
        "threshold_count": 3,
        "window_s": 600,
        "condition": "NvmlInitFailure",
        "ladder": ["node_reboot", "replace"],
        "escalation_window_s": 3600,
        "needs_operator": False,
        "enabled": True,
    }
    health_rules.save_rule("nvml-init-failure", rule, actor="user:ops")
    fault(host, True)  # the simulated agent's source_error_code: NVML_ERROR_DRIVER_NOT_LOADED
    fault(host, True)
    # two failing reports: two of three, the GPUs unknown (not unhealthy), nothing repaired
    assert set(Gpu.objects.filter(host=host).values_list("health", flat=True)) == {"UNKNOWN"}
    assert not GpuHealthInterval.objects.exists() and not HealthRuleFiring.objects.exists()
    fault(host, True)
    uuids = sorted(Gpu.objects.filter(host=host).values_list("uuid", flat=True))
    assert sorted(HealthRuleFiring.objects.values_list("gpu_uuid", "count", "action")) == [
        (uuid, 3, "node_reboot") for uuid in uuids
    ]
    assert set(Gpu.objects.filter(host=host).values_list("health", flat=True)) == {"UNHEALTHY"}
    assert set(GpuHealthInterval.objects.values_list("reason", "rule_action")) == {
        ("health_rule", "node_reboot")
    }
    dry = health_rules.dry_run(health_rules.effective_rules(), days=1)
    assert sorted((f.gpu_uuid, f.count, f.action) for f in dry) == [
        (uuid, 3, "node_reboot") for uuid in uuids
    ]
