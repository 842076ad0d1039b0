"""GPU health intervals and host heartbeats (fleet/health.py), worked out by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, transaction

from fleet import health
from fleet.models import Gpu, GpuHealthInterval, Host

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


@pytest.fixture
def gpu(make_host):
    host = make_host("h100-sxm5-80gb", gpus=2, hostname="gpu-01")
    return Gpu.objects.get(host=host, index=0)


def intervals():
    return list(
        GpuHealthInterval.objects.order_by("started_at").values_list(
            "reason", "xid", "needs_operator", "started_at", "ended_at", "ended_by"
        )
    )


def test_a_cause_needing_the_operator_supersedes_one_that_does_not(gpu):
    health.open_unhealthy(gpu, reason="gpu_missing", at=T0, needs_operator=False)
    # the same cause again changes nothing
    health.open_unhealthy(
        gpu, reason="gpu_missing", at=T0 + timedelta(minutes=1), needs_operator=False
    )
    health.open_unhealthy(
        gpu, reason="xid", at=T0 + timedelta(minutes=5), needs_operator=True, xid=79
    )
    # a lesser cause while the operator one is open is only logged
    health.open_unhealthy(
        gpu, reason="host_not_ready", at=T0 + timedelta(minutes=6), needs_operator=False
    )
    health.close_unhealthy(gpu, at=T0 + timedelta(minutes=30), ended_by="operator")
    assert intervals() == [
        ("gpu_missing", None, False, T0, T0 + timedelta(minutes=5), "superseded by xid"),
        ("xid", 79, True, T0 + timedelta(minutes=5), T0 + timedelta(minutes=30), "operator"),
    ]
    # 10:00-10:30 unhealthy; in [10:10, 11:00) that is 20 min, 20 of them needing the operator
    window = (T0 + timedelta(minutes=10), T0 + timedelta(hours=1))
    assert health.unhealthy_seconds(gpu.uuid, *window) == 20 * 60
    assert health.unhealthy_seconds(gpu.uuid, *window, needs_operator=True) == 20 * 60
    # over the whole morning: 5 min missing + 25 min Xid
    morning = (T0 - timedelta(hours=1), T0 + timedelta(hours=2))
    assert health.unhealthy_seconds(gpu.uuid, *morning, needs_operator=False) == 5 * 60
    assert health.unhealthy_seconds(gpu.uuid, *morning, needs_operator=True) == 25 * 60


def test_an_open_interval_counts_until_the_end_of_the_window(gpu):
    health.open_unhealthy(gpu, reason="xid", at=T0, needs_operator=True, xid=48)
    assert health.unhealthy_seconds(gpu.uuid, T0, T0 + timedelta(hours=2)) == 7200
    assert Gpu.objects.get(pk=gpu.pk).health == "UNHEALTHY"


def test_the_database_refuses_overlapping_intervals(gpu):
    GpuHealthInterval.objects.create(
        gpu=gpu,
        gpu_uuid=gpu.uuid,
        host=gpu.host,
        started_at=T0,
        ended_at=T0 + timedelta(hours=1),
        reason="xid",
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        GpuHealthInterval.objects.create(
            gpu=gpu,
            gpu_uuid=gpu.uuid,
            host=gpu.host,
            started_at=T0 + timedelta(minutes=30),
            ended_at=T0 + timedelta(hours=2),
            reason="xid",
        )
    # touching is fine: [10:00, 11:00) then [11:00, …)
    GpuHealthInterval.objects.create(
        gpu=gpu,
        gpu_uuid=gpu.uuid,
        host=gpu.host,
        started_at=T0 + timedelta(hours=1),
        reason="operator",
    )
    with pytest.raises(IntegrityError), transaction.atomic():  # a second open one
        GpuHealthInterval.objects.create(
            gpu=gpu,
            gpu_uuid=gpu.uuid,
            host=gpu.host,
            started_at=T0 + timedelta(hours=5),
            reason="operator",
        )


def test_a_silent_host_becomes_not_ready_and_comes_back_with_its_next_report(gpu, settings):
    settings.NVKE_HOST_HEARTBEAT_TIMEOUT_S = 120
    host = gpu.host
    Host.objects.filter(pk=host.pk).update(
        credential_hash="c" * 64, last_seen_at=T0, state="ALLOCATED"
    )
    assert health.mark_silent_hosts_not_ready(T0 + timedelta(seconds=119)) == 0
    assert health.mark_silent_hosts_not_ready(T0 + timedelta(seconds=121)) == 1
    host.refresh_from_db()
    assert (host.state, host.state_reason) == ("NOT_READY", "no agent report for 120 s")
    assert sorted(GpuHealthInterval.objects.values_list("reason", "needs_operator")) == [
        ("host_not_ready", False),
        ("host_not_ready", False),
    ]
    health.host_reported(host, T0 + timedelta(minutes=10))
    host.refresh_from_db()
    assert host.state == "AVAILABLE"  # no GPU held
    assert set(GpuHealthInterval.objects.values_list("ended_at", flat=True)) == {
        T0 + timedelta(minutes=10)
    }
    assert set(Gpu.objects.values_list("health", flat=True)) == {"HEALTHY"}


def test_hosts_without_an_agent_are_never_marked_not_ready(gpu):
    Host.objects.filter(pk=gpu.host_id).update(last_seen_at=None)
    assert health.mark_silent_hosts_not_ready(T0 + timedelta(days=1)) == 0


def test_a_simulated_host_reported_in_process_is_not_a_silent_agent(gpu, settings):
    """Found by a new-user trial: make run's demo hosts (no agent registered, reports made
    in-process when the provider acts) went NOT_READY two minutes after their last change and
    could not be brought back. Without a credential there is no agent to fall silent."""
    settings.NVKE_HOST_HEARTBEAT_TIMEOUT_S = 120
    Host.objects.filter(pk=gpu.host_id).update(
        credential_hash="", last_seen_at=T0, state="ALLOCATED"
    )
    assert health.mark_silent_hosts_not_ready(T0 + timedelta(days=1)) == 0
    assert Host.objects.get(pk=gpu.host_id).state == "ALLOCATED"
