"""Hourly usage records: computed in SQL from the ledger, idempotent, exact across DST days."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 10, 40, tzinfo=UTC)
LATER = datetime(2026, 12, 20, tzinfo=UTC)


def records(tenant) -> list[tuple]:
    from billing.models import UsageRecord

    return list(
        UsageRecord.objects.filter(tenant=tenant)
        .order_by("start", "nodepool_id")
        .values_list("start", "end", "gpu_seconds", "allocated_seconds", "sla_credit_gpu_seconds")
    )


@pytest.fixture
def h100_pool_90_minutes(owner, make_host, tenant_a):
    """2 nodes x 8 H100 through the real reconciler: READY at 10:40, released at 12:10 UTC."""
    from nodepools.reconcile import reconcile_nodepool
    from tests.helpers import drive_cluster

    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1b")
    cluster = owner.post(
        "/api/v1/clusters",
        {"name": "train", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    ).json()["target_id"]
    drive_cluster(cluster)
    pool = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {"name": "h100", "gpu_model": "h100-sxm5-80gb", "gpus_per_node": 8, "node_count": 2},
        format="json",
    ).json()["target_id"]
    for _ in range(5):
        if reconcile_nodepool(pool, now=T0) is None:
            break
    assert owner.delete(f"/api/v1/clusters/{cluster}/nodepools/{pool}").status_code == 202
    reconcile_nodepool(pool, now=T0 + timedelta(minutes=90))
    return cluster, pool


def test_two_nodes_of_8_h100_for_90_minutes_from_10_40_make_three_hourly_records(
    tenant_a, h100_pool_90_minutes
):
    """16 GPUs: 10:40-11:00 = 16 x 1200 s; 11:00-12:00 = 16 x 3600 s; 12:00-12:10 = 16 x 600 s.
    Total 86,400 GPU-s = 24 GPU-hours."""
    from billing.aggregation import aggregate_usage

    result = aggregate_usage(tenant_a.id, T0, T0 + timedelta(hours=3), now=LATER)
    h = datetime(2026, 11, 2, 10, tzinfo=UTC)
    assert records(tenant_a) == [
        (h, h + timedelta(hours=1), Decimal(19200), Decimal(19200), Decimal(0)),
        (h + timedelta(hours=1), h + timedelta(hours=2), Decimal(57600), Decimal(57600), 0),
        (h + timedelta(hours=2), h + timedelta(hours=3), Decimal(9600), Decimal(9600), 0),
    ]
    assert result.gpu_seconds == Decimal(86400)
    # the window widened to the whole UTC day of 2 November
    assert (result.start, result.end) == (h.replace(hour=0), h.replace(hour=0) + timedelta(days=1))


def test_aggregating_twice_or_after_a_late_ledger_row_never_double_counts(world, tenant_a):
    from billing.aggregation import aggregate_usage
    from billing.models import UsageRecord

    host = world.make_host("h100-sxm5-80gb", gpus=8)
    pool = world.pool(tenant_a)
    world.hold(
        pool,
        host,
        T0,
        T0 + timedelta(minutes=90),
        gpus=list(host.gpus.order_by("index").values_list("uuid", flat=True)[:4]),
    )
    first = aggregate_usage(tenant_a.id, T0, T0, now=LATER)
    snapshot = records(tenant_a)
    second = aggregate_usage(tenant_a.id, T0, T0, now=LATER)
    assert records(tenant_a) == snapshot
    assert first.gpu_seconds == second.gpu_seconds == Decimal(4 * 5400)
    # a late row (the other 4 GPUs, reported late for 10:40-11:10) arrives, re-run: 4 x 7200 s
    world.hold(
        pool,
        host,
        T0,
        T0 + timedelta(minutes=30),
        gpus=list(host.gpus.order_by("index").values_list("uuid", flat=True)[4:]),
    )
    third = aggregate_usage(tenant_a.id, T0, T0, now=LATER)
    assert third.gpu_seconds == Decimal(4 * 5400 + 4 * 1800)
    assert UsageRecord.objects.filter(tenant=tenant_a).count() == 3


def test_an_open_allocation_counts_up_to_now(world, tenant_a):
    from billing.aggregation import aggregate_usage

    host = world.make_host("h100-sxm5-80gb", gpus=2)
    world.hold(world.pool(tenant_a), host, T0)
    now = T0 + timedelta(minutes=50)  # 11:30
    result = aggregate_usage(tenant_a.id, T0, now, now=now)
    assert result.gpu_seconds == Decimal(2 * 3000)
    assert [r[:3] for r in records(tenant_a)] == [
        (T0.replace(minute=0), T0.replace(minute=0) + timedelta(hours=1), Decimal(2400)),
        (T0.replace(hour=11, minute=0), T0.replace(hour=12, minute=0), Decimal(3600)),
    ]


def test_usage_by_day_follows_the_tenants_dst_day(world, tenant_a):
    """Europe/Berlin, GPU held from Sat 28 Mar 2026 00:00 to Mon 30 Mar 00:00 local.
    28 March has 24 hours, 29 March (CET -> CEST) has 23: 24 + 23 GPU-hours."""
    from billing.aggregation import aggregate_usage, get_account
    from billing.models import UsageRecord
    from billing.reports import usage_rows

    account = get_account(tenant_a.id)
    account.time_zone = "Europe/Berlin"
    account.save()
    host = world.make_host("h100-sxm5-80gb", gpus=1)
    start = datetime(2026, 3, 27, 23, tzinfo=UTC)
    end = datetime(2026, 3, 29, 22, tzinfo=UTC)
    world.hold(world.pool(tenant_a), host, start, end)
    aggregate_usage(tenant_a.id, start, end, now=LATER)
    rows, totals = usage_rows(UsageRecord.objects.all(), ["day"], start, end)
    assert [(str(r["day"]), r["gpu_hours"]) for r in rows] == [
        ("2026-03-28", Decimal(24)),
        ("2026-03-29", Decimal(23)),
    ]
    assert totals["gpu_hours"] == Decimal(47)


def test_the_new_york_november_day_of_the_dst_change_has_25_hours(world, tenant_a):
    from billing.aggregation import aggregate_usage, get_account
    from billing.models import UsageRecord
    from billing.reports import usage_rows

    account = get_account(tenant_a.id)
    account.time_zone = "America/New_York"
    account.save()
    host = world.make_host("a100-sxm4-80gb", gpus=1)
    start = datetime(2026, 11, 1, 4, tzinfo=UTC)  # 1 Nov 00:00 EDT
    end = datetime(2026, 11, 2, 5, tzinfo=UTC)  # 2 Nov 00:00 EST
    world.hold(world.pool(tenant_a, model="a100-sxm4-80gb"), host, start, end)
    aggregate_usage(tenant_a.id, start, end, now=LATER)
    rows, _ = usage_rows(UsageRecord.objects.all(), ["day", "model"], start, end)
    assert [(str(r["day"]), r["gpu_model"], r["gpu_hours"]) for r in rows] == [
        ("2026-11-01", "a100-sxm4-80gb", Decimal(25))
    ]
