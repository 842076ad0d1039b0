"""A host credential cannot refund an allocation with a back-dated Xid (issue 26 item 4).

An Xid is late when it is dated before the newest sample of its GPU the server had already
accepted: it is stored, flagged ``late``, and its unhealthy interval — the SLA credit — starts
no earlier than that sample. A spool replayed after an outage is old, not late: its reports
arrive in seq order, so no sample newer than its Xid had been received. Reports go through
the real ingestion (with the server's receive time given), the interval through the real
health code, the credit through the real invoice.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from tests.billing import test_sla_credits as sla

T0, credit_lines = sla.T0, sla.credit_lines
price, running_node = sla.price, sla.running_node  # the fixtures of the SLA credit tests

pytestmark = pytest.mark.django_db


def s(seconds: float):
    return T0 + timedelta(seconds=seconds)


def samples_at(node, seconds: float) -> list[dict]:
    return [
        {"ts": s(seconds).isoformat(), "gpu_uuid": uuid, "utilization_gpu_pct": 90.0}
        for uuid in node.gpu_uuids
    ]


def post(host, seq: int, *, sent: float, samples=(), events=()):
    """A report sent at ``T0 + sent`` s by an agent with a good clock."""
    from fleet.ingest import ingest_report
    from fleet.models import Host

    body = {
        "host_id": str(host.id),
        "seq": seq,
        "sent_at": s(sent).isoformat(),
        "samples": list(samples),
        "events": list(events),
    }
    return ingest_report(Host.objects.get(pk=host.pk), body, now=s(sent))


def xid48(gpu_uuid: str, seconds: float) -> dict:
    return {"type": "xid", "ts": s(seconds).isoformat(), "gpu_uuid": gpu_uuid, "xid": 48}


def end_interval(gpu_uuid: str, seconds: float):
    from fleet.health import close_unhealthy
    from fleet.models import Gpu, GpuHealthInterval

    close_unhealthy(Gpu.objects.get(uuid=gpu_uuid), at=s(seconds), ended_by="test: repaired")
    return GpuHealthInterval.objects.get(gpu_uuid=gpu_uuid)


def test_an_xid_posted_91_s_into_an_allocation_dated_1_s_into_it_credits_from_the_last_sample(
    running_node, tenant_a
):
    """The trial's numbers: samples every 10 s from T0+10 to T0+90 were accepted; at T0+91 the
    host posts Xid 48 dated T0+1. Before, the interval began at T0+1 (99 % of the first
    100 s); now the Xid is stored with its own date, flagged late, and the interval — the
    credit — begins at T0+90, the newest sample: ended at T0+100 it is 10 GPU-s, not 99."""
    from fleet.models import GpuHealthInterval, HostEvent, XidEvent

    host, _pool, node = running_node
    bad = node.gpu_uuids[1]
    for seq, at in enumerate(range(10, 100, 10), start=1):
        post(host, seq, sent=at, samples=samples_at(node, at))
    post(host, 10, sent=91, events=[xid48(bad, 1)])

    event = XidEvent.objects.get()
    assert (event.ts, event.late, event.credit_from) == (s(1), True, s(90))
    interval = GpuHealthInterval.objects.get(gpu_uuid=bad)
    assert interval.started_at == s(90)
    message = HostEvent.objects.get(kind="xid").message
    assert "LATE" in message and s(90).isoformat() in message
    interval = end_interval(bad, 100)
    assert (interval.started_at, interval.ended_at) == (s(90), s(100))
    _invoice, credits = credit_lines(tenant_a.id)
    assert credits == [("SLA_CREDIT", Decimal(-10), Decimal("-0.01"))]  # 10 s x 2.50/h


def test_a_spool_replayed_after_an_outage_still_earns_its_xids_credit(running_node, tenant_a):
    """The host's network is down from T0+35 to T0+300: its agent spools a report every
    10 s, the one made at T0+100 with Xid 48 dated T0+100. At T0+300 the spool is replayed in
    seq order (sent_at is the replay time: the clock is good, the data old). No sample newer
    than the Xid had been received when it arrived: not late, credited from T0+100."""
    from fleet.models import GpuHealthInterval, XidEvent

    host, _pool, node = running_node
    bad = node.gpu_uuids[1]
    post(host, 1, sent=10, samples=samples_at(node, 10))
    post(host, 2, sent=20, samples=samples_at(node, 20))
    post(host, 3, sent=30, samples=samples_at(node, 30))
    for seq, at in enumerate(range(40, 210, 10), start=4):  # the spool, replayed at T0+300
        events = [xid48(bad, 100)] if at == 100 else []
        ack = post(host, seq, sent=300, samples=samples_at(node, at), events=events)
        assert (ack.samples_stored, ack.samples_redated) == (2, 0)

    event = XidEvent.objects.get()
    assert (event.ts, event.late, event.credit_from) == (s(100), False, None)
    assert GpuHealthInterval.objects.get(gpu_uuid=bad).started_at == s(100)
    interval = end_interval(bad, 400)
    assert (interval.started_at, interval.ended_at) == (s(100), s(400))
    _invoice, credits = credit_lines(tenant_a.id)
    assert credits == [("SLA_CREDIT", Decimal(-300), Decimal("-0.21"))]  # 300 s x 2.50/h


def test_withholding_the_faulty_gpus_samples_does_not_make_a_back_dated_xid_on_time(
    running_node, tenant_a
):
    """The trial's variant: the host reports GPU 0 every 10 s from T0+10 to T0+90 but never
    GPU 1, then at T0+91 posts Xid 48 on GPU 1 dated T0+1. With lateness judged on GPU 1's
    own samples (there were none) it was on time and credited 99 of the first 100 s; judged
    on the host's newest sample (T0+90, GPU 0) it is late and credits 10 s."""
    from fleet.models import XidEvent

    host, _pool, node = running_node
    good, bad = node.gpu_uuids
    for seq, at in enumerate(range(10, 100, 10), start=1):
        only_good = [x for x in samples_at(node, at) if x["gpu_uuid"] == good]
        post(host, seq, sent=at, samples=only_good)
    post(host, 10, sent=91, events=[xid48(bad, 1)])

    event = XidEvent.objects.get()
    assert (event.ts, event.late, event.credit_from) == (s(1), True, s(90))
    interval = end_interval(bad, 100)
    assert (interval.started_at, interval.ended_at) == (s(90), s(100))
    _invoice, credits = credit_lines(tenant_a.id)
    assert credits == [("SLA_CREDIT", Decimal(-10), Decimal("-0.01"))]  # 10 s x 2.50/h
