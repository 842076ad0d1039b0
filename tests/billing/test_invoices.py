"""Monthly invoices worked out by hand: price changes, SLA credits, rounding, month ends,
finalization and adjustments."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction

pytestmark = pytest.mark.django_db

DEC_20 = datetime(2026, 12, 20, tzinfo=UTC)


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def lines(invoice) -> list[tuple]:
    return [(ln.kind, ln.gpu_hours, ln.unit_price, ln.amount) for ln in invoice.lines.all()]


def uuids(host, *index) -> list[str]:
    ordered = list(host.gpus.order_by("index").values_list("uuid", flat=True))
    return [ordered[i] for i in index] if index else ordered


def xid(host, gpu_uuid, ts, code):
    """An Xid as ingestion applies it: stored, then mapped to the GPU's health interval."""
    from fleet.health import handle_xid
    from fleet.models import XidEvent

    event = XidEvent.objects.create(host=host, gpu_uuid=gpu_uuid, ts=ts, xid=code, report_seq=1)
    handle_xid(host, event, ts)
    return event


def mark_healthy(host, gpu_uuid, at):
    """The operator ends the GPU's unhealthy interval (``POST …/mark-healthy``)."""
    from fleet.health import mark_healthy as end

    assert end(host, [gpu_uuid], actor="operator", now=at) == [gpu_uuid]


def test_a_price_change_in_the_middle_of_a_day_splits_the_line(world, tenant_a, list_prices):
    """8 H100, 12:00-16:00 on 10 Nov; list price 2.50 -> 3.00 at 14:30 UTC.
    2.5 h x 8 = 20 GPU-h x 2.50 = 50.00; 1.5 h x 8 = 12 GPU-h x 3.00 = 36.00; total 86.00."""
    from billing.invoices import build_invoice
    from billing.prices import set_price

    set_price(
        gpu_model="h100-sxm5-80gb",
        hourly_rate=Decimal("3.00"),
        effective_from=utc(2026, 11, 10, 14, 30),
        label="list from 10 Nov 14:30",
    )
    host = world.make_host("h100-sxm5-80gb", gpus=8)
    world.hold(world.pool(tenant_a), host, utc(2026, 11, 10, 12), utc(2026, 11, 10, 16))
    invoice = build_invoice(tenant_a.id, "2026-11", now=DEC_20)
    assert lines(invoice) == [
        ("USAGE", Decimal(20), Decimal("2.5"), Decimal("50.00")),
        ("USAGE", Decimal(12), Decimal("3.0"), Decimal("36.00")),
    ]
    assert invoice.total == Decimal("86.00")
    assert invoice.status == "DRAFT"
    assert invoice.number.startswith("NVKE-202611-")


def test_an_xid_79_for_25_minutes_is_credited_on_its_own_line(world, tenant_a, list_prices):
    """A node of 8 H100 held 10:00-13:00 (24 GPU-h x 2.50 = 60.00). Xid 79 (fallen off the bus,
    NVIDIA action RESTART_BM: the whole machine) on GPU 3 at 11:35; the operator records the
    GPU healthy again at 12:00. 8 GPUs x 25 min = 12,000 GPU-s = 3.333333 GPU-h x 2.50 =
    8.3333 -> 8.33 credit. An Xid 13 (application error) at 12:30 credits nothing.
    Total 60.00 - 8.33 = 51.67."""
    from billing.invoices import build_invoice

    host = world.make_host("h100-sxm5-80gb", gpus=8)
    world.hold(world.pool(tenant_a), host, utc(2026, 11, 5, 10), utc(2026, 11, 5, 13))
    (bad,) = uuids(host, 3)
    xid(host, bad, utc(2026, 11, 5, 11, 35), 79)
    mark_healthy(host, bad, utc(2026, 11, 5, 12))
    xid(host, bad, utc(2026, 11, 5, 12, 30), 13)
    invoice = build_invoice(tenant_a.id, "2026-11", now=DEC_20)
    assert lines(invoice) == [
        ("USAGE", Decimal(24), Decimal("2.5"), Decimal("60.00")),
        ("SLA_CREDIT", Decimal("-3.333333"), Decimal("2.5"), Decimal("-8.33")),
    ]
    assert (invoice.usage_amount, invoice.credit_amount, invoice.total) == (
        Decimal("60.00"),
        Decimal("-8.33"),
        Decimal("51.67"),
    )
    credit = invoice.lines.get(kind="SLA_CREDIT")
    assert credit.gpu_seconds == Decimal(-12000)
    assert len(credit.details) == 8
    assert {(d["xid"], d["scope"], d["start"], d["end"]) for d in credit.details} == {
        (79, "host", "2026-11-05T11:35:00+00:00", "2026-11-05T12:00:00+00:00")
    }


