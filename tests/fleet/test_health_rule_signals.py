"""Health rules on signals other than Xids (fleet/health_rules.py "Signals and their
occurrences"): ECC counts and clock-event bits from the agent's samples, through real reports
(HTTP, the real ingest path), the live engine and the dry run; unwired signals are refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleet import health_rules
from fleet.models import GpuHealthInterval, HealthRule, HealthRuleFiring
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
def test_a_rule_on_an_unwired_signal_is_refused_naming_signal(operator, catalog, key):
    response = operator.put(f"{URL}/{key}", ECC_RULE, format="json")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["field"] == "signal"
    assert "does not evaluate" in response.json()["detail"]
    assert not HealthRule.objects.exists()
    dry = operator.post(
        f"{URL}/dry-run", {"days": 1, "rules": [{"key": key, **ECC_RULE}]}, format="json"
    )
    assert (dry.status_code, dry.json()["field"]) == (400, "rules[0].key")
