"""The reservations API: who may reserve, bounds (400 naming the field), the 409 that says
how much could be reserved, operators reserving for a tenant, and the calendar (by hand).

Fleet: 16 H100 in us-east-1a (2 simulated hosts x 8).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.reservations.conftest import MODEL, make_cluster, pool_body, reserve

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("change", "field", "code"),
    [
        ({"gpus": 0}, "gpus", None),
        ({"gpus": 100000}, "gpus", None),
        ({"gpu_model": "no-such-gpu"}, "gpu_model", "unknown_gpu_model"),
        ({"zone": "eu-west-1a"}, "zone", "zone_not_in_region"),
        ({"start": "2020-01-01T00:00:00+00:00"}, "start", "reservation_start_past"),
        ({"start": "2199-01-01T00:00:00+00:00", "end": None}, "start", "reservation_start_too_far"),
        ({"end_action": "explode"}, "end_action", None),
        ({"notice_lead_s": 10**9}, "notice_lead_s", None),
        ({"start": "yesterday"}, "start", None),
    ],
)
def test_bad_requests_are_400_naming_the_field(owner, h100_fleet, change, field, code):
    now = timezone.now()
    body = {
        "gpu_model": MODEL,
        "region": "us-east-1",
        "gpus": 4,
        "start": (now + timedelta(minutes=5)).isoformat(),
        "end": (now + timedelta(hours=5)).isoformat(),
        **change,
    }
    resp = owner.post("/api/v1/reservations", body, format="json")
    assert resp.status_code == 400, resp.content
    problem = resp.json()
    assert problem.get("field") == field or field in problem.get("errors", {}), problem
    if code:
        assert problem["code"] == code


def test_windows_too_short_or_too_long_name_the_end(owner, h100_fleet):
    short = reserve(owner, 1, hours=0.5)
    assert (short.status_code, short.json()["field"]) == (400, "end")
    assert short.json()["code"] == "reservation_too_short"
    long = reserve(owner, 1, hours=24 * 400)
    assert (long.json()["code"], long.json()["field"]) == ("reservation_too_long", "end")


def test_a_reservation_too_large_for_the_window_is_409_saying_what_is_left(owner, h100_fleet):
    assert reserve(owner, 10).status_code == 201
    # 16 GPUs, 10 reserved over the same window: at most 6 more
    resp = reserve(owner, 7)
    assert resp.status_code == 409
    body = resp.json()
    assert (body["code"], body["field"]) == ("reservation_capacity", "gpus")
    assert (body["capacity"], body["on_demand"], body["reserved_peak"], body["free"]) == (
        16,
        0,
        10,
        6,
    )
    assert reserve(owner, 6).status_code == 201


def test_viewers_and_members_cannot_reserve_operators_reserve_for_a_tenant(
    viewer, operator, tenant_a, tenant_b, h100_fleet
):
    from tests.conftest import _client, _key

    member = _client(_key(tenant_a, "member"))
    assert reserve(viewer, 1).status_code == 403
    assert reserve(member, 1).status_code == 403
    no_tenant = reserve(operator, 1)
    assert (no_tenant.status_code, no_tenant.json()["field"]) == (400, "tenant")
    made = reserve(operator, 2, tenant=str(tenant_b.id))
    assert made.status_code == 201, made.content
    assert made.json()["tenant_id"] == str(tenant_b.id)
    assert made.json()["created_by"].startswith("apikey:")


def test_a_tenant_cannot_reserve_for_another(owner, tenant_b, h100_fleet):
    resp = reserve(owner, 1, tenant=str(tenant_b.id))
    assert (resp.status_code, resp.json()["field"]) == (400, "tenant")


def test_lists_and_details_are_the_tenants_own(owner, outsider, h100_fleet):
    mine = reserve(owner, 2).json()
    theirs = reserve(outsider, 3).json()
    assert [r["id"] for r in owner.get("/api/v1/reservations").json()["results"]] == [mine["id"]]
    assert outsider.get(f"/api/v1/reservations/{mine['id']}").status_code == 404
    assert owner.get(f"/api/v1/reservations/{theirs['id']}").status_code == 404


def test_calendar_intervals_worked_by_hand(owner, outsider, h100_fleet):
    """From T (now, rounded up to the minute): A reserves 6 over [T+1h, T+3h) (drain) and
    B 4 over [T+2h, T+5h) (drain); window [T, T+6h):

    [T, T+1h) 0 reserved, 16 free; [T+1h, T+2h) 6, 10 free; [T+2h, T+3h) 10, 6 free;
    [T+3h, T+5h) 4, 12 free; [T+5h, T+6h) 0, 16 free."""
    t0 = (timezone.now() + timedelta(minutes=1)).replace(second=0, microsecond=0)
    h = timedelta(hours=1)
    assert reserve(owner, 6, start=t0 + h, hours=2, end_action="drain").status_code == 201
    assert reserve(outsider, 4, start=t0 + 2 * h, hours=3, end_action="drain").status_code == 201
    resp = owner.get(
        "/api/v1/reservations/calendar",
        {
            "gpu_model": MODEL,
            "region": "us-east-1",
            "start": t0.isoformat(),
            "end": (t0 + 6 * h).isoformat(),
        },
    )
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert (body["capacity"], body["on_demand"]) == (16, 0)
    got = [(i["reserved"], i["free"]) for i in body["intervals"]]
    assert got == [(0, 16), (6, 10), (10, 6), (4, 12), (0, 16)]
    too_long = owner.get(
        "/api/v1/reservations/calendar",
        {"gpu_model": MODEL, "region": "us-east-1", "end": (t0 + 100 * 24 * h).isoformat()},
    )
    assert (too_long.status_code, too_long.json()["field"]) == (400, "end")
    missing = owner.get("/api/v1/reservations/calendar", {"region": "us-east-1"})
    assert missing.status_code == 400


@pytest.mark.parametrize("zone", ["eu-west-1a", "us-west-2b", "us-east-2a"])
def test_a_calendar_of_a_zone_outside_the_region_is_400_naming_the_zone(owner, h100_fleet, zone):
    """Found by the re-probe: a zone of another region answered a calendar of 0 GPUs."""
    query = {"gpu_model": MODEL, "region": "us-east-1", "zone": zone}
    resp = owner.get("/api/v1/reservations/calendar", query)
    assert resp.status_code == 400, resp.content
    assert (resp.json()["field"], resp.json()["code"]) == ("zone", "zone_not_in_region")
    unknown = owner.get("/api/v1/reservations/calendar", {**query, "gpu_model": "h100"})
    assert (unknown.json()["field"], unknown.json()["code"]) == ("gpu_model", "unknown_gpu_model")
    inside = owner.get("/api/v1/reservations/calendar", {**query, "zone": "us-east-1a"})
    assert inside.status_code == 200, inside.content
    assert (inside.json()["zone"], inside.json()["capacity"]) == ("us-east-1a", 16)


def test_a_keep_reservation_counts_after_its_end_until_it_has_ended(owner, h100_fleet):
    """keep: its nodes may run on on-demand, so its 8 GPUs count after its end too; a
    reservation of 10 starting after the keep reservation's end therefore does not fit
    (16 - 8 = 8 < 10), while after a drain reservation it would."""
    t0 = timezone.now() + timedelta(minutes=1)
    assert reserve(owner, 8, start=t0, hours=2, end_action="keep").status_code == 201
    after = reserve(owner, 10, start=t0 + timedelta(hours=3), hours=2)
    assert (after.status_code, after.json()["free"]) == (409, 8)


def test_a_page_of_reservations_runs_as_many_queries_as_a_page_of_one(owner, h100_fleet):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for i in range(4):
        assert reserve(owner, 1, start=timezone.now() + timedelta(hours=i + 1)).status_code == 201
    owner.get("/api/v1/reservations")  # the key's last_used_at: written at most once a minute
    counts = []
    for limit in (1, 4):
        with CaptureQueriesContext(connection) as ctx:
            resp = owner.get("/api/v1/reservations", {"limit": limit})
        assert len(resp.json()["results"]) == limit
        assert all(r["used_gpus"] == 0 for r in resp.json()["results"])
        counts.append(len(ctx.captured_queries))
    # a page of 1 of 4 also counts the list; a page of 4 ends it, so its count is the rows
    # read (nvke/pagination.py): one query fewer, never one per row
    assert counts[0] == counts[1] + 1


def test_an_integer_where_a_uuid_belongs_is_400_not_looked_up(owner, operator, h100_fleet):
    """Found by a new-user trial: DRF's UUIDField turns ``5`` into
    00000000-0000-0000-0000-000000000005, so ``"reservation": 5`` answered "no reservation
    00000000-…-000000000005" and an operator's ``"tenant": 5`` "operators name the tenant"."""
    cluster_id = make_cluster(owner, "u")
    pool = owner.post(
        f"/api/v1/clusters/{cluster_id}/nodepools?dry_run=true",
        pool_body("p", 1, reservation=5),
        format="json",
    )
    assert pool.status_code == 400, pool.content
    assert pool.json()["field"] == "reservation"
    assert "Must be a valid UUID" in pool.json()["detail"]
    start = (timezone.now() + timedelta(hours=1)).isoformat()
    made = operator.post(
        "/api/v1/reservations",
        {
            "tenant": 5,
            "gpu_model": "h100-sxm5-80gb",
            "region": "us-east-1",
            "gpus": 1,
            "start": start,
        },
        format="json",
    )
    assert made.status_code == 400, made.content
    assert made.json()["field"] == "tenant"
    assert "Must be a valid UUID" in made.json()["detail"]


def test_a_reservation_made_without_a_name_is_named_after_its_id(owner, h100_fleet, capsys):
    """A fresh-user trial's unnamed reservation left blank labels (nvkectl's NAME, the console's
    "(reservation )", usage's reservation_name held the id): it is named ``r-`` + its id's
    first 8 hex digits, by hand from the id the API returns, and nvkectl's table shows it."""
    from nvkectl.output import Format, emit
    from nvkectl.reservations import COLUMNS, _row

    made = reserve(owner, 2)
    assert made.status_code == 201, made.content
    body = made.json()
    assert body["name"] == "r-" + body["id"].replace("-", "")[:8]
    named = reserve(owner, 2, name="train-q4").json()
    assert named["name"] == "train-q4"
    page = owner.get("/api/v1/reservations").json()["results"]
    assert {r["id"]: r["name"] for r in page} == {
        body["id"]: body["name"],
        named["id"]: "train-q4",
    }
    emit([_row(body)], COLUMNS, Format.table, raw=body)
    assert body["name"] in capsys.readouterr().out
