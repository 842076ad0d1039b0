"""The allocation ledger: rows opened and closed by the node signals, the exclusion constraint,
fractions of shared MIG instances, and the per-GPU hour accounting (tenants + idle = 1 GPU-hour)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
SHARED_MIG = {"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"}


def gpus(host) -> list[str]:
    return list(host.gpus.order_by("index").values_list("uuid", flat=True))


def test_node_ready_opens_one_whole_gpu_row_per_gpu_and_release_closes_them(world, tenant_a):
    from billing.models import LedgerEntry
    from nodepools.models import Node
    from nodepools.signals import node_ready, node_released

    host = world.make_host("h100-sxm5-80gb", gpus=8)
    pool = world.pool(tenant_a, isolation={"mode": "mig", "mig_profile": "1g.10gb"})
    node = world.node(pool, host, gpus(host), ready_at=T0)
    node_ready.send(sender=Node, node=node)
    node_ready.send(sender=Node, node=node)  # a repeated signal opens nothing new
    rows = list(LedgerEntry.objects.filter(node=node).order_by("gpu_uuid"))
    assert len(rows) == 8
    # A pool owning whole GPUs pays 1.0 per GPU, MIG inside or not (DESIGN §6).
    assert {r.billable_fraction for r in rows} == {Decimal("1.000000")}
    assert {r.mig_profile for r in rows} == {"1g.10gb"}
    assert {(r.period.lower, r.period.upper) for r in rows} == {(T0, None)}

    node.released_at = T0 + timedelta(minutes=90)
    node_released.send(sender=Node, node=node)
    node_released.send(sender=Node, node=node)
    rows = LedgerEntry.objects.filter(node=node)
    assert {(r.period.lower, r.period.upper) for r in rows} == {(T0, T0 + timedelta(minutes=90))}


def test_time_sliced_gpu_with_4_replicas_is_one_whole_gpu_of_one_tenant(world, tenant_a):
    from billing.models import LedgerEntry
    from billing.reports import gpu_hour_accounting
    from nodepools.models import Node
    from nodepools.signals import node_ready

    host = world.make_host("h100-sxm5-80gb", gpus=1)
    pool = world.pool(tenant_a, isolation={"mode": "time-slicing", "replicas": 4})
    node = world.node(pool, host, gpus(host), ready_at=T0)
    node_ready.send(sender=Node, node=node)
    (row,) = LedgerEntry.objects.filter(node=node)
    assert row.billable_fraction == Decimal("1")  # 4 replicas, still one GPU of one tenant
    # 2 hours later: 7200 GPU-seconds to tenant A, nothing idle
    acct = gpu_hour_accounting(row.gpu_uuid, T0, T0 + timedelta(hours=2))
    assert acct == {str(tenant_a.id): Decimal(7200), "idle": Decimal(0)}


def test_a_gpu_is_never_held_twice_at_the_same_instant(world, tenant_a, tenant_b):
    from billing.ledger import open_allocation
    from nvke.errors import Conflict

    host = world.make_host("h100-sxm5-80gb", gpus=1)
    (gpu,) = gpus(host)
    a = world.node(world.pool(tenant_a, isolation=SHARED_MIG), host, [gpu], T0)
    b = world.node(world.pool(tenant_b, isolation=SHARED_MIG), host, [gpu], T0)
    whole = world.node(world.pool(tenant_b, name="whole"), host, [gpu], T0)
    open_allocation(node=a, gpu_uuid=gpu, start=T0, mig_gpu_instance_id=9, mig_profile="1g.10gb")
    # another GPU instance of the same GPU: fine
    open_allocation(node=b, gpu_uuid=gpu, start=T0, mig_gpu_instance_id=10, mig_profile="1g.10gb")
    # the same GPU instance again, or the whole GPU while instances are held: refused
    with pytest.raises(Conflict) as same_gi:
        open_allocation(
            node=b,
            gpu_uuid=gpu,
            start=T0 + timedelta(minutes=5),
            mig_gpu_instance_id=9,
            mig_profile="1g.10gb",
        )
    with pytest.raises(Conflict) as whole_gpu:
        open_allocation(node=whole, gpu_uuid=gpu, start=T0 + timedelta(hours=5))
    assert same_gi.value.code == whole_gpu.value.code == "ledger_overlap"


def test_back_to_back_allocations_of_one_gpu_leave_no_gap_and_no_overlap(world, tenant_a, tenant_b):
    from billing.reports import gpu_hour_accounting

    host = world.make_host("a100-sxm4-80gb", gpus=1)
    (gpu,) = gpus(host)
    world.hold(world.pool(tenant_a, model="a100-sxm4-80gb"), host, T0, T0 + timedelta(hours=1))
    world.hold(
        world.pool(tenant_b, model="a100-sxm4-80gb"),
        host,
        T0 + timedelta(hours=1),
        T0 + timedelta(hours=2),
    )
    acct = gpu_hour_accounting(gpu, T0 + timedelta(minutes=30), T0 + timedelta(minutes=90))
    assert acct == {str(tenant_a.id): Decimal(1800), str(tenant_b.id): Decimal(1800), "idle": 0}


def test_shared_mig_slices_bill_compute_slices_over_7_and_the_hour_adds_up_to_one(
    world, tenant_a, tenant_b, tenant_c
):
    """One H100 shared by 3 tenants for the hour 10:00-11:00: A 3g.40gb, B 2g.20gb, C 1g.10gb.

    Fractions by compute slices (catalog), not GiB: 3/7 = 0.428571, 2/7 = 0.285714,
    1/7 = 0.142857. GPU-seconds: A 1542.8556, B 1028.5704, C 514.2852; idle = 3600 - 3085.7112
    = 514.2888. Sum = 3600 exactly.
    """
    from billing.ledger import close_allocations, open_allocation
    from billing.reports import gpu_hour_accounting

    host = world.make_host("h100-sxm5-80gb", gpus=1)
    (gpu,) = gpus(host)
    held = {}
    for tenant, profile, gi in [
        (tenant_a, "3g.40gb", 2),
        (tenant_b, "2g.20gb", 5),
        (tenant_c, "1g.10gb", 13),
    ]:
        iso = {**SHARED_MIG, "mig_profile": profile}
        node = world.node(world.pool(tenant, isolation=iso), host, [gpu], T0)
        held[tenant.name] = open_allocation(
            node=node, gpu_uuid=gpu, start=T0, mig_gpu_instance_id=gi, mig_profile=profile
        )
        close_allocations(node, T0 + timedelta(minutes=60))
    assert {k: v.billable_fraction for k, v in held.items()} == {
        "tenant-a": Decimal("0.428571"),
        "tenant-b": Decimal("0.285714"),
        "tenant-c": Decimal("0.142857"),
    }
    acct = gpu_hour_accounting(gpu, T0, T0 + timedelta(hours=1))
    assert acct == {
        str(tenant_a.id): Decimal("1542.8556"),
        str(tenant_b.id): Decimal("1028.5704"),
        str(tenant_c.id): Decimal("514.2852"),
        "idle": Decimal("514.2888"),
    }
    assert sum(acct.values()) == Decimal(3600)


def test_mig_fraction_counts_compute_slices_never_the_gib_in_the_name(catalog):
    from billing.fractions import mig_billable_fraction

    # 1g.20gb has 2 of 8 memory slices but 1 of 7 compute slices: it bills 1/7.
    assert mig_billable_fraction("h100-sxm5-80gb", "1g.20gb", T0) == Decimal("0.142857")
    assert mig_billable_fraction("h100-sxm5-80gb", "4g.40gb", T0) == Decimal("0.571429")
    assert mig_billable_fraction("h100-sxm5-80gb", "7g.80gb", T0) == Decimal("1")


def test_the_price_sheet_fraction_of_a_profile_wins_from_its_effective_time(world, tenant_c):
    from billing.ledger import open_allocation
    from billing.prices import set_price

    set_price(
        gpu_model="h100-sxm5-80gb",
        mig_profile="1g.10gb",
        hourly_rate=Decimal("2.80"),
        billable_fraction=Decimal("0.15"),
        effective_from=T0 + timedelta(hours=1),
    )
    host = world.make_host("h100-sxm5-80gb", gpus=1)
    (gpu,) = gpus(host)
    pool = world.pool(tenant_c, isolation=SHARED_MIG)
    before = open_allocation(
        node=world.node(pool, host, [gpu], T0),
        gpu_uuid=gpu,
        start=T0,
        mig_gpu_instance_id=9,
        mig_profile="1g.10gb",
    )
    after = open_allocation(
        node=world.node(pool, host, [gpu], T0),
        gpu_uuid=gpu,
        start=T0 + timedelta(hours=2),
        mig_gpu_instance_id=10,
        mig_profile="1g.10gb",
    )
    assert (before.billable_fraction, after.billable_fraction) == (
        Decimal("0.142857"),
        Decimal("0.150000"),
    )


def test_a_node_released_at_its_ready_time_holds_nothing(world, tenant_a):
    from billing.models import LedgerEntry

    host = world.make_host("h100-sxm5-80gb", gpus=2)
    node = world.hold(world.pool(tenant_a), host, T0, end=T0)
    assert not LedgerEntry.objects.filter(node=node).exists()


def test_only_shared_tenancy_mig_or_vgpu_pools_bill_fractions():
    from billing.fractions import pool_shares_gpus_across_tenants as shared

    assert shared({"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"})
    assert shared({"mode": "vgpu", "vgpu_profile": "x", "tenancy": "shared"})
    assert not shared({"mode": "mig", "mig_profile": "1g.10gb"})  # dedicated by default
    assert not shared({"mode": "time-slicing", "replicas": 4, "tenancy": "shared"})
