"""What a tenant and an operator read agrees with itself (issue 33): the disagreements a
fresh-user trial against ``make run`` found in the billing views, each worked by hand.

The month is :func:`tests.billing.test_costs_agree.build_month` (March 2026, UTC, USD; H100 list
2.50 per GPU-hour, 1.86 per reserved GPU-hour): pools ``od`` 4 GPU-h = 10.00, ``rsv`` 0.493 GPU-h
inside reservation ``short-block`` (covered; the reservation 0.5 h x 1.86 = 0.93), ``mig``
0.571428 GPU-h = 1.43 (1g.10gb at the H100 price), ``ts`` 3 GPU-h = 7.50; invoice 19.86 USD.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from tests.billing.test_costs_agree import MARCH, NOW, build_month, march_usage, t
from tests.portal.conftest import alice, alice_client, ops_client, portal_user  # noqa: F401

pytestmark = pytest.mark.django_db

A100 = "a100-sxm4-80gb"
H100 = "h100-sxm5-80gb"


def _reservation(tenant, name, model, start, end, gpus=1):
    from reservations.models import Reservation

    return Reservation.objects.create(
        tenant=tenant,
        name=name,
        gpu_model_id=model,
        region="us-east-1",
        gpus=gpus,
        start=start,
        end=end,
        end_action="keep",
        created_at=start - timedelta(days=1),
    )


# ------------------------------------------------- 1. one missing price blanks no other row


@pytest.fixture
def month_with_unpriced_a100(world, tenant_a):
    """The month, plus: pool ``a100`` in cluster ``infer``, 1 A100 2026-03-10 00:00-02:00
    (2 GPU-h), and reservation ``a100-block`` of 1 A100 on 2026-03-20 00:00-01:00 (no pool);
    the price sheet has no A100 price at all."""
    from billing.aggregation import aggregate_usage

    month = build_month(world, tenant_a)
    a100 = world.pool(tenant_a, name="a100", cluster="infer", model=A100, gpus_per_node=1)
    world.hold(a100, world.make_host(A100, gpus=1), t(10), end=t(10, 2))
    _reservation(tenant_a, "a100-block", A100, t(20), t(20, 1))
    aggregate_usage(tenant_a.id, *MARCH, now=NOW)
    return {**month, "a100": a100}


def test_a_missing_price_blanks_only_the_rows_it_touches(
    tenant_a,
    month_with_unpriced_a100,
    owner,
    alice_client,  # noqa: F811
):
    """Before: every row's cost was null. Now the priced rows keep theirs (od 10.00, mig 1.43,
    ts 7.50; cluster train 10.00 + 1.43 + 7.50 = 18.93), the A100 rows say why they have none,
    and the total stays null naming both unpriced things; the invoice still refuses (409)."""
    from billing.invoices import build_invoice
    from nvke.errors import Conflict

    body = march_usage(owner, group_by="pool")
    by_pool = {r["nodepool_name"]: r for r in body["results"]}
    assert {name: r["cost"] for name, r in by_pool.items()} == {
        "od": {"USD": "10.00"},
        "rsv": {"USD": "0.00"},  # covered by the reservation
        "mig": {"USD": "1.43"},
        "ts": {"USD": "7.50"},
        "a100": None,
    }
    error = by_pool["a100"]["cost_error"]
    assert (error["code"], error["gpu_model"], error["mig_profile"], error["currency"]) == (
        "missing_price",
        A100,
        "",
        "USD",
    )
    assert error["detail"] == (
        "no USD price for a100-sxm4-80gb (whole GPU) at 2026-03-10 00:00:00+00:00"
    )
    assert all("cost_error" not in r for name, r in by_pool.items() if name != "a100")

    by_cluster = march_usage(owner, group_by="cluster")["results"]
    assert {r["cluster_name"]: r["cost"] for r in by_cluster} == {
        "train": {"USD": "18.93"},
        "infer": None,
    }

    totals = body["totals"]
    assert totals["cost"] is None
    assert (totals["cost_error"]["code"], totals["cost_error"]["gpu_model"]) == (
        "missing_price",
        A100,
    )  # the earliest: 10 March (the reservation's stretch starts on the 20th)
    missing = [
        (m["code"], m["gpu_model"], m.get("reservation")) for m in totals["cost_error"]["missing"]
    ]
    assert missing == [
        ("missing_price", A100, None),
        ("missing_reservation_price", A100, "a100-block"),
    ]
    reservations = {r["reservation_name"]: r for r in body["reservations"]}
    assert reservations["short-block"]["cost"] == {"USD": "0.93"}
    unpriced = reservations["a100-block"]
    assert (unpriced["cost"], unpriced["reserved_gpu_hours"]) == (None, "1.000000")
    assert unpriced["cost_error"]["code"] == "missing_reservation_price"

    with pytest.raises(Conflict) as caught:
        build_invoice(tenant_a.id, "2026-03", now=NOW)
    assert (caught.value.status_code, caught.value.code) == (409, "missing_price")

    html = alice_client.get("/usage", {"start": "2026-03-01", "end": "2026-03-31"}).content
    html = html.decode()
    pools = re.search(r'id="by-pool">(.*?)</table>', html, re.S).group(1)
    rows = dict(re.findall(r"<tr><td>([a-z0-9]+)</td><td>[^<]*</td><td>(.*?)</td></tr>", pools))
    assert rows["od"] == "10.00 USD" and rows["ts"] == "7.50 USD" and rows["mig"] == "1.43 USD"
    assert rows["a100"] == (
        '<span class="error small no-price">no cost: no USD price for a100-sxm4-80gb '
        "(whole GPU) at 2026-03-10 00:00:00+00:00</span>"
    )
    assert re.search(r'id="total-cost">([^<]*)<', html).group(1) == "—"
    assert "No total cost can be shown" in html
    assert "no USD reservation rate for a100-sxm4-80gb" in html


def test_nvkectl_usage_says_why_a_row_has_no_cost(tenant_a, month_with_unpriced_a100, owner):
    from nvkectl import usage as usage_cli

    body = march_usage(owner, group_by="pool")
    rows = {r["nodepool_name"]: r["cost"] for r in usage_cli.usage_rows(body)}
    assert rows["od"] == "10.00 USD"
    assert rows["a100"] == (
        "no price: no USD price for a100-sxm4-80gb (whole GPU) at 2026-03-10 00:00:00+00:00"
    )
    notes = usage_cli.usage_notes(body)
    assert (
        "reservation a100-block: 1.000000 reserved GPU-h, no price: no USD reservation rate for "
        "a100-sxm4-80gb at 2026-03-20 00:00:00+00:00 (the usage it covers costs nothing more)"
    ) in notes
    assert "no price: no USD price for a100-sxm4-80gb (whole GPU)" in notes[-1]


# ------------------------------------- 2. usage a reservation covers is named in every grouping


def test_covered_gpu_hours_make_every_row_add_up(tenant_a, world, owner, alice_client):  # noqa: F811
    """Grouped by GPU model the H100 whole-GPU row was 7.493 GPU-h and 17.50 USD with a
    2.50 price, unexplained (7.493 x 2.50 = 18.73). Now it says 0.493 GPU-h are covered by
    short-block: (7.493 - 0.493) x 2.50 = 17.50."""
    from billing.invoices import build_invoice

    build_month(world, tenant_a)
    build_invoice(tenant_a.id, "2026-03", now=NOW)
    by_model = march_usage(owner, group_by="model,profile")["results"]
    rows = {(r["gpu_model"], r["mig_profile"]): r for r in by_model}
    whole = rows[(H100, "")]
    assert (whole["billable_gpu_hours"], whole["covered_gpu_hours"], whole["cost"]) == (
        "7.493000",
        "0.493000",
        {"USD": "17.50"},
    )
    assert whole["covered_by"] == ["short-block"]
    price = Decimal("2.50")
    billable, covered = Decimal(whole["billable_gpu_hours"]), Decimal(whole["covered_gpu_hours"])
    assert ((billable - covered) * price).quantize(Decimal("0.01")) == Decimal("17.50")
    mig = rows[(H100, "1g.10gb")]
    assert (mig["covered_gpu_hours"], mig["covered_by"]) == ("0.000000", [])

    by_day = {r["day"]: r for r in march_usage(owner, group_by="day")["results"]}
    assert (by_day["2026-03-12"]["covered_gpu_hours"], by_day["2026-03-12"]["cost"]) == (
        "0.493000",
        {"USD": "0.00"},  # all covered: 0.00 (it was {}, which reads as no usage)
    )
    totals = march_usage(owner)["totals"]
    assert (totals["covered_gpu_hours"], totals["covered_by"]) == ("0.493000", ["short-block"])

    html = alice_client.get("/usage", {"start": "2026-03-01", "end": "2026-03-31"}).content
    models = re.search(r'id="by-model">(.*?)</table>', html.decode(), re.S).group(1)
    assert (
        "<td>2.5 USD</td><td>17.50 USD<br>"
        '<span class="muted small covered">0.493 GPU-h covered by reservation short-block</span>'
    ) in models


# ------------------------------------------------------ 3. idle cost from the invoice's pricing


@pytest.fixture
def idle_gpus(world, tenant_a, list_prices):
    """2026-11-09 10:00 (T), list prices with H100 at 2.50 and the A100 price removed. Three
    idle GPUs (utilization 0-1 %), each in its own cluster:

    * ``od``: 1 H100 held T..T+3 min (on demand): idle 0.05 h x 2.50 = 0.125 -> 0.12 USD
      (half-even); the page said "Idle hours 1";
    * ``rsv``: 1 H100 held T..T+1 h in a pool drawing from reservation ``idle-block`` (1 H100,
      T..T+1 h): idle 1 GPU-h, covered: 0.00 (the old figure: 2.50 at list);
    * ``a100``: 1 A100 held T..T+1 h, no A100 price: no figure, the reason instead.
    """
    from billing.aggregation import aggregate_usage
    from billing.models import Price
    from fleet.ingest import ingest_report

    Price.objects.filter(gpu_model_id=A100).delete()
    start = datetime(2026, 11, 9, 10, tzinfo=UTC)
    h100 = world.make_host(H100, gpus=2)
    g0, g1 = list(h100.gpus.order_by("index").values_list("uuid", flat=True))
    a100_host = world.make_host(A100, gpus=1)
    (a0,) = list(a100_host.gpus.values_list("uuid", flat=True))
    od = world.pool(tenant_a, name="od", cluster="od", gpus_per_node=1)
    world.hold(od, h100, start, start + timedelta(minutes=3), gpus=[g0])
    rsv = world.pool(tenant_a, name="rsv", cluster="rsv", gpus_per_node=1)
    rsv.reservation = _reservation(tenant_a, "idle-block", H100, start, start + timedelta(hours=1))
    rsv.save(update_fields=["reservation"])
    world.hold(rsv, h100, start, start + timedelta(hours=1), gpus=[g1])
    a100 = world.pool(tenant_a, name="a100", cluster="a100", model=A100, gpus_per_node=1)
    world.hold(a100, a100_host, start, start + timedelta(hours=1))
    for host, samples in (
        (h100, [(g0, 1, 0), (g1, 10, 1)]),
        (a100_host, [(a0, 10, 0)]),
    ):
        body = {
            "seq": 1,
            "samples": [
                {
                    "ts": (start + timedelta(minutes=m)).isoformat(),
                    "gpu_uuid": gpu,
                    "utilization_gpu_pct": util,
                    "memory_used_bytes": 2**30,
                    "memory_total_bytes": 80 * 2**30,
                }
                for gpu, m, util in samples
            ],
        }
        ingest_report(host, body, now=start + timedelta(hours=1))
    # utilization counts up to where the aggregated usage ends (the usage view's cost window)
    aggregate_usage(tenant_a.id, start, start + timedelta(hours=1), now=start + timedelta(hours=1))
    return {"start": start, "uuids": {"od": g0, "rsv": g1, "a100": a0}}


def test_idle_cost_is_rated_like_the_invoice(owner, idle_gpus, alice_client):  # noqa: F811
    start = idle_gpus["start"]
    window = {"start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
    body = owner.get("/api/v1/utilization", window).json()
    by_gpu = {g["gpu_uuid"]: g for g in body["idle_gpus"]}
    od, rsv, a100 = (by_gpu[idle_gpus["uuids"][k]] for k in ("od", "rsv", "a100"))
    assert (od["idle_hours"], od["idle_gpu_hours"], od["idle_cost"]) == (
        "0.050000",
        "0.050000",
        {"USD": "0.12"},
    )
    assert (rsv["idle_hours"], rsv["idle_cost"], rsv["idle_covered_gpu_hours"]) == (
        "1.000000",
        {"USD": "0.00"},
        "1.000000",
    )
    assert rsv["idle_covered_by"] == ["idle-block"]
    assert a100["idle_cost"] is None
    assert (a100["idle_cost_error"]["code"], a100["idle_cost_error"]["gpu_model"]) == (
        "missing_price",
        A100,
    )
    groups = {g["cluster_id"]: g["idle_cost"] for g in body["groups"]}
    assert groups == {
        od["cluster_id"]: {"USD": "0.12"},
        rsv["cluster_id"]: {"USD": "0.00"},
        a100["cluster_id"]: None,
    }

    html = alice_client.get("/usage", {"start": "2026-11-09", "end": "2026-11-09"}).content
    table = re.search(r'id="idle-gpus">(.*?)</table>', html.decode(), re.S).group(1)
    cells = re.findall(r"<tr><td[^>]*>([^<]*)</td>(.*?)</tr>", table)
    rows = {gpu: re.findall(r"<td>(.*?)</td>", rest) for gpu, rest in cells}
    assert rows[idle_gpus["uuids"]["od"]][2:] == ["0.050", "0.050", "0.12 USD"]
    assert rows[idle_gpus["uuids"]["rsv"]][4].startswith(
        '0.00 USD<br><span class="muted small covered">1.000 GPU-h covered by reservation '
        "idle-block"
    )
    assert rows[idle_gpus["uuids"]["a100"]][4].startswith(
        '<span class="error small no-price">no cost: no USD price for a100-sxm4-80gb'
    )


# ------------------------------------------- 4. both halves of the total cover the same window


def test_the_total_charges_reservations_up_to_where_usage_is_aggregated(
    world,
    tenant_a,
    owner,
    alice_client,  # noqa: F811
):
    """Usage last aggregated at A (30 min ago); an on-demand H100 running since A - 90 min
    and a 1-H100 reservation ``block`` in force since A - 90 min. Usage: 1.5 GPU-h x 2.50 =
    3.75; the reservation up to A: 1.5 h x 1.86 = 2.79; total 6.54 USD over [.., A). Before,
    the reservation was charged up to the call (>= 2 h x 1.86 = 3.72; total >= 7.47)."""
    from django.utils import timezone
    from nvkectl import usage as usage_cli

    from billing.aggregation import aggregate_usage
    from billing.prices import set_price

    set_price(
        gpu_model=H100,
        hourly_rate=Decimal("2.50"),
        reservation_hourly_rate=Decimal("1.86"),
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
        label="list",
    )
    aggregated = (timezone.now() - timedelta(minutes=30)).replace(microsecond=0)
    since = aggregated - timedelta(minutes=90)
    _reservation(tenant_a, "block", H100, since, aggregated + timedelta(days=1))
    pool = world.pool(tenant_a, name="od", gpus_per_node=1)
    host = world.make_host(H100, gpus=1)
    world.hold(pool, host, since)  # still running
    aggregate_usage(tenant_a.id, since, aggregated, now=aggregated)

    # a whole hour: a start inside an hour moves up to the next one (both views)
    start = (since - timedelta(hours=1)).replace(minute=0, second=0)
    body = owner.get("/api/v1/usage", {"start": start.isoformat()}).json()
    totals = body["totals"]
    assert totals["gpu_hours"] == "1.500000"
    (reserved,) = body["reservations"]
    assert (reserved["reserved_gpu_hours"], reserved["cost"]) == ("1.500000", {"USD": "2.79"})
    assert totals["cost"] == {"USD": "6.54"}
    assert totals["cost_window"] == {"start": start.isoformat(), "end": aggregated.isoformat()}
    assert reserved["charged_through"] == aggregated.isoformat()
    assert usage_cli.usage_notes(body)[-1].endswith(
        f"6.54 USD, for usage and reservations {start.isoformat()} .. {aggregated.isoformat()}"
    )

    day = start.date().isoformat()
    html = alice_client.get("/usage", {"start": day, "end": timezone.now().date().isoformat()})
    assert f"to {aggregated:%Y-%m-%d %H:%M} UTC." in html.content.decode()
    total = re.search(r'id="total-cost">([^<]*)<', html.content.decode()).group(1)
    assert total == "6.54 USD"


def test_a_tenant_with_nothing_running_is_charged_up_to_now(world, tenant_a):
    """Usage complete: its last node was released before the last aggregation, so the
    records hold all of it and the window ends now (no allocation since)."""
    from django.utils import timezone

    from billing.aggregation import aggregate_usage, usage_complete_through

    host = world.make_host(H100, gpus=1)
    now = timezone.now()
    first = world.pool(tenant_a, gpus_per_node=1)
    world.hold(first, host, now - timedelta(hours=2), now - timedelta(hours=1))
    aggregate_usage(tenant_a.id, now - timedelta(days=1), now, now=now - timedelta(minutes=30))
    assert usage_complete_through(tenant_a.id, now) == now
    running = world.pool(tenant_a, name="b", gpus_per_node=1)
    world.hold(running, world.make_host(H100, gpus=1), now - timedelta(minutes=10))
    assert usage_complete_through(tenant_a.id, now) == now - timedelta(minutes=30)


# -------------------------------------------------- 5. a draft whose rebuild failed is stale


def test_a_draft_whose_rebuild_failed_says_so_and_cannot_be_finalized(
    world,
    tenant_a,
    operator,
    ops_client,  # noqa: F811
):
    """Tenant A ran 4 GB200 for 2 h on 2026-03-10 at 6.00: the draft says 48.00 USD. Then the
    GB200 price is removed: the next rebuild fails (missing_price). The console listed the
    draft with its 48.00 and a Finalize button; now it says the rebuild failed and why, offers
    no Finalize, and the finalize API answers 409 naming the reason. With the price back (7.00)
    the draft finalizes at 4 x 2 x 7.00 = 56.00."""
    from billing.invoices import build_invoice
    from billing.models import InvoiceStatus, Price
    from billing.prices import set_price
    from nvke.errors import Conflict

    jan = datetime(2026, 1, 1, tzinfo=UTC)
    set_price(gpu_model="gb200", hourly_rate=Decimal("6.00"), effective_from=jan, label="list")
    pool = world.pool(tenant_a, name="gb", model="gb200", gpus_per_node=4)
    world.hold(pool, world.make_host("gb200", gpus=4), t(10), end=t(10, 2))
    draft = build_invoice(tenant_a.id, "2026-03", now=NOW)
    assert (draft.status, draft.total, draft.build_error) == (
        InvoiceStatus.DRAFT,
        Decimal("48.00"),
        None,
    )
    page = ops_client.get("/console/invoices").content.decode()
    assert f"/console/invoices/{draft.id}/finalize" in page

    Price.objects.filter(gpu_model_id="gb200").delete()
    with pytest.raises(Conflict):
        build_invoice(tenant_a.id, "2026-03", now=NOW + timedelta(hours=1))
    draft.refresh_from_db()
    assert (draft.status, draft.total) == (InvoiceStatus.DRAFT, Decimal("48.00"))  # stale
    assert {k: draft.build_error[k] for k in ("code", "gpu_model", "currency", "failed_at")} == {
        "code": "missing_price",
        "gpu_model": "gb200",
        "currency": "USD",
        "failed_at": (NOW + timedelta(hours=1)).isoformat(),
    }

    page = ops_client.get("/console/invoices").content.decode()
    assert f"/console/invoices/{draft.id}/finalize" not in page
    assert (
        "Rebuild failed 2026-04-02 01:00 UTC: no USD price for gb200 (whole GPU) at "
        "2026-03-10 00:00:00+00:00 (missing_price)"
    ) in page
    listed = operator.get(f"/api/v1/invoices/{draft.id}").json()
    assert listed["build_error"]["code"] == "missing_price"

    resp = operator.post(f"/api/v1/invoices/{draft.id}/finalize")
    assert resp.status_code == 409
    assert resp.json()["code"] == "missing_price"
    assert resp.json()["detail"].startswith(
        f"{draft.number} cannot be finalized: its rebuild failed: no USD price for gb200"
    )
    draft.refresh_from_db()
    assert draft.status == InvoiceStatus.DRAFT and draft.build_error["code"] == "missing_price"

    set_price(gpu_model="gb200", hourly_rate=Decimal("7.00"), effective_from=jan, label="list")
    resp = operator.post(f"/api/v1/invoices/{draft.id}/finalize")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert (body["status"], body["total"], body["build_error"]) == ("FINALIZED", "56.00", None)


def test_build_drafts_now_marks_a_draft_it_cannot_rebuild(world, tenant_a, ops_client):  # noqa: F811
    """The same in this month, through the console: the GB200 price is removed after the draft
    was built; Build drafts now names the missing price and still sends the tenant's build
    (it used to skip it, so the draft kept its Finalize button until the hourly run); the
    worker's run (build_tenant_invoices) fails and marks the draft: no Finalize."""
    from django.core.cache import cache
    from django.utils import timezone

    from billing.invoices import build_invoice
    from billing.models import Invoice, Price
    from billing.periods import period_of
    from billing.prices import set_price
    from billing.tasks import build_tenant_invoices

    now = timezone.now()
    start = now - timedelta(days=3)
    since = start - timedelta(days=60)
    set_price(gpu_model="gb200", hourly_rate=Decimal("6.00"), effective_from=since, label="list")
    pool = world.pool(tenant_a, name="gb", model="gb200", gpus_per_node=4)
    world.hold(pool, world.make_host("gb200", gpus=4), start, end=start + timedelta(hours=2))
    draft = build_invoice(tenant_a.id, period_of("UTC", start).label, now=now)
    assert draft.total == Decimal("48.00")  # 4 GPUs x 2 h x 6.00
    Price.objects.filter(gpu_model_id="gb200").delete()

    page = ops_client.post("/console/invoices/build", follow=True).content.decode()
    assert "Cannot build tenant-a&#x27;s invoice: no USD price for gb200 (whole GPU)" in page
    assert cache.get(f"enqueued:{build_tenant_invoices.name}:{tenant_a.id}") == 1  # sent
    cache.delete(f"enqueued:{build_tenant_invoices.name}:{tenant_a.id}")

    assert "missing_price" in build_tenant_invoices(str(tenant_a.id))  # the worker's run
    draft = Invoice.objects.get(pk=draft.pk)
    assert (draft.build_error["code"], draft.build_error["gpu_model"]) == ("missing_price", "gb200")
    page = ops_client.get("/console/invoices").content.decode()
    assert f"/console/invoices/{draft.id}/finalize" not in page
    assert "Rebuild failed" in page and "no USD price for gb200 (whole GPU)" in page


