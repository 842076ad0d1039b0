"""Ingestion of reports from agents that misbehave the way a fault trial found (issue 29):
clocks ±600 s off, two agents with one identity, a full spool disk, and host warnings that
must not come back once cleared. Reports go through the real ingestion with the server's
receive time given, so offsets are exact.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from tests.conftest import capture

pytestmark = pytest.mark.django_db

A10G = "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"
NOW = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


@pytest.fixture
def host(operator, catalog):
    from fleet.models import Host

    created = operator.post(
        "/api/v1/fleet/hosts",
        {"hostname": "h1", "zone": "us-east-1a", "nvidia_smi_xml": capture("a10g.xml")},
        format="json",
    ).json()
    return Host.objects.get(pk=created["id"])


def ingest(host, body, now=NOW):
    from fleet.ingest import ingest_report
    from fleet.models import Host

    return ingest_report(Host.objects.get(pk=host.pk), {"host_id": str(host.id), **body}, now=now)


def sample(ts, util=50.0):
    return {"ts": ts.isoformat(), "gpu_uuid": A10G, "utilization_gpu_pct": util}


def stored_ts():
    with connection.cursor() as cursor:
        cursor.execute("SELECT ts FROM fleet_gpusample ORDER BY ts")
        return [row[0] for row in cursor.fetchall()]


def warnings_of(host):
    from fleet.models import Host

    return Host.objects.get(pk=host.pk).warnings


# --- clocks -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("offset", "way"), [(-600, "behind"), (600, "ahead of")])
def test_an_agent_clock_600_s_off_either_way_is_redated_by_the_measured_offset_and_warned(
    host, offset, way
):
    """The agent's clock reads NOW + offset; it samples at its NOW-10 and NOW and sends at its
    NOW. Skew = sent_at - receive time = offset exactly. Before: 600 s behind, stored dated
    before the allocation began; 600 s ahead, all refused as ts_in_future. Now both are stored
    at the server's time of the reading, and warned the same way."""
    agent_now = NOW + timedelta(seconds=offset)
    ack = ingest(
        host,
        {
            "seq": 1,
            "sent_at": agent_now.isoformat(),
            "samples": [sample(agent_now - timedelta(seconds=10)), sample(agent_now)],
            "events": [{"type": "xid", "ts": agent_now.isoformat(), "gpu_uuid": A10G, "xid": 13}],
        },
    )
    assert (ack.samples_stored, ack.samples_rejected, ack.samples_redated) == (2, 0, 2)
    assert stored_ts() == [NOW - timedelta(seconds=10), NOW]
    from fleet.models import AgentReport, XidEvent

    assert XidEvent.objects.get().ts == NOW
    assert AgentReport.objects.get().clock_skew_s == offset
    assert warnings_of(host) == [
        f"agent clock: about 600 s {way} the server's (its sent_at against the receive time); "
        f"its sample and Xid times are re-dated by {-offset:+d} s (allowed skew 60 s): fix the "
        "host's NTP"
    ]
    # the clock fixed: the warning goes, samples are taken as dated
    fixed = {"seq": 2, "sent_at": NOW.isoformat(), "samples": [sample(NOW + timedelta(seconds=1))]}
    ingest(host, fixed)
    assert warnings_of(host) == []


def test_a_spool_replayed_after_an_outage_is_old_not_skewed(host):
    """Samples 40 minutes old, sent now by an agent with a good clock: the skew is the
    sent_at's (0 s), never the samples' age: stored as dated, no warning."""
    old = NOW - timedelta(minutes=40)
    ack = ingest(host, {"seq": 1, "sent_at": NOW.isoformat(), "samples": [sample(old)]})
    assert (ack.samples_stored, ack.samples_redated) == (1, 0)
    assert stored_ts() == [old]
    assert warnings_of(host) == []


def test_a_skew_within_the_allowed_one_moves_nothing(host):
    agent_now = NOW + timedelta(seconds=45)
    ingest(host, {"seq": 1, "sent_at": agent_now.isoformat(), "samples": [sample(agent_now)]})
    assert stored_ts() == [agent_now]
    assert warnings_of(host) == []


# --- one writer of host warnings ----------------------------------------------------------------


