"""Billing by fraction on a shared host (#18), worked by hand.

The instances are placed by the real shared placement (``fleet.shared_hosts``) on a
SIMULATED shared H100 host; the nodes and their ``node_ready`` allocations are written the way
the reconciler sends them (one allocation per GPU instance, its NVML GPU-instance id and
profile), at hand-picked times, so the hours are round.

H100-SXM5-80GB has 7 compute slices: 3g.40gb bills 3/7 = 0.428571, 1g.10gb 1/7 = 0.142857
(half-even to 6 places). List price 2.50 USD per GPU-hour.

Tenant A: one 3g.40gb, 10 Nov 00:00-10:00 (10 h): 10 x 0.428571 = 4.28571 GPU-h.
Tenant B: three 1g.10gb, 10 Nov 00:00-04:00 (4 h): 3 x 4 x 0.142857 = 1.714284 GPU-h.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import transaction

pytestmark = pytest.mark.django_db

MODEL = "h100-sxm5-80gb"


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def place(world, tenant, host, profiles, ready_at, end, name):
    """A VM node of a shared pool: instances claimed, ledger opened (and closed) through the
    billing receivers with the allocations the reconciler sends."""
    from billing.receivers import close_ledger, open_ledger
    from fleet import shared_hosts
    from fleet.models import GpuInstance

    pool = world.pool(
        tenant,
        name=name,
        cluster=name,
        isolation={"mode": "mig", "mig_profile": profiles[0], "tenancy": "shared"},
        gpus_per_node=len(profiles),
    )
    node = world.node(pool, host, [], ready_at)
    with transaction.atomic():
        (placed,) = shared_hosts.claim_gpu_instances(
            [
                shared_hosts.GpuInstanceRequest(
                    node.id, tenant.id, MODEL, "us-east-1", instances=tuple(profiles)
                )
            ]
        )
    node.gpu_uuids = list(placed.gpu_uuids)
    node.save(update_fields=["gpu_uuids"])
    # the agent reported the instances (GPU-instance ids as NVML numbers them: in order)
    for number, row in enumerate(GpuInstance.objects.filter(holder_id=node.id).order_by("start")):
        row.gpu_instance_id = GpuInstance.objects.filter(host=host).count() + number
        row.save(update_fields=["gpu_instance_id"])
    from nodepools import shared_host_nodes

    open_ledger(sender=None, node=node, allocations=shared_host_nodes.allocations(node))
    node.released_at = end
    close_ledger(sender=None, node=node)
    return node


@pytest.fixture
def shared_h100(world):
    from fleet.choices import HostTenancy
    from fleet.models import Host

    host = world.make_host(MODEL, gpus=2, hostname="hv-bill-1")
    Host.objects.filter(pk=host.pk).update(tenancy=HostTenancy.SHARED)
    host.refresh_from_db()
    return host


def test_each_instance_bills_its_fraction_and_every_gpu_hour_adds_up_to_one(
    world, tenant_a, tenant_b, shared_h100, list_prices
):
    from billing.invoices import build_invoice
    from billing.models import LedgerEntry
    from billing.reports import gpu_hour_accounting

    place(world, tenant_a, shared_h100, ["3g.40gb"], utc(2026, 11, 10), utc(2026, 11, 10, 10), "a")
    place(
        world,
        tenant_b,
        shared_h100,
        ["1g.10gb"] * 3,
        utc(2026, 11, 10),
        utc(2026, 11, 10, 4),
        "b",
    )
    rows = sorted(
        (str(r.tenant.name), r.mig_profile, r.billable_fraction)
        for r in LedgerEntry.objects.select_related("tenant")
    )
    assert rows == [
        ("tenant-a", "3g.40gb", Decimal("0.428571")),
        ("tenant-b", "1g.10gb", Decimal("0.142857")),
        ("tenant-b", "1g.10gb", Decimal("0.142857")),
        ("tenant-b", "1g.10gb", Decimal("0.142857")),
    ]
    gpu0, gpu1 = shared_h100.gpus.order_by("index").values_list("uuid", flat=True)
    # 00:00-01:00 on GPU 0: A 0.428571 x 3600 = 1542.8556 s, B 3 x 0.142857 x 3600 =
    # 1542.8556 s, idle 3600 - 3085.7112 = 514.2888 s
    hour = gpu_hour_accounting(gpu0, utc(2026, 11, 10), utc(2026, 11, 10, 1))
    assert hour == {
        str(tenant_a.id): Decimal("1542.855600"),
        str(tenant_b.id): Decimal("1542.855600"),
        "idle": Decimal("514.288800"),
    }
    # 05:00-06:00: B is gone, A 1542.8556 s, idle 2057.1444 s
    hour = gpu_hour_accounting(gpu0, utc(2026, 11, 10, 5), utc(2026, 11, 10, 6))
    assert hour == {str(tenant_a.id): Decimal("1542.855600"), "idle": Decimal("2057.144400")}
    # every hour of the day, both GPUs: tenants' fractions plus idle are exactly one GPU-hour
    for h in range(24):
        start = utc(2026, 11, 10) + timedelta(hours=h)
        for gpu in (gpu0, gpu1):
            total = sum(gpu_hour_accounting(gpu, start, start + timedelta(hours=1)).values())
            assert total == Decimal(3600), (gpu, h)
    # invoices: A 4.28571 GPU-h x 2.50 = 10.714275 -> 10.71; B 1.714284 GPU-h x 2.50 =
    # 4.28571 -> 4.29
    invoice_a = build_invoice(tenant_a.id, "2026-11", now=utc(2026, 12, 20))
    invoice_b = build_invoice(tenant_b.id, "2026-11", now=utc(2026, 12, 20))
    assert [(ln.gpu_hours, ln.amount) for ln in invoice_a.lines.all()] == [
        (Decimal("4.28571"), Decimal("10.71"))
    ]
    assert [(ln.gpu_hours, ln.amount) for ln in invoice_b.lines.all()] == [
        (Decimal("1.714284"), Decimal("4.29"))
    ]
    assert (invoice_a.total, invoice_b.total) == (Decimal("10.71"), Decimal("4.29"))


def test_a_node_of_a_shared_host_without_reported_instance_ids_is_not_billed_as_whole_gpus(
    world, tenant_a, shared_h100
):
    from fleet import shared_hosts
    from nodepools import shared_host_nodes

    pool = world.pool(
        tenant_a, isolation={"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"}
    )
    node = world.node(pool, shared_h100, [], utc(2026, 11, 10))
    with transaction.atomic():
        shared_hosts.claim_gpu_instances(
            [
                shared_hosts.GpuInstanceRequest(
                    node.id, tenant_a.id, MODEL, "us-east-1", ("1g.10gb",)
                )
            ]
        )
    with pytest.raises(RuntimeError, match=r"1g\.10gb@0 not reported yet"):
        shared_host_nodes.allocations(node)
    whole = world.node(pool, shared_h100, [], utc(2026, 11, 10))
    assert shared_host_nodes.allocations(whole) is None
