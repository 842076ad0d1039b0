"""Health rules on signals other than Xids (fleet/health_rules.py "Signals and their
occurrences"): ECC counts and clock-event bits from the agent's samples, through real reports
(HTTP, the real ingest path), the live engine and the dry run; health facts from the
inventory (row remap, a GPU lost: fallen off the bus) and reports saying NVML does not
initialise."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from clusters.providers import simhosts
from fleet import health_rules
from fleet.models import (
    Gpu,
    GpuHealthInterval,
    HealthRule,
    HealthRuleFiring,
    Host,
    HostEvent,
    XidEvent,
)
from fleet.placeable import placeable_gpus_q
from tests.fleet.test_agent_ingest import A10G, agent, report  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db

URL = "/api/v1/fleet/health-rules"
ECC_RULE = {
    "threshold_count": 2,
    "window_s": 600,
    "condition": "EccUncorrectable",
    "ladder": ["gpu_reset", "node_reboot"],
    "escalation_window_s": 3600,
    "needs_operator": True,
    "enabled": True,
}
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


def send(client, host_id, seq, at, **reading):
    """One report with one sample of the A10G carrying ``reading``."""
    body = {"ts": at.isoformat(), "gpu_uuid": A10G, "power_mw": 25580, **reading}
    response = report(client, host_id, seq, [body])
    assert response.status_code == 200, response.json()
    return response


def firings():
    return list(
        HealthRuleFiring.objects.values_list("rule_key", "gpu_uuid", "count", "step", "action")
    )


def test_ecc_dbe_2_in_10_min_fires_on_the_second_increase_not_the_first(agent):  # noqa: F811
    client, host_id = agent
    health_rules.save_rule("ecc-dbe", ECC_RULE, actor="user:ops")
    send(client, host_id, 1, T0, ecc_volatile_uncorrected=0)
    send(client, host_id, 2, T0 + timedelta(minutes=1), ecc_volatile_uncorrected=1)
    assert not GpuHealthInterval.objects.exists()  # one increase of 1: one of two
    assert firings() == []
    send(client, host_id, 3, T0 + timedelta(minutes=5), ecc_volatile_uncorrected=2)
    interval = GpuHealthInterval.objects.get(gpu_uuid=A10G)
    assert (
        interval.reason,
        interval.started_at,
        interval.rule_action,
        interval.needs_operator,
        interval.xid,
        interval.ended_at,
    ) == ("health_rule", T0 + timedelta(minutes=5), "gpu_reset", True, None, None)
    assert interval.detail == "EccUncorrectable: rule ecc-dbe fired (2x)"
    assert firings() == [("ecc-dbe", A10G, 2, 0, "gpu_reset")]
    # a resent sample (new seq, same data) is stored once and never counted again
    send(client, host_id, 4, T0 + timedelta(minutes=5), ecc_volatile_uncorrected=2)
    assert firings() == [("ecc-dbe", A10G, 2, 0, "gpu_reset")]
    # the dry run over the stored samples reports the same firing
    dry = health_rules.dry_run(health_rules.effective_rules(), days=1)
    assert [(f.rule_key, f.gpu_uuid, f.fired_at, f.count, f.action) for f in dry] == [
        ("ecc-dbe", A10G, T0 + timedelta(minutes=5), 2, "gpu_reset")
    ]


def test_one_increase_of_two_counts_twice_and_fires(agent):  # noqa: F811
    client, host_id = agent
    health_rules.save_rule("ecc-dbe", ECC_RULE, actor="user:ops")
    send(client, host_id, 1, T0, ecc_volatile_uncorrected=3)
    send(client, host_id, 2, T0 + timedelta(minutes=1), ecc_volatile_uncorrected=5)
    assert firings() == [("ecc-dbe", A10G, 2, 0, "gpu_reset")]


def test_ecc_dbe_does_not_fire_across_a_counter_reset(agent):  # noqa: F811
    client, host_id = agent
    health_rules.save_rule("ecc-dbe", ECC_RULE, actor="user:ops")
    send(client, host_id, 1, T0, ecc_volatile_uncorrected=0)
    send(client, host_id, 2, T0 + timedelta(minutes=1), ecc_volatile_uncorrected=1)
    # the driver reloads: the volatile counter starts at 0 again (no occurrence), stays there
    send(client, host_id, 3, T0 + timedelta(minutes=2), ecc_volatile_uncorrected=0)
    send(client, host_id, 4, T0 + timedelta(minutes=3), ecc_volatile_uncorrected=0)
    assert firings() == []
    assert not GpuHealthInterval.objects.exists()
    assert health_rules.dry_run(health_rules.effective_rules(), days=1) == []


def test_a_thermal_slowdown_rule_fires_when_the_bit_turns_on_and_not_while_it_stays(agent):  # noqa: F811
    client, host_id = agent
    rule = {**ECC_RULE, "threshold_count": 1, "condition": "ThermalSlowdown"}
    health_rules.save_rule("thermal-slowdown", rule, actor="user:ops")
    send(client, host_id, 1, T0, clocks_event_reasons=0x1)  # GpuIdle
    send(client, host_id, 2, T0 + timedelta(minutes=1), clocks_event_reasons=0x4)  # SwPowerCap
    assert firings() == []
    send(client, host_id, 3, T0 + timedelta(minutes=2), clocks_event_reasons=0x40)  # HwThermal
    send(client, host_id, 4, T0 + timedelta(minutes=3), clocks_event_reasons=0x60)  # still on
    assert firings() == [("thermal-slowdown", A10G, 1, 0, "gpu_reset")]
    interval = GpuHealthInterval.objects.get(gpu_uuid=A10G)
    assert (interval.reason, interval.started_at, interval.rule_action) == (
        "health_rule",
        T0 + timedelta(minutes=2),
        "gpu_reset",
    )
    dry = health_rules.dry_run(health_rules.effective_rules(), days=1)
    assert [(f.rule_key, f.fired_at, f.action) for f in dry] == [
        ("thermal-slowdown", T0 + timedelta(minutes=2), "gpu_reset")
    ]


def test_sample_occurrences_follow_the_documented_definitions():
    occ = health_rules.sample_occurrences
    assert occ(None, (5, 5, 0x40)) == {}  # a GPU's first sample: nothing to compare
    assert occ((1, 10, 0), (3, 11, 0)) == {"ecc_dbe": 2, "ecc_sbe": 1}
    assert occ((3, 11, 0), (0, 0, 0)) == {}  # counter reset
    assert occ((None, None, None), (1, 1, 0x80)) == {}  # not reported before
    assert occ((0, 0, 0x4), (0, 0, 0x84)) == {"power_slowdown": 1}
    assert occ((0, 0, 0x20), (0, 0, 0x40)) == {}  # thermal was already on


def test_a_row_remap_failed_rule_fires_once_on_the_turn_on(agent):  # noqa: F811
    client, host_id = agent
    rule = {
        **ECC_RULE,
        "threshold_count": 1,
        "condition": "RowRemapFailure",
        "ladder": ["replace", "hardware_ticket"],
    }
    health_rules.save_rule("row-remap-failed", rule, actor="user:ops")

    def inventory(seq, failed):
        health = {"remapped_rows_failure": failed, "remapped_rows_pending": False}
        gpus = [{"uuid": A10G, "index": 0, "health": health}]
        assert report(client, host_id, seq, [], inventory={"gpus": gpus}).status_code == 200

    inventory(1, False)
    assert firings() == []
    inventory(2, True)
    inventory(3, True)  # still failed: no second occurrence
    inventory(4, True)
    assert firings() == [("row-remap-failed", A10G, 1, 0, "replace")]
    # the rule ran before the agent check, so its interval (with its step) is the GPU's
    interval = GpuHealthInterval.objects.get(gpu_uuid=A10G)
    assert (interval.reason, interval.rule_action, interval.needs_operator) == (
        "health_rule",
        "replace",
        True,
    )
    assert interval.detail == "RowRemapFailure: rule row-remap-failed fired (1x)"
    dry = health_rules.dry_run(health_rules.effective_rules(), days=1)
    assert [(f.rule_key, f.gpu_uuid, f.count, f.action) for f in dry] == [
        ("row-remap-failed", A10G, 1, "replace")
    ]


def test_flag_turn_ons_follow_the_documented_definition():
    on = health_rules.flag_turned_on
    assert on({}, {"remapped_rows_failure": True}) == ["row_remap_failed"]
    assert on({"remapped_rows_failure": True}, {"remapped_rows_failure": True}) == []
    assert on({"remapped_rows_pending": None}, {"remapped_rows_pending": True}) == [
        "row_remap_pending"
    ]
    assert on({"remapped_rows_pending": True}, {"remapped_rows_pending": False}) == []


@pytest.mark.parametrize("key", ["nvml-init-failure", "fallen-off-bus"])
def test_rules_on_nvml_init_failure_and_fallen_off_bus_are_stored_and_dry_run(
    operator, catalog, key
):
    response = operator.put(f"{URL}/{key}", ECC_RULE, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["key"], body["source"], body["version"]) == (key, "operator", 1)
    assert {k: body[k] for k in ECC_RULE} == ECC_RULE
    row = HealthRule.objects.get()
    assert (row.signal, row.threshold_count, row.window_s, row.ladder) == (
        key.replace("-", "_"),
        2,
        600,
        ["gpu_reset", "node_reboot"],
    )
    dry = operator.post(
        f"{URL}/dry-run", {"days": 1, "rules": [{"key": key, **ECC_RULE}]}, format="json"
    )
    assert dry.status_code == 200, dry.json()
    assert not health_rules.UNWIRED_SIGNALS


LOST_RULE = {
    **ECC_RULE,
    "threshold_count": 3,
    "condition": "FallenOffTheBus",
    "ladder": ["node_reboot", "replace"],
}


def inventory(client, host_id, seq, *, lost):
    """An inventory report of the A10G: lost (the agent's lost_gpu shape) or read."""
    gpu = (
        {"uuid": A10G, "index": 0, "mig_mode": None, "mig_devices": []}
        | {"health": {"gpu_is_lost": True}}
        if lost
        else {"uuid": A10G, "index": 0, "health": {"gpu_is_lost": False}}
    )
    response = report(client, host_id, seq, [], inventory={"gpus": [gpu]})
    assert response.status_code == 200, response.json()


def test_a_lost_gpu_without_a_rule_is_missing_as_an_unlisted_one_and_back_when_read(agent):  # noqa: F811
    client, host_id = agent
    inventory(client, host_id, 1, lost=False)
    facts = Gpu.objects.values("attributes", "serial", "mig_mode").get(uuid=A10G)
    inventory(client, host_id, 2, lost=True)
    gpu = Gpu.objects.get(uuid=A10G)
    assert gpu.missing_since is not None and gpu.health == "UNHEALTHY"
    interval = GpuHealthInterval.objects.get(gpu_uuid=A10G)
    assert (interval.reason, interval.needs_operator, interval.ended_at) == (
        "gpu_missing",
        False,
        None,
    )
    assert "NVML_ERROR_GPU_IS_LOST" in interval.detail
    assert not Gpu.objects.filter(placeable_gpus_q(), uuid=A10G).exists()
    assert any("lost (NVML: fallen off the bus)" in w for w in Host.objects.get().warnings)
    # only its health is read: the facts read before it was lost stay
    assert Gpu.objects.values("attributes", "serial", "mig_mode").get(uuid=A10G) == facts
    inventory(client, host_id, 3, lost=True)  # still lost: nothing new
    assert GpuHealthInterval.objects.count() == 1
    assert firings() == []
    before = datetime.now(UTC)
    inventory(client, host_id, 4, lost=False)  # reset/reboot: read again
    gpu.refresh_from_db()
    assert (gpu.missing_since, gpu.health) == (None, "HEALTHY")
    # ended by this report: not before it was sent, not in the future
    assert before <= GpuHealthInterval.objects.get().ended_at <= datetime.now(UTC)


def test_a_lost_gpus_earlier_facts_stay_so_its_return_turns_no_flag_on_again(agent):  # noqa: F811
    client, host_id = agent

    def send_inventory(seq, health):
        gpus = [{"uuid": A10G, "index": 0, "health": health}]
        assert report(client, host_id, seq, [], inventory={"gpus": gpus}).status_code == 200

    send_inventory(1, {"remapped_rows_pending": True, "gpu_is_lost": False})
    send_inventory(2, {"gpu_is_lost": True})
    assert Gpu.objects.get(uuid=A10G).health_counters == {
        "remapped_rows_pending": True,
        "gpu_is_lost": True,
    }
    send_inventory(3, {"remapped_rows_pending": True, "gpu_is_lost": False})
    logged = HostEvent.objects.filter(data__signal__isnull=False).order_by("ts", "id")
    assert [e.data["signal"] for e in logged] == ["row_remap_pending", "fallen_off_bus"]


def test_a_fallen_off_bus_rule_3_in_10_min_fires_on_the_third_loss_not_the_second(agent):  # noqa: F811
    client, host_id = agent
    health_rules.save_rule("fallen-off-bus", LOST_RULE, actor="user:ops")
    # hand-worked: the turn-ons of gpu_is_lost are reports 2, 5 and 7 (3 stays lost: no new
    # occurrence); all within 10 min, so the count is 1, 2, 3 and the rule fires at report 7
    for seq, lost in enumerate([False, True, True, False, True, False, True], start=1):
        inventory(client, host_id, seq, lost=lost)
        if seq == 5:
            assert firings() == []  # two occurrences of three
            assert GpuHealthInterval.objects.filter(reason="health_rule").count() == 0
    assert firings() == [("fallen-off-bus", A10G, 3, 0, "node_reboot")]
    interval = GpuHealthInterval.objects.get(gpu_uuid=A10G, ended_at__isnull=True)
    assert (interval.reason, interval.rule_action, interval.needs_operator) == (
        "health_rule",
        "node_reboot",
        True,
    )
    assert interval.detail == "FallenOffTheBus: rule fallen-off-bus fired (3x)"
    # one truth: missing (not placeable), never present and healthy; the rule's interval wins
    gpu = Gpu.objects.get(uuid=A10G)
    assert gpu.missing_since is not None and gpu.health == "UNHEALTHY"
    # the dry run over the logged turn-ons reports the same firing
    dry = health_rules.dry_run(health_rules.effective_rules(), days=1)
    assert [(f.rule_key, f.gpu_uuid, f.count, f.action) for f in dry] == [
        ("fallen-off-bus", A10G, 3, "node_reboot")
    ]
    assert dry[0].fired_at == HealthRuleFiring.objects.get().fired_at


def test_a_simulated_gpu_that_falls_off_the_bus_is_reported_lost_like_a_real_one(make_host):
    host = make_host("h100-sxm5-80gb", gpus=2, hostname="lost-01")
    lost, other = Gpu.objects.filter(host=host).order_by("index")
    simhosts.change(host, lambda state: simhosts.lose_gpu(state, lost.uuid))
    before = datetime.now(UTC)
    assert simhosts.report_in_process(host)
    lost.refresh_from_db()
    assert (lost.health_counters["gpu_is_lost"], lost.health) == (True, "UNHEALTHY")
    assert before <= lost.missing_since <= datetime.now(UTC)  # missing from this report on
    assert Gpu.objects.get(pk=other.pk).health == "HEALTHY"
    simhosts.change(host, simhosts.reboot)
    assert simhosts.report_in_process(host)
    lost.refresh_from_db()
    assert (lost.missing_since, lost.health) == (None, "HEALTHY")


def test_manage_py_simulate_xid_fall_off_bus_loses_the_gpu_until_the_host_reboots(make_host):
    """What an operator types to try a ``fallen-off-bus`` rule (a fresh-user trial found no
    way short of ``manage.py shell``): the Xid is logged and the GPU reported lost."""
    from io import StringIO

    from django.core.management import call_command

    host = make_host("h100-sxm5-80gb", gpus=2, hostname="lost-02")
    lost, other = Gpu.objects.filter(host=host).order_by("index")
    out = StringIO()
    call_command("simulate", "xid", lost.uuid, "79", "--fall-off-bus", stdout=out)
    assert "(fallen off the bus until the host reboots)" in out.getvalue()
    lost.refresh_from_db()
    assert (lost.health_counters["gpu_is_lost"], lost.missing_since is not None) == (True, True)
    assert list(XidEvent.objects.filter(gpu_uuid=lost.uuid).values_list("xid", flat=True)) == [79]
    assert simhosts.read(host.id)["gpus"][1].get("lost") is None  # only that GPU
    assert Gpu.objects.get(pk=other.pk).health_counters.get("gpu_is_lost") is False


NVML_DOWN = {
    "source_error": "NVML: Driver Not Loaded",
    "source_error_code": "NVML_ERROR_DRIVER_NOT_LOADED",
}


def test_nvml_init_failure_3_in_10_min_fires_on_the_third_failing_report(agent):  # noqa: F811
    client, host_id = agent
    rule = {**LOST_RULE, "condition": "NvmlInitFailure"}
    health_rules.save_rule("nvml-init-failure", rule, actor="user:ops")
    # hand-worked: each failing report is one occurrence on the host's one GPU; report 3
    # reads the GPU (none), so the failing reports 1, 2, 4 count 1, 2, 3: fires at report 4
    for seq, failing in enumerate([True, True, False, True], start=1):
        response = report(client, host_id, seq, [], **(NVML_DOWN if failing else {}))
        assert response.status_code == 200, response.json()
        if seq == 2:
            assert firings() == []
            assert Gpu.objects.get(uuid=A10G).health == "UNKNOWN"  # unknown, not unhealthy
            assert not GpuHealthInterval.objects.exists()
    assert firings() == [("nvml-init-failure", A10G, 3, 0, "node_reboot")]
    interval = GpuHealthInterval.objects.get(gpu_uuid=A10G)
    assert (interval.reason, interval.rule_action, interval.detail) == (
        "health_rule",
        "node_reboot",
        "NvmlInitFailure: rule nvml-init-failure fired (3x)",
    )
    assert Gpu.objects.get(uuid=A10G).health == "UNHEALTHY"  # the rule's evidence
    dry = health_rules.dry_run(health_rules.effective_rules(), days=1)
    assert [(f.rule_key, f.gpu_uuid, f.count, f.action) for f in dry] == [
        ("nvml-init-failure", A10G, 3, "node_reboot")
    ]


def test_nvml_init_failure_without_a_rule_is_unknown_and_repairs_nothing(agent):  # noqa: F811
    client, host_id = agent
    for seq in range(1, 5):
        assert report(client, host_id, seq, [], **NVML_DOWN).status_code == 200
    assert Gpu.objects.get(uuid=A10G).health == "UNKNOWN"
    assert not GpuHealthInterval.objects.exists() and firings() == []
    logged = HostEvent.objects.filter(data__signal="nvml_init_failure")
    assert [e.data["gpu_uuids"] for e in logged] == [[A10G]] * 4  # the dry run's record
    # another source error (not NVML init) is no occurrence
    other = {"source_error": "NVML: Unknown Error", "source_error_code": "NVML_ERROR_UNKNOWN"}
    assert report(client, host_id, 5, [], **other).status_code == 200
    assert logged.count() == 4


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"source_error": "x", "source_error_code": "driver not loaded"}, "source_error_code"),
        ({"source_error": "x", "source_error_code": 9}, "source_error_code"),
        ({"source_error_code": "N" * 65}, "source_error_code"),
        (
            {"inventory": {"gpus": [{"uuid": A10G, "index": 0, "health": {"gpu_is_lost": 1}}]}},
            "inventory.gpus[0].health.gpu_is_lost",
        ),
    ],
)
def test_bad_lost_or_error_code_input_is_a_400_naming_the_field(agent, extra, field):  # noqa: F811
    client, host_id = agent
    response = report(client, host_id, 1, [], **extra)
    assert response.status_code == 400
    assert response.json()["field"] == field