def test_a_gpu_level_xid_credits_that_gpu_until_the_node_is_released(world, tenant_a, list_prices):
    """Xid 48 (double-bit ECC, RESET_GPU class) on one GPU at 12:20 of a node held 12:00-13:00:
    only that GPU, 40 minutes, until the node's release: 2400 GPU-s x 2.50/h = 1.666.. -> 1.67."""
    from billing.invoices import build_invoice

    host = world.make_host("h100-sxm5-80gb", gpus=2)
    world.hold(world.pool(tenant_a), host, utc(2026, 11, 6, 12), utc(2026, 11, 6, 13))
    xid(host, uuids(host, 1)[0], utc(2026, 11, 6, 12, 20), 48)
    invoice = build_invoice(tenant_a.id, "2026-11", now=DEC_20)
    assert lines(invoice) == [
        ("USAGE", Decimal(2), Decimal("2.5"), Decimal("5.00")),
        ("SLA_CREDIT", Decimal("-0.666667"), Decimal("2.5"), Decimal("-1.67")),
    ]
    assert invoice.total == Decimal("3.33")


def test_each_line_is_rounded_half_even_to_the_minor_unit(world, tenant_a, list_prices):
    """At 2.50/GPU-h: 3 minutes = 0.125 -> 0.12 (half-even, not 0.13); 9 minutes = 0.375 ->
    0.38. The total adds the rounded lines: 0.50."""
    from billing.invoices import build_invoice

    host = world.make_host("h100-sxm5-80gb", gpus=2)
    a, b = uuids(host)
    world.hold(
        world.pool(tenant_a, name="a"), host, utc(2026, 11, 7, 9), utc(2026, 11, 7, 9, 3), gpus=[a]
    )
    world.hold(
        world.pool(tenant_a, name="b"), host, utc(2026, 11, 7, 9), utc(2026, 11, 7, 9, 9), gpus=[b]
    )
    invoice = build_invoice(tenant_a.id, "2026-11", now=DEC_20)
    assert [ln[3] for ln in lines(invoice)] == [Decimal("0.12"), Decimal("0.38")]
    assert invoice.total == Decimal("0.50")


def test_a_yen_invoice_rounds_to_whole_yen(world, tenant_a, catalog):
    """JPY has no minor unit: 1 GPU for 61 minutes at 400 JPY/GPU-h = 406.666.. -> 407."""
    from billing.aggregation import get_account
    from billing.invoices import build_invoice
    from billing.prices import set_price

    account = get_account(tenant_a.id)
    account.currency = "JPY"
    account.save()
    set_price(
        gpu_model="h100-sxm5-80gb",
        hourly_rate=Decimal(400),
        currency="JPY",
        effective_from=utc(2026, 1, 1),
    )
    host = world.make_host("h100-sxm5-80gb", gpus=1)
    world.hold(world.pool(tenant_a), host, utc(2026, 11, 7, 9), utc(2026, 11, 7, 10, 1))
    invoice = build_invoice(tenant_a.id, "2026-11", now=DEC_20)
    assert invoice.total == Decimal(407)
    assert invoice.currency == "JPY"


