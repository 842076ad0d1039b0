"""Invoice lines of a capacity reservation, worked by hand.

March 2026 (UTC, USD). Price sheet from 2026-01-01: H100 2.50 USD per GPU-hour on-demand,
1.75 USD per reserved GPU-hour. Reservation R: 8 H100 from 2026-03-10 00:00 to 2026-03-11
00:00 (24 h), ``keep`` (rows written directly: admission refuses windows in the past; this
test is about the arithmetic).

* pool P draws from R: 1 node x 8 GPUs from 2026-03-10 06:00 to 2026-03-11 06:00 (30 h):
  18 h inside R = 144 GPU-h covered (not billed again); 6 h after R's end = 48 GPU-h on-demand
  = 48 x 2.50 = 120.00 USD;
* pool Q is on-demand: 1 node x 8 GPUs 2026-03-10 00:00-10:00 = 80 GPU-h x 2.50 = 200.00 USD
  (inside R's window, but Q does not draw from R: billed in full);
* R itself: 8 GPUs x 24 h = 192 reserved GPU-h x 1.75 = 336.00 USD, used or not.

Total 120.00 + 200.00 + 336.00 = 656.00 USD.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

pytestmark = pytest.mark.django_db

MODEL = "h100-sxm5-80gb"


def t(day, hour=0):
    return datetime(2026, 3, day, hour, tzinfo=UTC)


@pytest.fixture
def reserved_world(world, tenant_a):
    from billing.prices import set_price
    from reservations.models import Reservation

    set_price(
        gpu_model=MODEL,
        hourly_rate=Decimal("2.50"),
        reservation_hourly_rate=Decimal("1.75"),
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
        label="list",
    )
    r = Reservation.objects.create(
        tenant=tenant_a,
        name="march-block",
        gpu_model_id=MODEL,
        region="us-east-1",
        gpus=8,
        start=t(10),
        end=t(11),
        end_action="keep",
        created_at=t(1),
    )
    p = world.pool(tenant_a, name="p")
    p.reservation = r
    p.save(update_fields=["reservation"])
    q = world.pool(tenant_a, name="q")
    world.hold(p, world.make_host(MODEL, gpus=8), t(10, 6), end=t(11, 6))
    world.hold(q, world.make_host(MODEL, gpus=8), t(10, 0), end=t(10, 10))
    return r, p, q


def test_reservation_lines_bill_reserved_hours_and_leave_covered_usage_out(
    tenant_a, reserved_world
):
    from billing.invoices import build_invoice

    r, p, q = reserved_world
    invoice = build_invoice(tenant_a.id, "2026-03", now=datetime(2026, 4, 2, tzinfo=UTC))
    lines = {(ln.kind, ln.nodepool_id): ln for ln in invoice.lines.order_by("position")}
    assert set(lines) == {("USAGE", p.id), ("USAGE", q.id), ("RESERVATION", None)}
    p_line = lines[("USAGE", p.id)]
    assert (p_line.gpu_seconds, p_line.unit_price, p_line.amount) == (
        Decimal(48 * 3600),
        Decimal("2.50"),
        Decimal("120.00"),
    )
    q_line = lines[("USAGE", q.id)]
    assert (q_line.gpu_seconds, q_line.amount) == (Decimal(80 * 3600), Decimal("200.00"))
    r_line = lines[("RESERVATION", None)]
    assert r_line.reservation_id == r.id
    assert (r_line.gpu_seconds, r_line.unit_price, r_line.amount) == (
        Decimal(192 * 3600),
        Decimal("1.75"),
        Decimal("336.00"),
    )
    assert Decimal(r_line.details[0]["covered_gpu_seconds"]) == Decimal(144 * 3600)
    assert "144.000000 GPU-h used inside it" in r_line.description
    assert (invoice.usage_amount, invoice.total) == (Decimal("656.00"), Decimal("656.00"))


def test_rebuilding_the_invoice_gives_the_same_lines(tenant_a, reserved_world):
    from billing.invoices import build_invoice

    now = datetime(2026, 4, 2, tzinfo=UTC)
    first = build_invoice(tenant_a.id, "2026-03", now=now)
    again = build_invoice(tenant_a.id, "2026-03", now=now)
    assert again.total == first.total == Decimal("656.00")
    assert again.lines.count() == 3


def test_an_open_month_bills_reserved_hours_up_to_now(tenant_a, reserved_world):
    """At 2026-03-10 12:00: R has run 12 h = 96 reserved GPU-h x 1.75 = 168.00; P has run 6 h
    inside R (covered, no USAGE line for it), Q 10 h = 80 GPU-h x 2.50 = 200.00."""
    from billing.invoices import build_invoice

    invoice = build_invoice(tenant_a.id, "2026-03", now=t(10, 12))
    by_kind = {(ln.kind, ln.nodepool_id): ln.amount for ln in invoice.lines.all()}
    q = reserved_world[2]
    assert by_kind == {
        ("RESERVATION", None): Decimal("168.00"),
        ("USAGE", q.id): Decimal("200.00"),
    }


def test_a_reservation_without_a_reservation_rate_is_a_conflict(tenant_a, world):
    from billing.invoices import build_invoice
    from billing.prices import set_price
    from nvke.errors import Conflict
    from reservations.models import Reservation

    set_price(gpu_model=MODEL, hourly_rate=Decimal("2.50"), effective_from=t(1))
    Reservation.objects.create(
        tenant=tenant_a, gpu_model_id=MODEL, region="us-east-1", gpus=1, start=t(10), end=t(11)
    )
    with pytest.raises(Conflict) as exc:
        build_invoice(tenant_a.id, "2026-03", now=datetime(2026, 4, 2, tzinfo=UTC))
    assert exc.value.code == "missing_reservation_price"


def test_a_cancelled_reservation_is_billed_up_to_its_cancellation(tenant_a, world):
    """R: 8 H100 for 2026-03-10 00:00-2026-03-11 00:00 (keep), cancelled at 03-10 06:00.
    Pool P on it holds 8 GPUs 03-10 00:00-10:00.

    * R: 8 GPUs x 6 h (start to the cancellation) = 48 reserved GPU-h x 1.75 = 84.00 USD;
    * P: 6 h inside R covered (48 GPU-h); 4 h after the cancellation = 32 GPU-h on-demand
      x 2.50 = 80.00 USD.

    Total 164.00 USD (without the cancellation it would be 192 x 1.75 = 336.00 for R alone).
    """
    from billing.invoices import build_invoice
    from billing.prices import set_price
    from reservations.models import Reservation

    set_price(
        gpu_model=MODEL,
        hourly_rate=Decimal("2.50"),
        reservation_hourly_rate=Decimal("1.75"),
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
    )
    r = Reservation.objects.create(
        tenant=tenant_a,
        gpu_model_id=MODEL,
        region="us-east-1",
        gpus=8,
        start=t(10),
        end=t(11),
        end_action="keep",
        cancelled_at=t(10, 6),
        created_at=t(1),
    )
    p = world.pool(tenant_a, name="p")
    p.reservation = r
    p.save(update_fields=["reservation"])
    world.hold(p, world.make_host(MODEL, gpus=8), t(10, 0), end=t(10, 10))
    invoice = build_invoice(tenant_a.id, "2026-03", now=datetime(2026, 4, 2, tzinfo=UTC))
    lines = {(ln.kind, ln.nodepool_id): ln for ln in invoice.lines.all()}
    r_line = lines[("RESERVATION", None)]
    assert (r_line.gpu_seconds, r_line.amount) == (Decimal(48 * 3600), Decimal("84.00"))
    assert Decimal(r_line.details[0]["covered_gpu_seconds"]) == Decimal(48 * 3600)
    p_line = lines[("USAGE", p.id)]
    assert (p_line.gpu_seconds, p_line.amount) == (Decimal(32 * 3600), Decimal("80.00"))
    assert invoice.total == Decimal("164.00")


def test_a_reservation_cancelled_before_its_start_costs_nothing(tenant_a, world):
    from billing.invoices import build_invoice
    from billing.prices import set_price
    from reservations.models import Reservation

    set_price(
        gpu_model=MODEL,
        hourly_rate=Decimal("2.50"),
        reservation_hourly_rate=Decimal("1.75"),
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
    )
    Reservation.objects.create(
        tenant=tenant_a,
        gpu_model_id=MODEL,
        region="us-east-1",
        gpus=8,
        start=t(10),
        end=t(11),
        cancelled_at=t(9),
        created_at=t(1),
    )
    invoice = build_invoice(tenant_a.id, "2026-03", now=datetime(2026, 4, 2, tzinfo=UTC))
    assert not invoice.lines.filter(kind="RESERVATION").exists()
    assert invoice.total == Decimal("0.00")