def test_a_missing_price_names_the_first_usage_everywhere(world, tenant_a, owner):
    """One A100 (no A100 price) from 2026-03-10 23:41 to 11 March 01:00. The console's
    missing_prices said the window's start (2026-03-01 00:00, the unpriced stretch clipped to
    the window) and the usage API and the invoice's 409 the hour bucket (23:00); all now name
    the first usage: 2026-03-10 23:41."""
    from billing.aggregation import aggregate_usage
    from billing.costs import missing_prices
    from billing.invoices import build_invoice
    from nvke.errors import Conflict

    first = datetime(2026, 3, 10, 23, 41, tzinfo=UTC)
    pool = world.pool(tenant_a, name="a100", cluster="infer", model=A100, gpus_per_node=1)
    world.hold(pool, world.make_host(A100, gpus=1), first, end=t(11, 1))
    aggregate_usage(tenant_a.id, *MARCH, now=NOW)
    detail = "no USD price for a100-sxm4-80gb (whole GPU) at 2026-03-10 23:41:00+00:00"

    (missing,) = missing_prices([tenant_a.id], *MARCH)
    assert (missing["code"], missing["gpu_model"], missing["at"]) == ("missing_price", A100, first)
    body = march_usage(owner, group_by="pool")
    (row,) = body["results"]
    assert (row["cost"], row["cost_error"]["detail"]) == (None, detail)
    assert row["cost_error"]["at"] == first.isoformat()
    assert body["totals"]["cost_error"]["detail"] == detail
    with pytest.raises(Conflict) as caught:
        build_invoice(tenant_a.id, "2026-03", now=NOW)
    assert (caught.value.code, str(caught.value.detail)) == ("missing_price", detail)