def test_the_shared_gpu_instance_of_tenant_c_is_billed_by_its_fraction(
    world, tenant_c, list_prices
):
    """Tenant C holds a 1g.10gb GPU instance of an H100 shared by 3 tenants for 60 minutes; the
    list price of the 1g.10gb profile is 2.80 per GPU-hour; fraction 1/7 = 0.142857:
    0.142857 GPU-h x 2.80 = 0.3999996 -> 0.40."""
    from billing.invoices import build_invoice
    from billing.ledger import close_allocations, open_allocation
    from billing.prices import set_price

    set_price(
        gpu_model="h100-sxm5-80gb",
        mig_profile="1g.10gb",
        hourly_rate=Decimal("2.80"),
        effective_from=utc(2026, 1, 1),
        label="list 1g.10gb",
    )
    host = world.make_host("h100-sxm5-80gb", gpus=1)
    (gpu,) = uuids(host)
    iso = {"mode": "mig", "mig_profile": "1g.10gb", "sharing": "cross-tenant"}
    node = world.node(world.pool(tenant_c, isolation=iso), host, [gpu], utc(2026, 11, 3, 10))
    open_allocation(
        node=node,
        gpu_uuid=gpu,
        start=utc(2026, 11, 3, 10),
        mig_gpu_instance_id=9,
        mig_profile="1g.10gb",
    )
    close_allocations(node, utc(2026, 11, 3, 11))
    invoice = build_invoice(tenant_c.id, "2026-11", now=DEC_20)
    assert lines(invoice) == [("USAGE", Decimal("0.142857"), Decimal("2.8"), Decimal("0.40"))]
    assert invoice.lines.get().gpu_seconds == Decimal("514.2852")


def test_tenant_overrides_discount_and_committed_use(world, tenant_a, tenant_b, list_prices):
    """List 2.50. Tenant A: 20% off list -> 2.00. Tenant B: committed-use 1.75 on H100.
    10 GPU-hours each: A 20.00, B 17.50."""
    from billing.invoices import build_invoice
    from billing.prices import set_price

    set_price(
        gpu_model="h100-sxm5-80gb",
        tenant=tenant_a,
        discount_pct=Decimal(20),
        effective_from=utc(2026, 11, 1),
        label="enterprise discount",
    )
    set_price(
        gpu_model="h100-sxm5-80gb",
        tenant=tenant_b,
        hourly_rate=Decimal("1.75"),
        effective_from=utc(2026, 11, 1),
        label="1-year commit",
    )
    for tenant in (tenant_a, tenant_b):
        host = world.make_host("h100-sxm5-80gb", gpus=5)
        world.hold(world.pool(tenant), host, utc(2026, 11, 8, 0), utc(2026, 11, 8, 2))
    a = build_invoice(tenant_a.id, "2026-11", now=DEC_20)
    b = build_invoice(tenant_b.id, "2026-11", now=DEC_20)
    assert lines(a) == [("USAGE", Decimal(10), Decimal("2.0"), Decimal("20.00"))]
    assert lines(b) == [("USAGE", Decimal(10), Decimal("1.75"), Decimal("17.50"))]
    assert "enterprise discount -20.00% of list 2.500000" in a.lines.get().description


def test_usage_across_a_month_boundary_lands_in_each_month(world, tenant_a, list_prices):
    """UTC tenant, 4 GPUs from 30 Nov 22:00 to 1 Dec 02:00: 8 GPU-h in November (20.00),
    8 in December (20.00)."""
    from billing.invoices import build_invoice

    host = world.make_host("h100-sxm5-80gb", gpus=4)
    world.hold(world.pool(tenant_a), host, utc(2026, 11, 30, 22), utc(2026, 12, 1, 2))
    nov = build_invoice(tenant_a.id, "2026-11", now=DEC_20)
    dec = build_invoice(tenant_a.id, "2026-12", now=DEC_20)
    assert lines(nov) == [("USAGE", Decimal(8), Decimal("2.5"), Decimal("20.00"))]
    assert lines(dec) == [("USAGE", Decimal(8), Decimal("2.5"), Decimal("20.00"))]


