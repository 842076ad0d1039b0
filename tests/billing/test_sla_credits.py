"""SLA credits come from the fleet's GPU health intervals (one truth): the interval an Xid
opens and auto-repair (or an operator, audited) closes is exactly the credit; an Xid naming a
GPU the host does not own is refused and credits nothing. Values worked out by hand.

The host is SIMULATED (``make_host``); the pool, its reconciler, the repair, the agent report
path and the invoice are the real code.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from tests.helpers import make_cluster

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 5, 10, 0, tzinfo=UTC)  # the node is READY
XID_AT = datetime(2026, 11, 5, 11, 35, tzinfo=UTC)  # Xid 48 on GPU index 1
DEC_20 = datetime(2026, 12, 20, tzinfo=UTC)


@pytest.fixture
def price(catalog):
    from billing.prices import set_price

    set_price(
        gpu_model="h100-sxm5-80gb",
        hourly_rate=Decimal("2.50"),
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
        label="list",
    )


def agent_client(host) -> APIClient:
    """The host's agent, registered with a fresh bootstrap token (real credential path)."""
    from fleet.services import register_agent, reissue_bootstrap_token

    _, credential = register_agent(bootstrap_token=reissue_bootstrap_token(host))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
    return client


def xid_report(host, seq: int, gpu_uuid: str, code: int, ts: datetime) -> dict:
    return {
        "host_id": str(host.id),
        "seq": seq,
        "samples": [],
        "events": [{"type": "xid", "ts": ts.isoformat(), "gpu_uuid": gpu_uuid, "xid": code}],
    }


@pytest.fixture
def running_node(owner, make_host, price):
    """Tenant A's pool: one node of 2 H100 on ``h1``, READY at T0 (reconciled at that time)."""
    from nodepools.models import Node
    from nodepools.reconcile import reconcile_nodepool

    host = make_host("h100-sxm5-80gb", gpus=2, hostname="h1")
    cluster = make_cluster(owner, "c")
    pool_id = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {"name": "p", "gpu_model": "h100-sxm5-80gb", "gpus_per_node": 2, "node_count": 1},
        format="json",
    ).json()["target_id"]
    for _ in range(5):
        reconcile_nodepool(pool_id, now=T0)
    node = Node.objects.get(nodepool_id=pool_id)
    assert (node.phase, node.ready_at) == ("READY", T0)
    return host, pool_id, node


def credit_lines(tenant_id):
    from billing.invoices import build_invoice

    invoice = build_invoice(tenant_id, "2026-11", now=DEC_20)
    return invoice, [
        (ln.kind, ln.gpu_seconds, ln.amount) for ln in invoice.lines.filter(kind="SLA_CREDIT")
    ]


def test_a_gpu_fault_repaired_automatically_is_credited_for_exactly_its_unhealthy_interval(
    running_node, tenant_a, django_capture_on_commit_callbacks
):
    """Xid 48 (double-bit ECC; the catalog's action RESET_GPU: a reboot repair) on GPU 1 at
    11:35. The reconciler reboots the node at 11:50 and, back at 12:00, closes the interval:
    unhealthy 11:35-12:00 = 1,500 s on one GPU (GPU scope) = 1,500 GPU-s =
    0.416667 GPU-h x 2.50 = 1.041.. -> credit line -1.04."""
    from clusters.providers import simhosts
    from fleet.models import GpuHealthInterval
    from nodepools.models import Node
    from nodepools.reconcile import reconcile_nodepool

    host, pool_id, node = running_node
    bad = node.gpu_uuids[1]
    agent = agent_client(host)
    with django_capture_on_commit_callbacks(execute=True):
        resp = agent.post(
            "/api/v1/agent/reports", xid_report(host, 1, bad, 48, XID_AT), format="json"
        )
    assert resp.status_code == 200, resp.content
    node.refresh_from_db()
    assert (node.repair_state, node.repair_action) == ("requested", "reboot")
    reconcile_nodepool(pool_id, now=datetime(2026, 11, 5, 11, 50, tzinfo=UTC))  # reboots
    assert Node.objects.get(pk=node.pk).repair_state == "rebooting"
    # back from the reboot, the host's agent reports (SIMULATED host: what its state shows,
    # a clean GPU); only then does the repair end and the interval close
    with django_capture_on_commit_callbacks(execute=True):
        resp = agent.post(
            "/api/v1/agent/reports", simhosts.simulated_report(host, 2), format="json"
        )
    assert resp.status_code == 200, resp.content
    reconcile_nodepool(pool_id, now=datetime(2026, 11, 5, 12, 0, tzinfo=UTC))  # back, closed
    interval = GpuHealthInterval.objects.get(gpu_uuid=bad)
    assert (interval.started_at, interval.ended_at, interval.ended_by) == (
        XID_AT,
        datetime(2026, 11, 5, 12, 0, tzinfo=UTC),
        "auto-repair: rebooted, the agent's report is clean",
    )
    invoice, credits = credit_lines(tenant_a.id)
    assert credits == [("SLA_CREDIT", Decimal(-1500), Decimal("-1.04"))]
    (line,) = invoice.lines.filter(kind="SLA_CREDIT")
    assert [(d["gpu_uuid"], d["xid"], d["scope"], d["start"], d["end"]) for d in line.details] == [
        (bad, 48, "gpu", "2026-11-05T11:35:00+00:00", "2026-11-05T12:00:00+00:00")
    ]
    assert line.details[0]["health_interval_id"] == str(interval.public_id)


