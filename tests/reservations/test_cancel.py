"""Cancelling a reservation: its GPUs stop counting at once, its end is processed at once as
its ``end_action`` says (announced, ended, pools kept on-demand or drained), a second cancel
or a cancel of an ended one is a 409 with a code, and only owners/admins (or operators) may.

Fleet: 16 H100 (2 simulated hosts x 8). Tenant A reserves 8 from now for 4 h.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from tests.helpers import drive_pool
from tests.reservations.conftest import MODEL, make_cluster, pool_body, reserve

pytestmark = pytest.mark.django_db


def condition(pool, type_):
    return next((c for c in pool.conditions if c["type"] == type_), None)


def pool_on(owner, reservation, name="p"):
    cluster = make_cluster(owner, f"c-{name}")
    op = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        pool_body(name, 1, reservation=reservation["id"]),
        format="json",
    )
    assert op.status_code == 202, op.content
    drive_pool(op.json()["target_id"])
    return op.json()["target_id"]


def test_cancelling_a_keep_reservation_frees_its_count_and_its_pool_runs_on_demand(
    owner, h100_fleet, settings
):
    from nodepools.models import NodePool
    from reservations import capacity
    from tenants.models import AuditEvent
    from webhooks.models import WebhookDelivery

    settings.NVKE_WEBHOOK_ALLOW_HTTP = True
    settings.NVKE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    hook = owner.post(
        "/api/v1/webhooks",
        {
            "url": "http://127.0.0.1:9/hook",
            "event_types": ["reservation.ending", "reservation.ended"],
        },
        format="json",
    )
    assert hook.status_code == 201, hook.content
    r = reserve(owner, 8, end_action="keep").json()
    pool_id = pool_on(owner, r)
    before = capacity.on_demand_room(MODEL, "us-east-1", timezone.now())
    # 16 capacity, 0 on-demand, 8 reserved: unreserved pools may take 8
    assert (before.on_demand, before.reserved_peak, before.free) == (0, 8, 8)

    asked = timezone.now()
    resp = owner.post(f"/api/v1/reservations/{r['id']}/cancel")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["state"] == "CANCELLED"
    assert asked <= parse_datetime(body["cancelled_at"]) <= timezone.now()
    assert body["ended_at"] == body["cancelled_at"] == body["announced_at"]
    # nothing reserved any more; the pool's 8 GPUs run on-demand: 16 - 8 - 0 = 8 free
    after = capacity.on_demand_room(MODEL, "us-east-1", timezone.now())
    assert (after.capacity, after.on_demand, after.reserved_peak, after.free) == (16, 8, 0, 8)
    pool = NodePool.objects.get(pk=pool_id)
    assert pool.node_count == 1 and pool.nodes.filter(phase="READY").count() == 1
    ended = condition(pool, "ReservationEnded")
    assert ended["reason"] == "RunningOnDemand"
    assert body["cancelled_at"].replace("Z", "+00:00")[:19] in ended["message"]
    assert condition(pool, "ReservationEnding")["status"] == "False"
    event = AuditEvent.objects.get(action="reservation.cancel")
    assert (event.target_id, event.after["state"]) == (r["id"], "CANCELLED")
    # the end is announced and processed at once: one event of each, naming the cancellation
    events = {d.event_type: d.event["data"] for d in WebhookDelivery.objects.all()}
    assert sorted(events) == ["reservation.ended", "reservation.ending"]
    assert {e["id"] for e in events.values()} == {r["id"]}
    assert all(e["cancelled_at"] is not None for e in events.values())

    again = owner.post(f"/api/v1/reservations/{r['id']}/cancel")
    assert (again.status_code, again.json()["code"]) == (409, "reservation_cancelled")
    assert again.json()["cancelled_at"].replace("Z", "+00:00") == body["cancelled_at"].replace(
        "Z", "+00:00"
    )
    # a pool cannot draw from it any more
    cluster = make_cluster(owner, "late")
    late = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        pool_body("late", 1, gpus=1, reservation=r["id"]),
        format="json",
    )
    assert (late.status_code, late.json()["code"]) == (409, "reservation_not_active")
    assert late.json()["state"] == "CANCELLED"


def test_cancelling_a_drain_reservation_drains_its_pool_at_once(owner, h100_fleet):
    from fleet.models import Gpu
    from nodepools.models import NodePool

    r = reserve(owner, 8, end_action="drain").json()
    pool_id = pool_on(owner, r)
    resp = owner.post(f"/api/v1/reservations/{r['id']}/cancel")
    assert resp.status_code == 200, resp.content
    assert resp.json()["state"] == "CANCELLED"
    pool = NodePool.objects.get(pk=pool_id)
    assert pool.node_count == 0
    assert condition(pool, "ReservationEnded")["reason"] == "ReservationDrained"
    drive_pool(pool_id)
    assert not Gpu.objects.filter(holder_id__isnull=False).exists()
    from reservations.models import Reservation

    assert Reservation.objects.get(pk=r["id"]).settled_at is not None  # settled by the cancel


def test_a_scheduled_reservation_cancelled_before_its_start_never_counts(owner, h100_fleet):
    start = timezone.now() + timedelta(hours=2)
    r = reserve(owner, 16, start=start, end_action="drain").json()
    blocked = reserve(owner, 1, start=start)
    assert (blocked.status_code, blocked.json()["free"]) == (409, 0)
    resp = owner.post(f"/api/v1/reservations/{r['id']}/cancel")
    assert (resp.status_code, resp.json()["state"]) == (200, "CANCELLED")
    assert reserve(owner, 16, start=start).status_code == 201  # the whole fleet again


def test_an_ended_reservation_cannot_be_cancelled(owner, h100_fleet):
    from reservations.lifecycle import sweep
    from reservations.models import Reservation

    r = reserve(owner, 8, end_action="drain").json()
    now = timezone.now()
    Reservation.objects.filter(pk=r["id"]).update(
        start=now - timedelta(hours=4), end=now - timedelta(seconds=1)
    )
    sweep()
    resp = owner.post(f"/api/v1/reservations/{r['id']}/cancel")
    assert resp.status_code == 409
    assert resp.headers["Content-Type"].startswith("application/problem+json")
    assert (resp.json()["code"], resp.json()["state"]) == ("reservation_ended", "ENDED")


def test_who_may_cancel(owner, viewer, operator, tenant_a, h100_fleet):
    from tests.conftest import _client, _key

    r = reserve(owner, 4).json()
    member = _client(_key(tenant_a, "member"))
    for client in (viewer, member):
        resp = client.post(f"/api/v1/reservations/{r['id']}/cancel")
        assert (resp.status_code, resp.json()["code"]) == (403, "permission_denied")
    admin = _client(_key(tenant_a, "admin"))
    other = reserve(owner, 4).json()
    assert admin.post(f"/api/v1/reservations/{other['id']}/cancel").status_code == 200
    resp = operator.post(f"/api/v1/reservations/{r['id']}/cancel")
    assert (resp.status_code, resp.json()["state"]) == (200, "CANCELLED")
