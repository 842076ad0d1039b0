"""Health rules (fleet/health_rules.py) through the live Xid path and the dry run.

"Xid 31 three times in 10 minutes -> GPU reset": Xid 31 is an application error (the catalog
says RESTART_APP; no default rule), so the operator's rule decides it alone. Hosts are
SIMULATED rows (``make_host``); events go through the real ``handle_xids`` on the real DB.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleet import health, health_rules
from fleet.models import Gpu, GpuHealthInterval, HealthRuleFiring, Host, XidEvent
from tenants.models import AuditEvent

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
RULE = {
    "threshold_count": 3,
    "window_s": 600,
    "condition": "GpuMemoryFaults",
    "ladder": ["gpu_reset", "node_reboot"],
    "escalation_window_s": 3600,
    "needs_operator": True,
    "enabled": True,
}


@pytest.fixture
def gpu(make_host):
    host = make_host("h100-sxm5-80gb", gpus=2, hostname="rules-01")
    return Gpu.objects.get(host=host, index=0)


def xid(gpu: Gpu, code: int, at: datetime) -> str:
    """One Xid as ingestion stores it, then applied; returns the outcome."""
    host = Host.objects.get(pk=gpu.host_id)
    seq = XidEvent.objects.count() + 1
    event = XidEvent.objects.create(host=host, gpu_uuid=gpu.uuid, ts=at, xid=code, report_seq=seq)
    return health.handle_xids(host, [event], at)[0]


def test_xid_31_three_times_in_ten_minutes_resets_the_gpu_on_the_third_not_the_second(gpu):
    health_rules.save_rule("xid-31", RULE, actor="user:ops")
    assert xid(gpu, 31, T0) == "logged"
    assert xid(gpu, 31, T0 + timedelta(minutes=4)) == "logged"
    assert Gpu.objects.get(pk=gpu.pk).health == "HEALTHY"  # two of three: nothing yet
    assert xid(gpu, 31, T0 + timedelta(minutes=9)) == "unhealthy"
    interval = GpuHealthInterval.objects.get(gpu=gpu)
    assert (interval.started_at, interval.xid, interval.rule_action, interval.needs_operator) == (
        T0 + timedelta(minutes=9),
        31,
        "gpu_reset",
        True,
    )
    assert interval.detail.startswith("GpuMemoryFaults: Xid 31")
    assert list(HealthRuleFiring.objects.values_list("rule_key", "count", "step", "action")) == [
        ("xid-31", 3, 0, "gpu_reset")
    ]


def test_three_events_spread_over_more_than_the_window_never_fire(gpu):
    health_rules.save_rule("xid-31", RULE, actor="user:ops")
    outcomes = [xid(gpu, 31, T0 + timedelta(minutes=m)) for m in (0, 6, 12, 18)]
    # each 10-minute window [t-10 min, t] holds two of them at most
    assert outcomes == ["logged"] * 4
    assert not HealthRuleFiring.objects.exists()


def test_recurring_within_the_escalation_window_escalates_to_a_node_reboot(gpu):
    health_rules.save_rule("xid-31", RULE, actor="user:ops")
    for m in (0, 1, 2):
        xid(gpu, 31, T0 + timedelta(minutes=m))
    # auto-repair reset the GPU: the interval closes
    health.close_unhealthy(gpu, at=T0 + timedelta(minutes=10), ended_by="auto-repair")
    # it comes back 30 min later, three times again: within the hour -> the next step
    outcomes = [xid(gpu, 31, T0 + timedelta(minutes=m)) for m in (30, 31, 32)]
    assert outcomes == ["logged", "logged", "unhealthy"]
    assert GpuHealthInterval.objects.get(gpu=gpu, ended_at__isnull=True).rule_action == (
        "node_reboot"
    )
    # and again: the ladder's last step repeats
    health.close_unhealthy(gpu, at=T0 + timedelta(minutes=40), ended_by="auto-repair")
    for m in (50, 51, 52):
        xid(gpu, 31, T0 + timedelta(minutes=m))
    assert list(HealthRuleFiring.objects.values_list("step", "action")) == [
        (0, "gpu_reset"),
        (1, "node_reboot"),
        (1, "node_reboot"),
    ]


def test_after_the_escalation_window_the_ladder_starts_again(gpu):
    health_rules.save_rule("xid-31", RULE, actor="user:ops")
    for m in (0, 1, 2):
        xid(gpu, 31, T0 + timedelta(minutes=m))
    health.close_unhealthy(gpu, at=T0 + timedelta(minutes=10), ended_by="auto-repair")
    for m in (200, 201, 202):  # 3 h later: beyond the 1 h escalation window
        xid(gpu, 31, T0 + timedelta(minutes=m))
    assert list(HealthRuleFiring.objects.values_list("step", flat=True)) == [0, 0]


def test_the_catalog_defaults_keep_todays_mapping(gpu):
    rules = health_rules.effective_rules()
    assert rules["xid-79"].ladder == ("node_reboot", "replace", "hardware_ticket")
    assert rules["xid-48"].ladder == ("gpu_reset", "node_reboot", "replace", "hardware_ticket")
    assert rules["xid-95"].ladder[0] == "gpu_reset"
    assert rules["xid-61"].ladder == ("replace", "hardware_ticket")  # CONTACT_SUPPORT
    assert "xid-31" not in rules and "xid-13" not in rules  # application errors: logged
    assert {r.threshold_count for r in rules.values()} == {1}
    assert xid(gpu, 79, T0) == "cordoned"  # RESTART_BM is host-scoped
    assert GpuHealthInterval.objects.get(gpu=gpu).rule_action == "node_reboot"


def test_a_disabled_override_turns_a_default_off_and_deleting_it_restores_it(gpu):
    health_rules.save_rule("xid-95", {**RULE, "threshold_count": 1, "enabled": False}, actor="ops")
    assert xid(gpu, 95, T0) == "logged"
    rule = health_rules.delete_rule("xid-95", actor="ops")
    assert (rule.source, rule.ladder[0]) == ("catalog", "gpu_reset")
    assert xid(gpu, 95, T0 + timedelta(minutes=1)) == "unhealthy"


def test_every_change_is_versioned_and_audited(gpu):
    first = health_rules.save_rule("xid-31", RULE, actor="user:alice")
    second = health_rules.save_rule("xid-31", {**RULE, "threshold_count": 5}, actor="user:bob")
    assert (first.version, second.version, second.updated_by) == (1, 2, "user:bob")
    events = list(
        AuditEvent.objects.filter(target_type="health_rule")
        .order_by("ts", "id")
        .values_list("actor", "action", "before", "after")
    )
    assert events[0][:2] == ("user:alice", "health_rule.save")
    assert events[0][3]["threshold_count"] == 3 and events[0][3]["version"] == 1
    # only the changed fields are kept: bob changed the threshold (3 -> 5) and the version
    assert events[1][1:] == (
        "health_rule.save",
        {"threshold_count": 3, "version": 1},
        {"threshold_count": 5, "version": 2},
    )


def test_the_dry_run_replays_the_stored_events_through_unsaved_rules(gpu):
    now = T0 + timedelta(days=3)
    other = Gpu.objects.get(host=gpu.host, index=1)
    host = Host.objects.get(pk=gpu.host_id)
    times = [T0 + timedelta(minutes=m) for m in (0, 3, 6, 40, 41, 42)]  # two bursts of three
    XidEvent.objects.bulk_create(
        [
            XidEvent(host=host, gpu_uuid=gpu.uuid, ts=t, xid=31, report_seq=i)
            for i, t in enumerate(times)
        ]
        + [XidEvent(host=host, gpu_uuid=other.uuid, ts=T0, xid=31, report_seq=99)]
        + [
            XidEvent(
                host=host, gpu_uuid=other.uuid, ts=T0 - timedelta(days=5), xid=79, report_seq=98
            )
        ]
    )
    proposed = health_rules.rule_from_row(
        health_rules.HealthRule(signal="xid", xid=31, version=0, **RULE)
    )
    rules = health_rules.with_overrides(health_rules.effective_rules(), [proposed])
    firings = health_rules.dry_run(rules, days=7, now=now)
    assert [(f.gpu_uuid, f.fired_at, f.count, f.action) for f in firings] == [
        (gpu.uuid, T0 + timedelta(minutes=6), 3, "gpu_reset"),
        (gpu.uuid, T0 + timedelta(minutes=42), 3, "node_reboot"),
    ]
    # the Xid 79 eight days back is outside a 7-day look-back, inside a 9-day one
    assert health_rules.dry_run(rules, days=9, now=now)[0].action == "node_reboot"
    # the dry run changed nothing
    assert not HealthRuleFiring.objects.exists()
    assert not GpuHealthInterval.objects.exists()
    with pytest.raises(ValueError):
        health_rules.dry_run(rules, days=0, now=now)