def test_an_xid_for_a_gpu_the_host_does_not_own_is_refused_and_credits_nothing(
    running_node, tenant_a, make_host
):
    """Host ``h2``'s agent names a GPU of ``h1`` (tenant A's node) with Xid 79, whose catalog
    action RESTART_BM is host-wide: before, billing credited the whole of ``h1``... now the
    report is refused (400, ``events[0].gpu_uuid``) and changes nothing."""
    from fleet.models import AgentReport, GpuHealthInterval, Host, XidEvent

    _host, _pool_id, node = running_node
    other = make_host("h100-sxm5-80gb", gpus=2, hostname="h2")
    client = agent_client(other)
    resp = client.post(
        "/api/v1/agent/reports",
        xid_report(other, 1, node.gpu_uuids[0], 79, XID_AT),
        format="json",
    )
    assert resp.status_code == 400
    assert resp["Content-Type"].startswith("application/problem+json")
    problem = resp.json()
    assert (problem["code"], problem["field"]) == ("invalid_report", "events[0].gpu_uuid")
    assert f"{node.gpu_uuids[0]!r} is not a GPU of host h2" in problem["detail"]
    assert not XidEvent.objects.exists()
    assert not AgentReport.objects.filter(host=other).exists()  # not even the seq is taken
    assert not GpuHealthInterval.objects.exists()
    assert set(Host.objects.values_list("hostname", "state")) == {
        ("h1", "ALLOCATED"),
        ("h2", "AVAILABLE"),
    }
    assert credit_lines(tenant_a.id)[1] == []
    # the same seq with the host's own GPU is accepted afterwards (nothing was claimed)
    own = Host.objects.get(pk=other.pk).gpus.first().uuid
    resp = client.post(
        "/api/v1/agent/reports", xid_report(other, 1, own, 79, XID_AT), format="json"
    )
    assert (resp.status_code, resp.json()["duplicate"]) == (200, False)
    assert credit_lines(tenant_a.id)[1] == []  # h2 holds no allocation: no one is credited


def test_an_operator_ends_an_interval_through_the_api_and_it_is_audited(
    running_node, tenant_a, operator
):
    """Xid 79 (RESTART_BM, host-wide) on GPU 0 at 11:35, no automatic repair done yet; the
    operator marks the GPU healthy. Credit: both GPUs of the host from 11:35 to the operator's
    end; the audit log names the interval ended."""
    from fleet.health import handle_xid
    from fleet.models import GpuHealthInterval, XidEvent
    from tenants.models import AuditEvent

    host, _pool_id, node = running_node
    bad = node.gpu_uuids[0]
    event = XidEvent.objects.create(host=host, gpu_uuid=bad, ts=XID_AT, xid=79, report_seq=1)
    handle_xid(host, event, XID_AT)
    before = datetime.now(UTC)
    resp = operator.post(
        f"/api/v1/fleet/hosts/{host.id}/mark-healthy", {"gpu_uuids": [bad]}, format="json"
    )
    assert (resp.status_code, resp.json()) == (200, {"marked_healthy": [bad]})
    interval = GpuHealthInterval.objects.get(gpu_uuid=bad)
    assert before <= interval.ended_at <= datetime.now(UTC)
    audit = AuditEvent.objects.get(action="host.mark_healthy")
    assert audit.actor.startswith("apikey:")
    assert audit.after["intervals_ended"] == [
        {
            "gpu_uuid": bad,
            "reason": "xid",
            "xid": 79,
            "started_at": XID_AT.isoformat(),
            "ended_at": interval.ended_at.isoformat(),
        }
    ]
    # the credit is that interval, on every GPU of the host (RESTART_BM: host scope)
    from billing.health import credit_intervals

    got = credit_intervals(start=T0, end=interval.ended_at + timedelta(hours=1))
    assert sorted((c.gpu_uuid, c.start, c.end, c.scope, c.xid) for c in got) == sorted(
        (uuid, XID_AT, interval.ended_at, "host", 79) for uuid in node.gpu_uuids
    )
