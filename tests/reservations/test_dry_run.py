"""The node pool dry run answers capacity, quota left and hourly cost (values by hand).

Fleet: 16 H100 (2 simulated hosts x 8). Price sheet: list 2.50 USD per GPU-hour on-demand,
1.75 USD per reserved GPU-hour. Tenant A reserves 8 GPUs from now for 4 h (drain at the end).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from tests.reservations.conftest import MODEL, make_cluster, pool_body, reserve

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(owner, outsider, h100_fleet):
    from billing.prices import set_price

    set_price(
        gpu_model=MODEL,
        effective_from=timezone.now() - timedelta(days=1),
        hourly_rate=Decimal("2.50"),
        reservation_hourly_rate=Decimal("1.75"),
    )
    resp = reserve(owner, 8, end_action="drain")
    assert resp.status_code == 201, resp.content
    return {
        "reservation": resp.json(),
        "a": make_cluster(owner, "a"),
        "b": make_cluster(outsider, "b"),
    }


def dry(client, cluster, body):
    resp = client.post(f"/api/v1/clusters/{cluster}/nodepools?dry_run=true", body, format="json")
    assert resp.status_code == 200, resp.content
    return resp.json()


def test_on_demand_dry_run_reports_capacity_quota_and_cost(outsider, world):
    from nodepools.models import NodePool

    body = dry(outsider, world["b"], pool_body("p", 1, gpus=4))
    cap = body["capacity"]
    # free on-demand = C - D - R = 16 - 0 - 8 = 8 >= 4 needed
    assert (cap["placeable_now"], cap["needed_gpus"], cap["free_gpus"]) == (True, 4, 8)
    assert (cap["reserved_gpus"], cap["reservation_id"]) == (8, None)
    # quota: defaults 512 GPUs per model and 200 nodes, nothing reserved yet
    assert body["quota"] == {
        "fits": True,
        "gpus": {
            "gpu_model": MODEL,
            "limit": 512,
            "reserved": 0,
            "in_use": 0,
            "requested": 4,
            "left_after": 508,
        },
        "nodes": {"limit": 200, "reserved": 0, "in_use": 0, "requested": 1, "left_after": 199},
    }
    # cost: 4 GPUs x 2.50 USD = 10.00 USD per hour
    cost = body["cost"]
    assert (cost["basis"], cost["currency"], cost["gpus"]) == ("on-demand", "USD", 4)
    assert Decimal(str(cost["unit_price"])) == Decimal("2.50")
    assert Decimal(str(cost["hourly"])) == Decimal("10.00")
    assert NodePool.objects.count() == 0  # nothing written


def test_dry_run_says_from_when_reserved_gpus_come_back(outsider, world):
    body = dry(outsider, world["b"], pool_body("p", 2))  # 16 GPUs: 8 are reserved until end
    cap = body["capacity"]
    assert (cap["placeable_now"], cap["free_gpus"], cap["needed_gpus"]) == (False, 8, 16)
    end = world["reservation"]["end"]
    assert cap["placeable_from"].replace("Z", "+00:00") == end.replace("Z", "+00:00")
    assert "8 of 16 GPU(s) are reserved" in cap["message"]
    assert Decimal(str(body["cost"]["hourly"])) == Decimal("40.00")  # 16 x 2.50


def test_dry_run_on_a_reservation_names_it_and_costs_nothing_more_per_hour(owner, world):
    r = world["reservation"]
    body = dry(owner, world["a"], pool_body("p", 1, reservation=r["id"]))
    cap = body["capacity"]
    assert (cap["placeable_now"], cap["reservation_id"], cap["free_gpus"]) == (True, r["id"], 8)
    cost = body["cost"]
    assert cost["basis"] == "reservation"
    assert Decimal(str(cost["hourly"])) == 0  # usage inside the reservation is covered
    assert Decimal(str(cost["reservation_hourly"])) == Decimal("14.00")  # 8 x 1.75
    # the rate the invoice bills the reservation at, not the on-demand 2.50 (a fresh-user
    # trial's nvkectl read "reservation: 4 GPU-h per hour at 2.5 per GPU-hour")
    assert Decimal(str(cost["reservation_unit_price"])) == Decimal("1.75")


def test_dry_run_on_a_reservation_without_a_rate_says_none_instead_of_the_list_price(owner, world):
    from billing.models import Price

    Price.objects.filter(tenant__isnull=True).update(reservation_hourly_rate=None)
    r = world["reservation"]
    cost = dry(owner, world["a"], pool_body("p", 1, reservation=r["id"]))["cost"]
    assert cost["basis"] == "reservation"
    assert (cost["reservation_unit_price"], cost["reservation_hourly"]) == (None, None)
    assert Decimal(str(cost["hourly"])) == 0


def test_dry_run_on_a_cancelled_reservation_has_nothing_left_as_the_create_says(owner, world):
    r = world["reservation"]
    resp = owner.post(f"/api/v1/reservations/{r['id']}/cancel")
    assert resp.status_code == 200, resp.content
    cap = dry(owner, world["a"], pool_body("p", 1, reservation=r["id"]))["capacity"]
    # it showed free 8 of reserved 8 (found by the new-user trial), then reserved 8: a
    # cancelled reservation reserves nothing (found by the second trial)
    assert (cap["placeable_now"], cap["free_gpus"], cap["reserved_gpus"]) == (False, 0, 0)
    # named as nvkectl lists it, name and id (a trial read only the id)
    assert cap["message"] == f"reservation {r['name']} ({r['id']}) is CANCELLED"
    assert r["name"] == "r-" + r["id"].replace("-", "")[:8]
    created = owner.post(
        f"/api/v1/clusters/{world['a']}/nodepools",
        pool_body("p", 1, reservation=r["id"]),
        format="json",
    )
    assert (created.status_code, created.json()["code"]) == (409, "reservation_not_active")


def test_dry_run_on_a_future_reservation_says_from_its_start(owner, world):
    start = (timezone.now() + timedelta(hours=5)).replace(microsecond=0)
    later = reserve(owner, 4, start=start, hours=2)
    assert later.status_code == 201, later.content
    body = dry(owner, world["a"], pool_body("p", 1, gpus=4, reservation=later.json()["id"]))
    cap = body["capacity"]
    assert cap["placeable_now"] is False
    assert cap["placeable_from"].replace("Z", "+00:00") == start.isoformat()
    created = owner.post(
        f"/api/v1/clusters/{world['a']}/nodepools",
        pool_body("p", 1, gpus=4, reservation=later.json()["id"]),
        format="json",
    )
    assert (created.status_code, created.json()["code"]) == (409, "reservation_not_active")


def test_quota_left_goes_negative_in_the_dry_run_when_the_pool_would_exceed_it(
    outsider, tenant_b, world
):
    from tenants import quotas

    quotas.set_limits(tenant_b, max_gpus={MODEL: 6})
    body = dry(outsider, world["b"], pool_body("p", 1))
    assert body["quota"]["fits"] is False
    assert body["quota"]["gpus"]["left_after"] == 6 - 8


def test_dry_run_cost_of_a_shared_mig_pool_is_billed_by_the_instances_fraction(outsider, world):
    """Found by a new-user trial: a shared 1g.10gb pool was quoted a whole GPU per instance.
    By hand: 2 nodes x 3 instances of 1g.10gb (1 of 7 compute slices of an H100: 0.142857)
    = 0.857142 GPU-hours per hour x 2.50 USD = 2.142855 -> 2.14 USD per hour."""
    isolation = {"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"}
    body = dry(outsider, world["b"], pool_body("p", 2, gpus=3, isolation=isolation))
    cost = body["cost"]
    assert cost["gpus"] == 6
    assert Decimal(str(cost["gpu_hours_per_hour"])) == Decimal("0.857142")
    assert Decimal(str(cost["hourly"])) == Decimal("2.14")


@pytest.mark.parametrize(
    "query", ["dry_run=maybe", "dry_run=", "dry_run=true&dry_run=false", "dry_run=2"]
)
def test_a_mistyped_dry_run_is_400_and_creates_nothing(outsider, world, query):
    """Found by a new-user trial: ``?dry_run=maybe`` answered 202 and created the pool."""
    from clusters.models import Operation
    from nodepools.models import NodePool

    ops = Operation.objects.count()
    resp = outsider.post(
        f"/api/v1/clusters/{world['b']}/nodepools?{query}", pool_body("p", 1, gpus=4), format="json"
    )
    assert resp.status_code == 400, resp.content
    assert (resp.json()["code"], resp.json()["field"]) == ("invalid_boolean", "dry_run")
    assert (NodePool.objects.count(), Operation.objects.count()) == (0, ops)


@pytest.mark.parametrize(("value", "pools"), [("FALSE", 1), ("no", 1), ("Yes", 0), ("1", 0)])
def test_the_boolean_words_of_dry_run_still_work(outsider, world, value, pools):
    from nodepools.models import NodePool

    resp = outsider.post(
        f"/api/v1/clusters/{world['b']}/nodepools?dry_run={value}",
        pool_body("p", 1, gpus=4),
        format="json",
    )
    assert resp.status_code == (200 if pools == 0 else 202), resp.content
    assert NodePool.objects.count() == pools


def test_dry_run_without_a_price_names_the_missing_price(outsider, world, capsys):
    """No A100 price on the sheet: the dry run's cost is null with the usage API's cost_error
    (code missing_price, model, profile, currency), and nvkectl and the portal print that
    reason (it was "cost": null with no reason; nvkectl said "no price for this GPU model on
    the price sheet", naming no currency)."""
    from django.template.loader import render_to_string
    from nvkectl.reservations import print_dry_run

    body = dry(outsider, world["b"], {**pool_body("p", 1, gpus=1), "gpu_model": "a100-sxm4-80gb"})
    assert body["cost"] is None
    error = body["cost_error"]
    assert (error["code"], error["gpu_model"], error["mig_profile"], error["currency"]) == (
        "missing_price",
        "a100-sxm4-80gb",
        "",
        "USD",
    )
    assert error["detail"].startswith("no USD price for a100-sxm4-80gb (whole GPU) at ")
    print_dry_run(body)
    printed = capsys.readouterr().out
    assert f"cost: no price: {error['detail']}" in " ".join(printed.split())
    html = " ".join(render_to_string("portal/partials/dry_run.html", {"dry_run": body}).split())
    assert f"no cost: {error['detail']}" in html


def test_dry_run_on_a_reservation_without_room_quotes_no_covered_cost(owner, world, capsys):
    """A pool asking a reservation of 8 for 12 GPUs: the create answers 409
    reservation_exhausted (reserved 8, planned 0, needed 12), and the dry run quotes no cost
    "covered by the reservation" for GPUs it has no room for, but that same reason (issue 33;
    a fresh-user trial read 4 GPU-h per hour covered by a reservation of 2)."""
    r = world["reservation"]
    body = pool_body("p", 3, gpus=4, reservation=r["id"])
    answer = dry(owner, world["a"], body)
    assert answer["cost"] is None
    error = answer["cost_error"]
    assert (error["code"], error["reserved"], error["planned"], error["needed"]) == (
        "reservation_exhausted",
        8,
        0,
        12,
    )
    assert answer["capacity"]["placeable_now"] is False  # 8 left < 12 needed
    created = owner.post(f"/api/v1/clusters/{world['a']}/nodepools", body, format="json")
    assert (created.status_code, created.json()["code"]) == (409, "reservation_exhausted")
    assert created.json()["detail"] == error["detail"]
    # nvkectl and the portal say why, as no cost (not "no price": the price sheet is fine)
    from django.template.loader import render_to_string
    from nvkectl.reservations import print_dry_run

    print_dry_run(answer)
    assert f"cost: no cost: {error['detail']}" in " ".join(capsys.readouterr().out.split())
    html = " ".join(render_to_string("portal/partials/dry_run.html", {"dry_run": answer}).split())
    assert f"no cost: {error['detail']}" in html
    # what fits still gets its cost: 2 nodes x 4 = 8 GPUs, covered, at 0 more per hour
    before = timezone.now()
    fits = dry(owner, world["a"], pool_body("p", 2, gpus=4, reservation=r["id"]))
    assert "cost_error" not in fits and fits["cost"]["basis"] == "reservation"
    # placeable now on it: from now, as on demand (trial 5 read None, which means never), and
    # nvkectl says which "reserved" it is (the reservation's size, others' nodes apart)
    from nvkectl.reservations import capacity_line

    cap = fits["capacity"]
    assert cap["placeable_now"] is True
    assert before <= datetime.fromisoformat(cap["placeable_from"]) <= timezone.now()
    assert capacity_line(cap).startswith(
        "  needed 8 GPU(s), free 8, reservation of 8, held by other reservations 0, "
    )