def test_a_warning_cleared_while_a_report_is_in_flight_stays_cleared(host):
    """The trial's 21-minute stale warning: the report's request loaded the host (its
    warnings then held the gate's "waiting for the agent"), the gate cleared that warning as
    the node became READY, then the report's transaction wrote the whole list it had read
    back. Now each writer edits only its own kind in the row's current list."""
    from fleet.host_warnings import OBSERVED_STATE, set_host_warning
    from fleet.ingest import ingest_report
    from fleet.models import Host

    waiting = f"{OBSERVED_STATE}n1 waiting for the agent: driver 550 expected, 535 reported"
    set_host_warning(host.pk, f"{OBSERVED_STATE}n1 ", waiting)
    in_flight = Host.objects.get(pk=host.pk)  # what the credential check loaded
    assert in_flight.warnings == [waiting]
    set_host_warning(host.pk, f"{OBSERVED_STATE}n1 ", None)  # node READY: the gate clears it
    skewed = (NOW + timedelta(seconds=600)).isoformat()
    body = {"host_id": str(host.id), "seq": 1, "sent_at": skewed, "samples": []}
    ingest_report(in_flight, body, now=NOW)
    (only,) = warnings_of(host)
    assert only.startswith("agent clock: about 600 s ahead")


def test_writers_of_different_kinds_keep_each_others_warnings_and_their_order(host):
    from fleet import host_warnings as hw

    assert hw.set_host_warning(host.pk, hw.AGENT_SOURCE, "agent source: NVML down") is True
    assert hw.set_host_warning(host.pk, hw.NVLINK_DOMAIN, "nvlink domain: GPUs disagree") is True
    assert hw.set_host_warning(host.pk, hw.AGENT_SOURCE, "agent source: NVML down") is False
    hw.set_host_warnings(host.pk, {hw.AGENT_SOURCE: None, hw.AGENT_SPOOL: "agent spool: full"})
    assert warnings_of(host) == ["nvlink domain: GPUs disagree", "agent spool: full"]


# --- two agents, one identity -------------------------------------------------------------------


def test_a_seq_seen_again_with_other_content_flags_the_host_and_keeps_the_evidence(host):
    """The original agent (instance A) and a copy of its state dir (instance B) both send seq
    1. Before, B's batch was acknowledged as a duplicate and its samples dropped silently."""
    from fleet import metrics
    from fleet.models import HostEvent

    counter = metrics.REPORTS.labels(outcome="identity_conflict")
    before = counter._value.get()
    a = {"seq": 1, "instance_id": "A", "samples": [sample(NOW)]}
    other = [sample(NOW, 7.0), sample(NOW + timedelta(seconds=1))]
    b = {"seq": 1, "instance_id": "B", "samples": other}
    assert ingest(host, {**a, "sent_at": NOW.isoformat()}).duplicate is False
    ack = ingest(host, {**b, "sent_at": NOW.isoformat()})
    assert (ack.duplicate, ack.identity_conflict, ack.as_dict()["identity_conflict"]) == (
        True,
        True,
        True,
    )
    assert stored_ts() == [NOW]  # the first report stays the stored one
    event = HostEvent.objects.get(kind="identity")
    assert event.data["seq"] == 1
    assert (event.data["first"]["instance_id"], event.data["again"]["instance_id"]) == ("A", "B")
    assert event.data["body"]["samples"] == b["samples"]  # the evidence, whole
    assert event.data["first"]["content_sha256"] != event.data["again"]["content_sha256"]
    (warning,) = warnings_of(host)
    assert warning.startswith("agent identity: two agents report as this host")
    assert "A and B both sent seq 1" in warning
    assert counter._value.get() == before + 1
    from fleet.metrics import COLLECTOR

    (warned,) = [f for f in COLLECTOR.collect() if f.name == "nvke_fleet_hosts_warned"]
    by_kind = {s.labels["kind"]: s.value for s in warned.samples}
    assert (by_kind["agent_identity"], by_kind["agent_spool"]) == (1, 0)


def test_a_resend_or_a_restarted_agent_is_not_flagged(host):
    """The same batch again — after a lost answer (a new sent_at), or sent by the agent's next
    instance from its spool (the body keeps the instance that produced it, new agent_status)
    — is a plain duplicate; the restarted instance's own reports take new seqs."""
    from fleet.models import HostEvent

    a = {"seq": 1, "instance_id": "A", "samples": [sample(NOW)]}
    ingest(host, {**a, "sent_at": NOW.isoformat()})
    later = (NOW + timedelta(seconds=30)).isoformat()
    again = ingest(host, {**a, "sent_at": later, "agent_status": {"spool_error": None}})
    assert (again.duplicate, again.identity_conflict) == (True, False)
    fresh = {"seq": 2, "instance_id": "C", "samples": [sample(NOW + timedelta(seconds=10))]}
    assert ingest(host, {**fresh, "sent_at": later}).duplicate is False
    assert not HostEvent.objects.filter(kind="identity").exists()
    assert warnings_of(host) == []


