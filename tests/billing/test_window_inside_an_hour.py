"""Usage and utilization cut a window bound inside an hour the same way (issue 33; a
fresh-user trial of ``make run``): pool idle4 was created at 04:21:05;
``usage?group_by=pool&end=…04:21:00Z`` still listed it (0.023147 GPU-h, 0.06 USD) under a
cost window ending 04:21:00, and p4 read 0.229687 GPU-h, while utilization with the same end
had no idle4 row and p4 allocated 0.200275. Usage counts the hourly records whose bucket
starts before ``end``; utilization clipped the ledger at ``end``.

Now both move a bound inside an hour to a whole hour (usage is stored by the hour), and
``start``, ``end`` and the cost window say so. Worked by hand. H = the start of the UTC hour
three hours before now. Pool p holds 1 H100 (2.50 USD per GPU-hour) from H; pool idle4 1 H100
from H+2h+21m05s; usage aggregated at H+2h+23m. ``end`` = H+2h+21m moves down to H+2h: p 2.0
GPU-h, 5.00 USD in both views (was 2.383333 in usage, 2.35 in utilization), idle4 in neither
(was 0.031944 GPU-h in usage). ``start`` = H+10m moves up to H+1h: p 1.0 GPU-h.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

pytestmark = pytest.mark.django_db

H100 = "h100-sxm5-80gb"


@pytest.fixture
def two_pools(world, tenant_a, list_prices):
    from billing.aggregation import aggregate_usage

    h = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    host = world.make_host(H100, gpus=2)
    g0, g1 = list(host.gpus.order_by("index").values_list("uuid", flat=True))
    world.hold(world.pool(tenant_a, name="p", cluster="t", gpus_per_node=1), host, h, gpus=[g0])
    late = h + timedelta(hours=2, minutes=21, seconds=5)
    world.hold(
        world.pool(tenant_a, name="idle4", cluster="t", gpus_per_node=1), host, late, gpus=[g1]
    )
    a = h + timedelta(hours=2, minutes=23)
    aggregate_usage(tenant_a.id, h, a, now=a)
    return h


def _views(client, params):
    usage = client.get("/api/v1/usage", {**params, "group_by": "pool"}).json()
    util = client.get("/api/v1/utilization", {**params, "group_by": "pool"}).json()
    billed = {r["nodepool_name"]: (r["gpu_hours"], r["cost"]) for r in usage["results"]}
    return usage, util, billed


def test_an_end_inside_an_hour_cuts_both_views_at_the_hour(owner, two_pools):
    h = two_pools
    end = (h + timedelta(hours=2, minutes=21)).isoformat()
    usage, util, billed = _views(owner, {"start": h.isoformat(), "end": end})
    # was {"p": ("2.383333", ...), "idle4": ("0.031944", ...)} under a window "ending" at end
    assert billed == {"p": ("2.000000", {"USD": "5.00"})}
    allocated = [g["allocated_gpu_hours"] for g in util["groups"]]
    assert allocated == ["2.000000"]  # was 2.350000: utilization clipped at end
    cut = (h + timedelta(hours=2)).isoformat()
    assert (usage["end"], util["end"]) == (cut, cut)
    window = {"start": h.isoformat(), "end": cut}
    assert usage["totals"]["cost_window"] == util["cost_window"] == window


def test_a_start_inside_an_hour_moves_up_to_the_next_hour(owner, two_pools):
    h = two_pools
    params = {
        "start": (h + timedelta(minutes=10)).isoformat(),
        "end": (h + timedelta(hours=2)).isoformat(),
    }
    usage, util, billed = _views(owner, params)
    assert billed == {"p": ("1.000000", {"USD": "2.50"})}  # was 2.000000: the hour H counted
    assert [g["allocated_gpu_hours"] for g in util["groups"]] == ["1.000000"]  # was 1.833333
    one = (h + timedelta(hours=1)).isoformat()
    assert usage["start"] == util["start"] == one
    assert usage["totals"]["cost_window"]["start"] == util["cost_window"]["start"] == one


def test_a_window_with_no_whole_hour_is_a_400_naming_end(owner, two_pools):
    h = two_pools
    params = {
        "start": (h + timedelta(minutes=10)).isoformat(),
        "end": (h + timedelta(minutes=50)).isoformat(),
    }
    for path in ("/api/v1/usage", "/api/v1/utilization"):
        r = owner.get(path, params)
        assert r.status_code == 400
        body = r.json()
        assert (body["code"], body["field"]) == ("invalid_time_range", "end")
