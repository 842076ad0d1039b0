"""A fully idle pool's idle cost is what usage bills it, to the cent (issue 33; a fresh-user
trial of ``make run``): pool u4b, 4 H100s idle the whole window, read 0.381598 GPU-h and
0.95 USD in the usage API but an idle cost of 0.96 USD in the utilization API (4 x 0.24: each
GPU's cost rounded, then added).

Worked by hand. H = the start of the UTC hour two hours before now. One pool holds 4 H100s
(2.50 USD per GPU-hour) from H+10 min at 0 % utilization; usage aggregated at A = H+10 min +
343.44 s. Each GPU: 343.44 s = 0.0954 GPU-h x 2.50 = 0.2385 USD. The pool's usage line: 4 x
0.0954 = 0.3816 GPU-h x 2.50 = 0.954 -> 0.95 USD. Idle cost of the pool: one line too, 0.95
(was 0.96). The per-GPU rows share the line's 0.95 by the largest remainder: 0.23 each and
the 3 cents left to the first three rows: 0.24, 0.24, 0.24, 0.23 (add up to 0.95).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

pytestmark = pytest.mark.django_db

H100 = "h100-sxm5-80gb"


@pytest.fixture
def idle_pool(world, tenant_a, list_prices):
    from billing.aggregation import aggregate_usage
    from fleet.ingest import ingest_report

    h = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    start = h + timedelta(minutes=10)
    host = world.make_host(H100, gpus=4)
    gpus = list(host.gpus.order_by("index").values_list("uuid", flat=True))
    world.hold(world.pool(tenant_a, name="u4b", cluster="t", gpus_per_node=4), host, start)
    samples = [
        {
            "ts": (start + timedelta(minutes=2)).isoformat(),
            "gpu_uuid": gpu,
            "utilization_gpu_pct": 0,
            "memory_used_bytes": 2**30,
            "memory_total_bytes": 80 * 2**30,
        }
        for gpu in gpus
    ]
    ingest_report(host, {"seq": 1, "samples": samples}, now=start + timedelta(minutes=3))
    a = start + timedelta(seconds=343, microseconds=440000)
    aggregate_usage(tenant_a.id, h, a, now=a)
    return {"start": h.isoformat(), "end": (h + timedelta(hours=3)).isoformat()}


def test_a_fully_idle_pools_idle_cost_is_its_usage_cost(owner, idle_pool):
    usage = owner.get("/api/v1/usage", {**idle_pool, "group_by": "pool"}).json()
    (billed,) = usage["results"]
    assert (billed["gpu_hours"], billed["cost"]) == ("0.381600", {"USD": "0.95"})

    util = owner.get("/api/v1/utilization", {**idle_pool, "group_by": "pool"}).json()
    (group,) = util["groups"]
    assert (group["idle_gpu_hours"], group["idle_cost"]) == (
        "0.381600",
        {"USD": "0.95"},  # was 0.96: 4 x round(0.2385)
    )
    rows = [g["idle_cost"]["USD"] for g in util["idle_gpus"]]
    assert rows == ["0.24", "0.24", "0.24", "0.23"]  # was 4 x 0.24; they add up to 0.95
    assert util["cost_window"] == usage["totals"]["cost_window"]


def test_shares_add_up_to_the_line():
    from decimal import Decimal

    from billing.reports import _shares

    exact = {7: Decimal("0.2385"), 3: Decimal("0.2385"), 5: Decimal("0.2385"), 9: Decimal("0.2385")}
    assert _shares(Decimal("0.95"), exact, "USD") == {
        3: Decimal("0.24"),
        5: Decimal("0.24"),
        7: Decimal("0.24"),
        9: Decimal("0.23"),
    }
    # JPY has no minor unit: 3 rows of 33.4 yen, line 100 -> 34, 33, 33
    three = {1: Decimal("33.4"), 2: Decimal("33.4"), 3: Decimal("33.2")}
    assert _shares(Decimal("100"), three, "JPY") == {1: Decimal(34), 2: Decimal(33), 3: Decimal(33)}