def test_registering_again_clears_the_identity_warning(host):
    from fleet.services import register_agent, reissue_bootstrap_token

    ingest(host, {"seq": 1, "instance_id": "A", "sent_at": NOW.isoformat(), "samples": []})
    ingest(host, {"seq": 1, "instance_id": "B", "sent_at": NOW.isoformat(), "samples": []})
    assert warnings_of(host)[0].startswith("agent identity:")
    register_agent(bootstrap_token=reissue_bootstrap_token(host))
    assert warnings_of(host) == []


# --- an agent that cannot write its spool -------------------------------------------------------


def test_an_agent_that_cannot_write_its_spool_is_a_host_warning_until_it_can(host):
    status = {"spool_error": "[Errno 28] No space left on device", "dropped_reports": 3}
    status["dropped_samples"] = 24
    ingest(host, {"seq": 1, "sent_at": NOW.isoformat(), "agent_status": status})
    assert warnings_of(host) == [
        "agent spool: the agent cannot write its state dir ([Errno 28] No space left on "
        "device): it delivers what is spooled but makes no new reports; 3 report(s) / 24 "
        "sample(s) dropped so far"
    ]
    ok = {"spool_error": None, "dropped_reports": 3, "dropped_samples": 24}
    ingest(host, {"seq": 2, "sent_at": NOW.isoformat(), "agent_status": ok})
    assert warnings_of(host) == []


def test_a_status_report_warns_with_nothing_spooled_and_stores_nothing(host):
    """An agent with a full disk and an empty spool sends ``seq`` null and only its status: the
    warning is set (and cleared) from it, no report row is claimed and the host is not marked
    as reporting (it still goes NOT_READY after its heartbeat timeout)."""
    from fleet.models import AgentReport, Host

    seen_before = Host.objects.get(pk=host.pk).last_seen_at
    full = {"spool_error": "[Errno 28] No space left on device", "dropped_reports": 5}
    full["dropped_samples"] = 40
    ack = ingest(host, {"seq": None, "sent_at": NOW.isoformat(), "agent_status": full})

    assert ack.as_dict() == {
        "seq": None,
        "duplicate": False,
        "samples_stored": 0,
        "samples_rejected": 0,
        "samples_deduplicated": 0,
        "rejections": {},
        "commands": [],
    }
    assert warnings_of(host) == [
        "agent spool: the agent cannot write its state dir ([Errno 28] No space left on "
        "device): it delivers what is spooled but makes no new reports; 5 report(s) / 40 "
        "sample(s) dropped so far"
    ]
    assert AgentReport.objects.filter(host=host).count() == 0
    assert Host.objects.get(pk=host.pk).last_seen_at == seen_before

    # 600 s behind: the clock warning comes with it, measured the same way as for a report
    ingest(
        host,
        {"seq": None, "sent_at": (NOW - timedelta(seconds=600)).isoformat(), "agent_status": full},
    )
    assert [w.split(" ")[:5] for w in warnings_of(host)][-1] == [
        "agent", "clock:", "about", "600", "s"
    ]  # fmt: skip
    ok = {"spool_error": None, "dropped_reports": 5, "dropped_samples": 40}
    ingest(host, {"seq": None, "sent_at": NOW.isoformat(), "agent_status": ok})
    assert warnings_of(host) == []


@pytest.mark.parametrize(
    "produced",
    [
        {"samples": [sample(NOW)]},
        {"events": [{"ts": NOW.isoformat(), "gpu_uuid": A10G, "xid": 79}]},
        {"inventory": {"gpus": []}},
    ],
)
def test_a_report_that_carries_anything_produced_needs_a_seq(host, produced):
    from fleet.ingest import InvalidReport

    status = {"spool_error": "[Errno 28] No space left on device"}
    with pytest.raises(InvalidReport, match="seq must be an integer"):
        ingest(host, {"seq": None, "agent_status": status, **produced})
