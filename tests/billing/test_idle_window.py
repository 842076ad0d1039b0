"""Idle time is counted over the usage view's window (issue 33; a fresh-user trial of
``make run``): on the portal's /usage page cluster t3 showed 0.348 GPU-h and 1.15 USD, but its
utilization row an idle cost of 1.23 USD (an A10G: 0.039 idle GPU-h against 0.033385 billed).
Utilization counted up to now, usage up to the last aggregation, and the page did not say
which window the idle figures cover.

Worked by hand. H = the start of the UTC hour two hours before now. Tenant A's cluster ``t3``
holds 1 H100 (list 2.50 USD per GPU-hour) from H, still running, at 0 % utilization (samples at
H+10 and H+70 min); its usage was last aggregated at A = H+90 min. Usage: 1.5 GPU-h x 2.50 =
3.75 USD, cost window [H, A). Utilization used to count [H, now): two idle hours (H and H+1,
the second up to H+2h), 2 idle GPU-h and 5.00 USD idle cost (more than was billed). Now it
counts [H, A) too: allocated 1.5 GPU-h, idle 1.0 (hour H) + 0.5 (H+1, up to A) = 1.5 GPU-h,
idle cost 3.75 USD. Tenant B holds 1 H100 from H too, aggregated at H+2h: an operator sees A's
rows to A and B's to H+2h (each tenant's own window: 1.5 and 2.0 GPU-h, as usage bills), and
the earliest end, A, as the window.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from tests.portal.conftest import alice, alice_client, portal_user  # noqa: F401

pytestmark = pytest.mark.django_db

H100 = "h100-sxm5-80gb"


@pytest.fixture
def running(world, tenant_a, tenant_b, list_prices):
    from billing.aggregation import aggregate_usage
    from fleet.ingest import ingest_report

    h = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    host = world.make_host(H100, gpus=2)
    g0, g1 = list(host.gpus.order_by("index").values_list("uuid", flat=True))
    world.hold(world.pool(tenant_a, name="p", cluster="t3", gpus_per_node=1), host, h, gpus=[g0])
    world.hold(world.pool(tenant_b, name="q", cluster="b", gpus_per_node=1), host, h, gpus=[g1])
    samples = [
        {
            "ts": (h + timedelta(minutes=m)).isoformat(),
            "gpu_uuid": gpu,
            "utilization_gpu_pct": 0,
            "memory_used_bytes": 2**30,
            "memory_total_bytes": 80 * 2**30,
        }
        for m in (10, 70)
        for gpu in (g0, g1)
    ]
    ingest_report(host, {"seq": 1, "samples": samples}, now=h + timedelta(minutes=80))
    agg_a = h + timedelta(minutes=90)
    aggregate_usage(tenant_a.id, h, agg_a, now=agg_a)
    aggregate_usage(tenant_b.id, h, h + timedelta(hours=2), now=h + timedelta(hours=2))
    return {
        "h": h,
        "a": agg_a,
        "window": {"start": h.isoformat(), "end": (h + timedelta(hours=3)).isoformat()},
    }


def test_idle_time_never_exceeds_what_usage_bills(owner, running):
    h, a = running["h"], running["a"]
    usage = owner.get("/api/v1/usage", {**running["window"], "group_by": "cluster"}).json()
    (billed,) = usage["results"]
    assert (billed["cluster_name"], billed["gpu_hours"], billed["cost"]) == (
        "t3",
        "1.500000",
        {"USD": "3.75"},
    )
    assert usage["totals"]["cost_window"] == {"start": h.isoformat(), "end": a.isoformat()}

    util = owner.get("/api/v1/utilization", running["window"]).json()
    (group,) = util["groups"]
    assert (group["allocated_gpu_hours"], group["idle_gpu_hours"], group["idle_cost"]) == (
        "1.500000",  # was 2.000000 and more: counted to now
        "1.500000",  # was 2.000000
        {"USD": "3.75"},  # was 5.00 USD, more than the 3.75 USD billed
    )
    (idle,) = util["idle_gpus"]
    assert (idle["idle_hours"], idle["idle_cost"]) == ("1.500000", {"USD": "3.75"})
    assert util["cost_window"] == usage["totals"]["cost_window"]


def test_an_operator_counts_each_tenant_to_its_own_aggregation(
    operator, running, tenant_a, tenant_b
):
    h, a = running["h"], running["a"]
    util = operator.get("/api/v1/utilization", {**running["window"], "group_by": "tenant"}).json()
    allocated = {g["tenant_id"]: g["allocated_gpu_hours"] for g in util["groups"]}
    assert allocated == {str(tenant_a.id): "1.500000", str(tenant_b.id): "2.000000"}
    usage = operator.get("/api/v1/usage", {**running["window"], "group_by": "tenant"}).json()
    billed = {r["tenant_id"]: r["gpu_hours"] for r in usage["results"]}
    assert billed == allocated
    assert util["cost_window"] == usage["totals"]["cost_window"]
    assert util["cost_window"] == {"start": h.isoformat(), "end": a.isoformat()}


def test_the_portal_states_the_idle_window(alice_client, running):  # noqa: F811
    h, a = running["h"], running["a"]
    now = timezone.now()
    html = alice_client.get(
        "/usage", {"start": h.date().isoformat(), "end": now.date().isoformat()}
    ).content.decode()
    day = datetime.combine(h.date(), datetime.min.time(), UTC)
    span = f"from {day:%Y-%m-%d %H:%M} to {a:%Y-%m-%d %H:%M} UTC"
    assert f"The cost covers usage and reservations {span}." in html
    idle_window = re.search(r'<span id="idle-window">(.*?)</span>', html, re.S).group(1)
    assert (
        f"counted over the cost's window, {span} (up to the last usage aggregation)" in idle_window
    )
    table = re.search(r'id="utilization">(.*?)</table>', html, re.S).group(1)
    cells = re.findall(r"<td>(.*?)</td>", table)
    # cluster, allocated, measured, utilization, headroom, idle GPU-h, idle cost
    assert cells[0] == "t3" and cells[1] == "1.500" and cells[5] == "1.500"
    assert cells[6].startswith("3.75 USD")
    assert re.search(r'id="total-cost">([^<]*)<', html).group(1) == "3.75 USD"
    assert Decimal(cells[5]) <= Decimal(re.search(r'id="total-gpu-hours">([^<]*)<', html).group(1))