def test_the_same_hours_belong_to_november_in_new_york(world, tenant_a, list_prices):
    """America/New_York: November ends at 1 Dec 05:00 UTC, so all 16 GPU-h are November's."""
    from billing.aggregation import get_account
    from billing.invoices import build_invoice

    account = get_account(tenant_a.id)
    account.time_zone = "America/New_York"
    account.save()
    host = world.make_host("h100-sxm5-80gb", gpus=4)
    world.hold(world.pool(tenant_a), host, utc(2026, 11, 30, 22), utc(2026, 12, 1, 2))
    nov = build_invoice(tenant_a.id, "2026-11", now=DEC_20)
    assert nov.period_end == utc(2026, 12, 1, 5)
    assert lines(nov) == [("USAGE", Decimal(16), Decimal("2.5"), Decimal("40.00"))]
    assert build_invoice(tenant_a.id, "2026-12", now=DEC_20).lines.count() == 0


def test_a_finalized_invoice_never_changes_and_late_xids_become_next_months_credit(
    world, tenant_a, list_prices
):
    """November: 1 GPU 10:00-12:00 on 20 Nov = 5.00, finalized. A late-delivered Xid 79 at
    11:00 on 20 Nov (the node was replaced at 12:00): 1 GPU-h credit = -2.50, shown on the
    December invoice as an adjustment to November's; December's own usage 1 GPU-h = 2.50."""
    from billing.invoices import build_invoice, finalize_invoice
    from billing.models import Invoice
    from nvke.errors import Conflict

    host = world.make_host("h100-sxm5-80gb", gpus=1)
    (gpu,) = uuids(host)
    pool = world.pool(tenant_a)
    world.hold(pool, host, utc(2026, 11, 20, 10), utc(2026, 11, 20, 12))
    nov = build_invoice(tenant_a.id, "2026-11", now=DEC_20)
    with pytest.raises(Conflict) as early:
        finalize_invoice(nov.id, now=utc(2026, 11, 30))
    assert early.value.code == "period_not_ended"
    nov = finalize_invoice(nov.id, now=utc(2026, 12, 2))
    assert (nov.status, nov.total) == ("FINALIZED", Decimal("5.00"))
    with pytest.raises(IntegrityError), transaction.atomic():
        Invoice.objects.filter(pk=nov.pk).update(total=0)
    with pytest.raises(IntegrityError), transaction.atomic():
        nov.lines.all().delete()

    xid(host, gpu, utc(2026, 11, 20, 11), 79)  # delivered late
    world.hold(pool, host, utc(2026, 12, 3, 10), utc(2026, 12, 3, 11))
    assert build_invoice(tenant_a.id, "2026-11", now=DEC_20).total == Decimal("5.00")
    dec = build_invoice(tenant_a.id, "2026-12", now=DEC_20)
    dec = build_invoice(tenant_a.id, "2026-12", now=DEC_20)  # rebuilding adds nothing twice
    assert [(ln.kind, ln.adjusts_id, ln.gpu_hours, ln.amount) for ln in dec.lines.all()] == [
        ("USAGE", None, Decimal(1), Decimal("2.50")),
        ("SLA_CREDIT", nov.id, Decimal(-1), Decimal("-2.50")),
    ]
    assert (dec.usage_amount, dec.adjustment_amount, dec.total) == (
        Decimal("2.50"),
        Decimal("-2.50"),
        Decimal("0.00"),
    )
    dec = finalize_invoice(dec.id, now=utc(2027, 1, 2))
    jan = build_invoice(tenant_a.id, "2027-01", now=utc(2027, 1, 5))
    assert jan.lines.count() == 0  # the correction was billed once


def test_months_are_finalized_in_order(world, tenant_a, list_prices):
    from billing.invoices import build_invoice, finalize_invoice
    from nvke.errors import Conflict

    host = world.make_host("h100-sxm5-80gb", gpus=1)
    world.hold(world.pool(tenant_a), host, utc(2026, 10, 31, 23), utc(2026, 11, 1, 1))
    nov = build_invoice(tenant_a.id, "2026-11", now=DEC_20)
    with pytest.raises(Conflict) as exc:
        finalize_invoice(nov.id, now=DEC_20)
    assert exc.value.code == "earlier_period_not_finalized"
    assert "2026-10" in str(exc.value.detail)


