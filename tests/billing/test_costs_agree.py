"""Every cost a tenant reads — the usage API, the portal's usage page, ``nvkectl usage`` (the
API's figures) — equals the invoice, line by line (issue 33 item 1), worked by hand.

March 2026 (UTC, USD). List price H100 2.50 USD per GPU-hour on-demand, 1.86 per reserved
GPU-hour. Tenant A:

* on-demand pool ``od``: 1 whole GPU 2026-03-10 00:00-04:00 = 4 GPU-h x 2.50 = 10.00 USD;
* reserved pool ``rsv`` draws from reservation R (1 H100, 2026-03-12 00:00-00:30): its node
  used 1 GPU for 1,774.8 s = 0.493 GPU-h inside R — covered, 0 USD (the Usage page used to
  price it on-demand: 0.493 x 2.50 = 1.23 USD); R itself: 0.5 reserved GPU-h x 1.86 = 0.93 USD;
* MIG fraction: pool ``mig`` shares GPUs across tenants (``tenancy: shared``), one 1g.10gb
  instance 2026-03-14 00:00-04:00: 4 h x 1/7 (0.142857) = 0.571428 GPU-h x 2.50 = 1.43 USD;
* shared by time-slicing (one tenant's GPU, billed whole): pool ``ts``, 2 GPUs 2026-03-15
  00:00-01:30 = 3 GPU-h x 2.50 = 7.50 USD.

Invoice total 10.00 + 0.93 + 1.43 + 7.50 = 19.86 USD (the old Usage page said 20.16: the
reserved usage at 1.23 on-demand, no reservation line).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from tests.portal.conftest import alice, alice_client, portal_user  # noqa: F401

pytestmark = pytest.mark.django_db

MODEL = "h100-sxm5-80gb"
NOW = datetime(2026, 4, 2, tzinfo=UTC)
MARCH = (datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC))


def t(day, hour=0):
    return datetime(2026, 3, day, hour, tzinfo=UTC)


@pytest.fixture
def month(world, tenant_a):
    return build_month(world, tenant_a)


def build_month(world, tenant_a) -> dict:
    """The month of the module docstring, written directly (SIMULATED hosts)."""
    from billing.ledger import close_allocations, open_allocation
    from billing.prices import set_price
    from reservations.models import Reservation

    set_price(
        gpu_model=MODEL,
        hourly_rate=Decimal("2.50"),
        reservation_hourly_rate=Decimal("1.86"),
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
        label="list",
    )
    host = world.make_host(MODEL, gpus=8)
    gpus = list(host.gpus.order_by("index").values_list("uuid", flat=True))
    od = world.pool(tenant_a, name="od", gpus_per_node=1)
    world.hold(od, host, t(10), end=t(10, 4), gpus=gpus[:1])
    r = Reservation.objects.create(
        tenant=tenant_a,
        name="short-block",
        gpu_model_id=MODEL,
        region="us-east-1",
        gpus=1,
        start=t(12),
        end=t(12) + timedelta(minutes=30),
        end_action="keep",
        created_at=t(1),
    )
    rsv = world.pool(tenant_a, name="rsv", gpus_per_node=1)
    rsv.reservation = r
    rsv.save(update_fields=["reservation"])
    world.hold(rsv, host, t(12), end=t(12) + timedelta(seconds=1774.8), gpus=gpus[1:2])
    mig = world.pool(
        tenant_a,
        name="mig",
        gpus_per_node=1,
        isolation={"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"},
    )
    node = world.node(mig, host, [gpus[2]], t(14))
    open_allocation(
        node=node, gpu_uuid=gpus[2], start=t(14), mig_gpu_instance_id=7, mig_profile="1g.10gb"
    )
    close_allocations(node, t(14, 4))
    ts = world.pool(
        tenant_a,
        name="ts",
        gpus_per_node=2,
        isolation={"mode": "time-slicing", "replicas": 4},
    )
    world.hold(ts, host, t(15), end=t(15, 1) + timedelta(minutes=30), gpus=gpus[3:5])
    return {"od": od, "rsv": rsv, "mig": mig, "ts": ts, "reservation": r}


EXPECTED = {  # (kind, pool name) -> amount in USD
    ("USAGE", "od"): Decimal("10.00"),
    ("USAGE", "mig"): Decimal("1.43"),
    ("USAGE", "ts"): Decimal("7.50"),
    ("RESERVATION", None): Decimal("0.93"),
}


def _by_pool(month):
    return {p.id: name for name, p in month.items() if name != "reservation"}


def march_usage(client, **params: str) -> dict:
    """``GET /api/v1/usage`` for March 2026 (``params``: ``group_by``) as ``client``: the body."""
    resp = client.get(
        "/api/v1/usage",
        {"start": "2026-03-01T00:00:00Z", "end": "2026-04-01T00:00:00Z", **params},
    )
    assert resp.status_code == 200, resp.content
    return resp.json()


def test_usage_costs_are_the_invoice_lines(tenant_a, month):
    from billing.costs import usage_costs
    from billing.invoices import build_invoice

    invoice = build_invoice(tenant_a.id, "2026-03", now=NOW)
    names = _by_pool(month)
    billed = {
        (ln.kind, names.get(ln.nodepool_id)): ln.amount for ln in invoice.lines.order_by("position")
    }
    assert billed == EXPECTED
    assert invoice.total == Decimal("19.86")

    costs = usage_costs(tenant_a.id, *MARCH, NOW)
    shown = {(ln.kind, names.get(ln.nodepool_id)): ln.amount for ln in costs.lines}
    assert shown == billed
    assert costs.total == invoice.total
    # the same lines, field by field (seconds and unit prices too)
    line_fields = [
        (ln.kind, ln.nodepool_id, ln.gpu_model, ln.mig_profile, ln.unit_price, ln.gpu_seconds)
        for ln in invoice.lines.order_by("position")
    ]
    cost_fields = [
        (ln.kind, ln.nodepool_id, ln.gpu_model, ln.mig_profile, ln.unit_price, ln.gpu_seconds)
        for ln in costs.lines
    ]
    assert sorted(cost_fields, key=str) == sorted(line_fields, key=str)
    mig_line = next(ln for ln in costs.lines if ln.nodepool_id == month["mig"].id)
    assert mig_line.gpu_seconds == Decimal("0.142857") * 4 * 3600


def test_the_usage_api_shows_the_invoice_costs(tenant_a, month, owner):
    from billing.invoices import build_invoice

    invoice = build_invoice(tenant_a.id, "2026-03", now=NOW)  # aggregates the month too
    body = march_usage(owner, group_by="pool")
    by_pool = {r["nodepool_name"]: r["cost"] for r in body["results"]}
    assert by_pool == {
        "od": {"USD": "10.00"},
        # covered by the reservation: 0.00, as everywhere (it was {}; {} is for no usage)
        "rsv": {"USD": "0.00"},
        "mig": {"USD": "1.43"},
        "ts": {"USD": "7.50"},
    }
    assert body["totals"]["cost"] == {"USD": f"{invoice.total:f}"} == {"USD": "19.86"}
    (reserved,) = body["reservations"]
    assert (reserved["reservation_name"], reserved["cost"]) == ("short-block", {"USD": "0.93"})
    assert reserved["reserved_gpu_hours"] == "0.500000"
    rsv = next(r for r in body["results"] if r["nodepool_name"] == "rsv")
    assert rsv["gpu_hours"] == "0.493000"


def test_the_usage_api_by_day_sums_day_lines(tenant_a, month, owner):
    from billing.invoices import build_invoice

    build_invoice(tenant_a.id, "2026-03", now=NOW)
    body = march_usage(owner, group_by="day")
    by_day = {r["day"]: r["cost"] for r in body["results"]}
    assert by_day == {
        "2026-03-10": {"USD": "10.00"},
        "2026-03-12": {"USD": "0.00"},  # all covered by the reservation
        "2026-03-14": {"USD": "1.43"},
        "2026-03-15": {"USD": "7.50"},
    }


def test_the_portal_usage_page_shows_the_invoice_costs(tenant_a, month, alice_client):  # noqa: F811
    from billing.invoices import build_invoice

    build_invoice(tenant_a.id, "2026-03", now=NOW)
    html = alice_client.get("/usage", {"start": "2026-03-01", "end": "2026-03-31"}).content
    html = html.decode()
    total = re.search(r'id="total-cost">([^<]*)<', html).group(1)
    assert total == "19.86 USD"  # was 20.16: reserved usage on-demand, no reservation
    pools = re.search(r'id="by-pool">(.*?)</table>', html, re.S).group(1)
    rows = dict(re.findall(r"<tr><td>([a-z]+)</td><td>[^<]*</td><td>([^<]*)", pools))
    # covered: 0.00 USD, as the usage API and nvkectl (it was —)
    assert rows == {"od": "10.00 USD", "rsv": "0.00 USD", "mig": "1.43 USD", "ts": "7.50 USD"}
    # the reserved pool's usage is named as covered, not shown as free (issue 33, trial)
    assert "0.493 GPU-h covered by reservation short-block" in pools
    reservations = re.search(r'id="by-reservation">(.*?)</table>', html, re.S).group(1)
    assert "short-block" in reservations and "0.93 USD" in reservations


def test_a_missing_price_shows_no_guess(tenant_a, world, owner, alice_client):  # noqa: F811
    """No price for the A100 usage: the API says which model and currency, the page says so
    (no cost is made up from another price)."""
    from billing.aggregation import aggregate_usage

    pool = world.pool(tenant_a, name="a100", model="a100-sxm4-80gb", gpus_per_node=1)
    host = world.make_host("a100-sxm4-80gb", gpus=1)
    world.hold(pool, host, t(10), end=t(10, 2))
    aggregate_usage(tenant_a.id, *MARCH, now=NOW)
    body = march_usage(owner)
    assert body["totals"]["cost"] is None
    error = body["totals"]["cost_error"]
    assert (error["code"], error["gpu_model"], error["currency"]) == (
        "missing_price",
        "a100-sxm4-80gb",
        "USD",
    )
    assert body["totals"]["gpu_hours"] == "2.000000"
    html = alice_client.get("/usage", {"start": "2026-03-01", "end": "2026-03-31"}).content
    assert "No total cost can be shown" in html.decode()
    assert "no USD price for a100-sxm4-80gb" in html.decode()


def test_the_dry_run_rates_a_shared_mig_pool_as_its_ledger_rows_are_rated(tenant_a, catalog):
    """A 1g.10gb price of its own (4.20 USD per GPU-hour, list H100 2.50): 7 instances of a
    shared pool for an hour are 7 x 0.142857 = 0.999999 GPU-h x 4.20 = 4.20 USD — the dry run
    used the whole-GPU price (2.50)."""
    from django.utils import timezone

    from billing.prices import set_price
    from nodepools.capacity_check import cost_answer

    start = timezone.now() - timedelta(days=1)
    set_price(gpu_model=MODEL, hourly_rate=Decimal("2.50"), effective_from=start, label="list")
    set_price(
        gpu_model=MODEL,
        mig_profile="1g.10gb",
        hourly_rate=Decimal("4.20"),
        effective_from=start,
        label="list 1g",
    )
    answer = cost_answer(
        tenant_id=tenant_a.id,
        gpu_model=MODEL,
        gpus=7,
        reservation=None,
        isolation={"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"},
    )
    assert (answer["unit_price"], answer["gpu_hours_per_hour"], answer["hourly"]) == (
        Decimal("4.20"),
        Decimal("0.999999"),
        Decimal("4.20"),
    )
    whole = cost_answer(tenant_id=tenant_a.id, gpu_model=MODEL, gpus=2, reservation=None)
    assert (whole["unit_price"], whole["hourly"]) == (Decimal("2.50"), Decimal("5.00"))


def test_the_dry_run_rates_a_dedicated_mig_pool_at_its_profile_price(world, tenant_a, catalog):
    """A dedicated MIG-single pool (``{"mode": "mig", "mig_profile": "1g.10gb"}``, H100 list
    2.50, 1g.10gb 2.80): its nodes' ledger rows name the profile (fraction 1.0), so the invoice
    bills 2 GPUs x 1 h x 2.80 = 5.60 USD, and the dry run says the same: unit price 2.80,
    5.60 USD per hour (it said 2.50 and 5.00: the whole-GPU price)."""
    from django.utils import timezone

    from billing.aggregation import aggregate_usage
    from billing.costs import usage_costs
    from billing.prices import set_price
    from billing.receivers import close_ledger, open_ledger
    from nodepools.capacity_check import cost_answer

    start = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    set_price(gpu_model=MODEL, hourly_rate=Decimal("2.50"), effective_from=start, label="list")
    set_price(
        gpu_model=MODEL,
        mig_profile="1g.10gb",
        hourly_rate=Decimal("2.80"),
        effective_from=start,
        label="list 1g",
    )
    isolation = {"mode": "mig", "mig_profile": "1g.10gb"}
    answer = cost_answer(
        tenant_id=tenant_a.id, gpu_model=MODEL, gpus=2, reservation=None, isolation=isolation
    )
    assert (answer["unit_price"], answer["gpu_hours_per_hour"], answer["hourly"]) == (
        Decimal("2.80"),
        Decimal(2),
        Decimal("5.60"),
    )
    pool = world.pool(tenant_a, name="migs", isolation=isolation, gpus_per_node=2)
    host = world.make_host(MODEL, gpus=2)
    gpus = list(host.gpus.order_by("index").values_list("uuid", flat=True))
    node = world.node(pool, host, gpus, start)
    open_ledger(sender=None, node=node)  # the receiver the reconciler's node_ready reaches
    node.released_at = start + timedelta(hours=1)
    node.save(update_fields=["released_at"])
    close_ledger(sender=None, node=node)
    aggregate_usage(tenant_a.id, start, start + timedelta(hours=1), now=timezone.now())
    (line,) = usage_costs(tenant_a.id, start, start + timedelta(hours=1)).usage_lines()
    assert (line.mig_profile, line.unit_price, line.gpu_hours, line.amount) == (
        "1g.10gb",
        answer["unit_price"],
        Decimal("2.000000"),
        answer["hourly"],
    )


def test_nvkectl_usage_prints_the_invoice_costs(tenant_a, month, owner):
    """nvkectl usage prints the API's rows and totals (cli/nvkectl/usage.py) as text."""
    from nvkectl import usage as usage_cli

    from billing.invoices import build_invoice

    build_invoice(tenant_a.id, "2026-03", now=NOW)
    body = march_usage(owner, group_by="pool")
    rows = {r["nodepool_name"]: (r["cost"], r["covered"]) for r in usage_cli.usage_rows(body)}
    assert rows == {
        "od": ("10.00 USD", "-"),
        "rsv": ("0.00 USD", "0.493000 GPU-h by reservation short-block"),  # was -
        "mig": ("1.43 USD", "-"),
        "ts": ("7.50 USD", "-"),
    }
    notes = usage_cli.usage_notes(body)
    assert notes[0].startswith("reservation short-block: 0.500000 reserved GPU-h, 0.93 USD")
    assert notes[-1] == (
        "total: 8.064428 billable GPU-h (0.493000 of them covered by reservations), 19.86 USD, "
        "for usage and reservations 2026-03-01T00:00:00+00:00 .. 2026-04-01T00:00:00+00:00"
    )


def test_nvkectl_says_why_usage_is_empty(tenant_a, owner):
    from nvkectl import usage as usage_cli

    body = march_usage(owner)
    assert body["results"] == [] and body["aggregated_every_s"] == 300
    (note,) = usage_cli.usage_notes(body)
    assert "usage is aggregated every 5 min" in note
    # as the portal's empty list says, and the beat does (NVKE_BILLING_INVOICE_INTERVAL_S,
    # 3600 s by default): trial 6 read "built by an operator" here, "every hour" there
    assert "draft is built every hour" in usage_cli.INVOICES_EMPTY
    from django.conf import settings

    assert settings.NVKE_BILLING_INVOICE_INTERVAL_S == 3600
