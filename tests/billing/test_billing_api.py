"""Usage, ledger, invoice and utilization endpoints: values, CSV, scoping, roles."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

pytestmark = pytest.mark.django_db

DEC_20 = datetime(2026, 12, 20, tzinfo=UTC)
DAY = datetime(2026, 10, 4, tzinfo=UTC)
WINDOW = {"start": "2026-10-01T00:00:00Z", "end": "2026-11-01T00:00:00Z"}


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.fixture
def billed(world, tenant_a, tenant_b, list_prices):
    """Tenant A: cluster train, pools h100 (8 GPUs, 2 h on 4 Nov) and a100 (2 GPUs, 3 h on
    4 Oct, 1 h on 5 Oct). Tenant B: 1 H100 for 1 h. October invoices built."""
    from billing.aggregation import aggregate_usage
    from billing.invoices import build_invoice

    h100 = world.pool(tenant_a, name="h100")
    a100 = world.pool(tenant_a, name="a100", model="a100-sxm4-80gb", gpus_per_node=2)
    world.hold(h100, world.make_host("h100-sxm5-80gb", gpus=8), DAY, DAY + timedelta(hours=2))
    world.hold(
        a100,
        world.make_host("a100-sxm4-80gb", gpus=2),
        DAY + timedelta(hours=21),
        DAY + timedelta(hours=25),
    )
    world.hold(
        world.pool(tenant_b),
        world.make_host("h100-sxm5-80gb", gpus=1),
        DAY,
        DAY + timedelta(hours=1),
    )
    for tenant in (tenant_a, tenant_b):
        aggregate_usage(tenant.id, utc(2026, 10, 1), utc(2026, 11, 1), now=DEC_20)
    return {
        "a": build_invoice(tenant_a.id, "2026-10", now=DEC_20),
        "b": build_invoice(tenant_b.id, "2026-10", now=DEC_20),
        "h100": h100,
        "a100": a100,
    }


def test_usage_grouped_by_pool_and_day(owner, billed):
    resp = owner.get("/api/v1/usage", {**WINDOW, "group_by": "pool,day"})
    assert resp.status_code == 200, resp.content
    body = resp.json()
    got = [(r["nodepool_name"], r["day"], r["gpu_hours"]) for r in body["results"]]
    assert sorted(got) == [
        ("a100", "2026-10-04", "6.000000"),  # 2 GPUs x 21:00-24:00
        ("a100", "2026-10-05", "2.000000"),  # 2 GPUs x 00:00-01:00
        ("h100", "2026-10-04", "16.000000"),  # 8 GPUs x 2 h
    ]
    assert body["totals"]["gpu_hours"] == "24.000000"  # tenant B's hour is not here


def test_usage_grouped_by_model_and_csv(owner, billed):
    by_model = owner.get("/api/v1/usage", {**WINDOW, "group_by": "model"}).json()["results"]
    assert [(r["gpu_model"], r["gpu_hours"]) for r in by_model] == [
        ("a100-sxm4-80gb", "8.000000"),
        ("h100-sxm5-80gb", "16.000000"),
    ]
    resp = owner.get("/api/v1/usage.csv", {**WINDOW, "group_by": "cluster"})
    assert resp["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(resp.content.decode())))
    assert [(r["cluster_name"], r["gpu_hours"]) for r in rows] == [("train", "24.000000")]


def test_operators_see_every_tenant_and_can_group_by_tenant(operator, billed, tenant_b):
    body = operator.get("/api/v1/usage", {**WINDOW, "group_by": "tenant"}).json()
    assert body["totals"]["gpu_hours"] == "25.000000"
    only_b = operator.get("/api/v1/usage", {**WINDOW, "tenant": str(tenant_b.id)}).json()
    assert only_b["totals"]["gpu_hours"] == "1.000000"


def test_tenants_cannot_group_by_tenant_and_bad_groups_are_400(owner, billed):
    resp = owner.get("/api/v1/usage", {**WINDOW, "group_by": "tenant"})
    assert resp.status_code == 400
    assert (resp.json()["code"], resp.json()["field"]) == ("invalid_group_by", "group_by")
    assert "tenant" not in resp.json()["valid_group_by"]


def test_invoice_list_detail_and_csv(owner, billed):
    listed = owner.get("/api/v1/invoices").json()["results"]
    a = billed["a"]
    detail = owner.get(f"/api/v1/invoices/{a.id}").json()
    got = [
        (ln["gpu_model"], ln["gpu_hours"], ln["unit_price"], ln["amount"]) for ln in detail["lines"]
    ]
    # a100 pool sorts before h100: 8 GPU-h x 1.80 = 14.40; 16 GPU-h x 2.50 = 40.00
    assert got == [
        ("a100-sxm4-80gb", "8.000000", "1.80", "14.40"),
        ("h100-sxm5-80gb", "16.000000", "2.50", "40.00"),
    ]
    assert detail["total"] == "54.40"
    assert [(i["number"], i["total"], i["status"]) for i in listed] == [
        (a.number, "54.40", "DRAFT")
    ]
    listing = list(csv.DictReader(io.StringIO(owner.get("/api/v1/invoices.csv").content.decode())))
    assert [(r["number"], r["total"], r["currency"]) for r in listing] == [
        (a.number, "54.40", "USD")
    ]
    one = owner.get(f"/api/v1/invoices/{a.id}.csv")
    assert one["Content-Disposition"] == f'attachment; filename="{a.number}.csv"'
    rows = list(csv.DictReader(io.StringIO(one.content.decode())))
    assert [(r["position"], r["amount"]) for r in rows] == [("1", "14.40"), ("2", "40.00")]


def test_another_tenants_invoice_is_404_like_a_missing_one(outsider, billed):
    a = billed["a"]
    missing = "00000000-0000-0000-0000-000000000000"
    for suffix in ("", ".csv"):
        foreign = outsider.get(f"/api/v1/invoices/{a.id}{suffix}")
        absent = outsider.get(f"/api/v1/invoices/{missing}{suffix}")
        assert foreign.status_code == absent.status_code == 404
        assert foreign.json() == absent.json()
    numbers = [i["number"] for i in outsider.get("/api/v1/invoices").json()["results"]]
    assert numbers == [billed["b"].number]


def test_only_operators_finalize(owner, operator, billed):
    a = billed["a"]
    assert owner.post(f"/api/v1/invoices/{a.id}/finalize").status_code == 403
    resp = operator.post(f"/api/v1/invoices/{a.id}/finalize")
    assert resp.status_code == 200, resp.content
    assert (resp.json()["status"], resp.json()["total"]) == ("FINALIZED", "54.40")
    again = operator.post(f"/api/v1/invoices/{a.id}/finalize")
    assert (again.status_code, again.json()["code"]) == (409, "invoice_finalized")


def test_ledger_list_and_csv_are_what_a_finance_user_recomputes_from(owner, billed):
    """Recompute the October invoice from the ledger CSV alone (rows clipped to the month,
    x fraction x price / 3600), line by line."""
    a = billed["a"]
    body = owner.get("/api/v1/ledger", {"cluster": str(billed["h100"].cluster_id)}).json()
    assert body["count"] == 10
    rows = list(csv.DictReader(io.StringIO(owner.get("/api/v1/ledger.csv").content.decode())))
    price = {"h100-sxm5-80gb": Decimal("2.50"), "a100-sxm4-80gb": Decimal("1.80")}
    per_pool: dict[str, Decimal] = {}
    for r in rows:
        start = max(datetime.fromisoformat(r["start"]), a.period_start)
        end = min(datetime.fromisoformat(r["end"]), a.period_end)
        seconds = Decimal(str((end - start).total_seconds())) * Decimal(r["billable_fraction"])
        per_pool[r["nodepool_id"]] = (
            per_pool.get(r["nodepool_id"], 0) + seconds * price[r["gpu_model"]] / 3600
        )
    expected = sorted(v.quantize(Decimal("0.01")) for v in per_pool.values())
    assert expected == sorted(ln.amount for ln in a.lines.all())


def test_utilization_weighted_by_gpu_hours_with_idle_gpus_and_their_cost(
    owner, world, tenant_a, list_prices
):
    """2 H100 held 10:00-12:00. GPU 0 at 80 % both hours, GPU 1 at 2 % (idle) both hours.
    Weighted utilization (80 x 2 + 2 x 2) / 4 = 41 %; memory 40 GiB of 80 GiB used -> 50 %
    headroom; GPU 1 idle 2 GPU-h x 2.50 = 5.00 USD."""
    from billing.aggregation import aggregate_usage
    from fleet.ingest import ingest_report

    host = world.make_host("h100-sxm5-80gb", gpus=2)
    g0, g1 = list(host.gpus.order_by("index").values_list("uuid", flat=True))
    start = utc(2026, 11, 9, 10)
    world.hold(world.pool(tenant_a), host, start, start + timedelta(hours=2))
    samples = [
        {
            "ts": (start + timedelta(minutes=m)).isoformat(),
            "gpu_uuid": gpu,
            "utilization_gpu_pct": util,
            "memory_used_bytes": 40 * 2**30,
            "memory_total_bytes": 80 * 2**30,
        }
        for m in (10, 70)
        for gpu, util in ((g0, 80), (g1, 2))
    ]
    ack = ingest_report(host, {"seq": 1, "samples": samples}, now=start + timedelta(hours=2))
    assert ack.samples_stored == 4
    # utilization counts the usage view's window: up to where the aggregated usage ends
    aggregate_usage(tenant_a.id, start, start + timedelta(hours=2), now=start + timedelta(hours=2))
    body = owner.get(
        "/api/v1/utilization",
        {"start": start.isoformat(), "end": (start + timedelta(hours=2)).isoformat()},
    ).json()
    (group,) = body["groups"]
    assert group["gpu_utilization_pct"] == "41.00"
    assert group["memory_headroom_pct"] == "50.00"
    assert group["allocated_gpu_hours"] == "4.000000"
    assert group["idle_gpu_hours"] == "2.000000"
    assert group["idle_cost"] == {"USD": "5.00"}
    assert [(g["gpu_uuid"], g["idle_hours"], g["idle_cost"]) for g in body["idle_gpus"]] == [
        (g1, "2.000000", {"USD": "5.00"})
    ]


def test_a_utilization_window_that_has_not_begun_is_empty_not_a_server_error(
    owner, world, tenant_a, list_prices
):
    """Found by the hostile-tenant probe: a window starting after now made the range inverted
    (PostgreSQL DataError, 500) in the API and the portal's usage page. A pool held from an
    hour ago is still running; tomorrow holds none of it."""
    from django.utils import timezone

    from billing.aggregation import aggregate_usage

    host = world.make_host("h100-sxm5-80gb", gpus=2)
    now = timezone.now().replace(microsecond=0)
    world.hold(world.pool(tenant_a), host, now - timedelta(hours=1), None)
    aggregate_usage(tenant_a.id, now - timedelta(hours=1), now, now=now)
    tomorrow = now + timedelta(days=1)
    response = owner.get(
        "/api/v1/utilization",
        {"start": tomorrow.isoformat(), "end": (tomorrow + timedelta(days=1)).isoformat()},
    )
    assert response.status_code == 200
    assert response.json()["groups"] == []
    assert response.json()["idle_gpus"] == []
    # the same window from the start of the hour the allocation began holds it (a start
    # inside an hour would move up to the next whole hour, as usage counts it)
    hour = (now - timedelta(hours=1)).replace(minute=0, second=0)
    body = owner.get(
        "/api/v1/utilization", {"start": hour.isoformat(), "end": tomorrow.isoformat()}
    ).json()
    (group,) = body["groups"]
    # 2 GPUs x 1 h: up to the aggregation at ``now``, where the usage view's cost window ends
    assert group["allocated_gpu_hours"] == "2.000000"
    assert body["cost_window"]["end"] == now.isoformat()