def test_usage_without_a_price_refuses_to_invoice(world, tenant_a, catalog):
    from billing.invoices import build_invoice
    from nvke.errors import Conflict

    host = world.make_host("h200-sxm-141gb", gpus=1)
    world.hold(
        world.pool(tenant_a, model="h200-sxm-141gb"), host, utc(2026, 11, 2), utc(2026, 11, 2, 1)
    )
    with pytest.raises(Conflict) as exc:
        build_invoice(tenant_a.id, "2026-11", now=DEC_20)
    assert exc.value.code == "missing_price"
    assert exc.value.extra["gpu_model"] == "h200-sxm-141gb"


# --- no invoice for a month before the tenant existed (#20) -----------------------------------


def test_no_invoice_is_built_for_a_month_that_ended_before_the_tenant_existed(tenant_a):
    """tenant_a created 2026-11-03 10:00 UTC (zone UTC), no allocation: 2026-10 ends
    2026-11-01 00:00, before it existed -> Conflict, no row; 2026-11 holds the creation ->
    a (zero) draft is built."""
    from billing.invoices import build_invoice
    from billing.models import Invoice
    from nvke.errors import Conflict
    from tenants.models import Tenant

    Tenant.objects.filter(pk=tenant_a.pk).update(created_at=utc(2026, 11, 3, 10))
    with pytest.raises(Conflict) as refused:
        build_invoice(tenant_a.id, "2026-10", now=DEC_20)
    assert refused.value.code == "period_before_tenant"
    assert "2026-11-01T00:00:00+00:00" in refused.value.detail
    assert not Invoice.objects.filter(tenant=tenant_a).exists()
    nov = build_invoice(tenant_a.id, "2026-11", now=DEC_20)
    assert (nov.period_label, nov.total, nov.lines.count()) == ("2026-11", Decimal("0.00"), 0)


def test_the_tenant_zone_decides_the_month_before_creation(tenant_a):
    """Zone Asia/Tokyo (UTC+9): created 2026-10-31 16:00 UTC = 2026-11-01 01:00 JST, so the
    JST month 2026-10 (ending 2026-10-31 15:00 UTC) is refused though the UTC date is still
    31 October; 2026-11 is built."""
    from billing.aggregation import get_account
    from billing.invoices import build_invoice
    from billing.models import BillingAccount
    from nvke.errors import Conflict
    from tenants.models import Tenant

    get_account(tenant_a.id)
    BillingAccount.objects.filter(tenant=tenant_a).update(time_zone="Asia/Tokyo")
    Tenant.objects.filter(pk=tenant_a.pk).update(created_at=utc(2026, 10, 31, 16))
    with pytest.raises(Conflict):
        build_invoice(tenant_a.id, "2026-10", now=DEC_20)
    assert build_invoice(tenant_a.id, "2026-11", now=DEC_20).period_start == utc(2026, 10, 31, 15)


def test_usage_recorded_before_the_tenant_row_still_counts_as_existing(
    world, tenant_a, list_prices
):
    """Allocations imported from before the tenant row (its ledger starts 2026-11-10 12:00,
    the row is made 2026-12-01): November is still billed, 8 GPU x 1 h x 2.50 = 20.00."""
    from billing.invoices import build_invoice
    from tenants.models import Tenant

    Tenant.objects.filter(pk=tenant_a.pk).update(created_at=utc(2026, 12, 1))
    host = world.make_host("h100-sxm5-80gb", gpus=8)
    world.hold(world.pool(tenant_a), host, utc(2026, 11, 10, 12), utc(2026, 11, 10, 13))
    assert build_invoice(tenant_a.id, "2026-11", now=DEC_20).total == Decimal("20.00")


def test_the_invoice_run_skips_the_previous_month_of_a_tenant_created_this_month(tenant_a):
    """Now 2026-12-20; created 2026-12-02: the run (previous + current month) builds only
    2026-12. Created 2026-11-30 23:59: both 2026-11 and 2026-12."""
    from billing.tasks import invoice_labels
    from tenants.models import Tenant

    Tenant.objects.filter(pk=tenant_a.pk).update(created_at=utc(2026, 12, 2))
    assert invoice_labels(tenant_a.id, DEC_20) == ["2026-12"]
    Tenant.objects.filter(pk=tenant_a.pk).update(created_at=utc(2026, 11, 30, 23, 59))
    assert invoice_labels(tenant_a.id, DEC_20) == ["2026-11", "2026-12"]
