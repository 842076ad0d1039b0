"""The end of a reservation: announced ``notice_lead_s`` before (a ``reservation.ending``
webhook event, received and verified by a real HTTP receiver, and a ``ReservationEnding``
condition on the pools), then ``keep`` pools run on in place (on-demand from then on) and
``drain`` pools are scaled to zero, their GPUs released.

Fleet: 16 H100 (2 simulated hosts x 8). Tenant A reserves K = 8 (keep) and D = 8 (drain),
both from now for 4 h, announced 1 h before the end, with one 8-GPU pool on each.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.helpers import drive_pool
from tests.reservations.conftest import MODEL, make_cluster, pool_body, reserve
from tests.webhooks.receiver import Receiver, start

pytestmark = pytest.mark.django_db


@pytest.fixture
def loopback_allowed(settings):
    settings.NVKE_WEBHOOK_ALLOW_HTTP = True
    settings.NVKE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]


def condition(pool, type_):
    return next((c for c in pool.conditions if c["type"] == type_), None)


def test_end_is_announced_then_keep_pools_run_on_and_drain_pools_are_drained(
    owner, h100_fleet, loopback_allowed, django_capture_on_commit_callbacks
):
    from fleet.models import Gpu
    from nodepools.models import NodePool
    from reservations import capacity
    from reservations.lifecycle import sweep
    from reservations.models import Reservation
    from webhooks.models import WebhookDelivery
    from webhooks.tasks import deliver_webhook

    receiver = Receiver()
    server = start(receiver)
    try:
        hook = owner.post(
            "/api/v1/webhooks",
            {"url": receiver.url, "event_types": ["reservation.ending", "reservation.ended"]},
            format="json",
        )
        assert hook.status_code == 201, hook.content
        receiver.secrets = [hook.json()["secret"]]
        begin = timezone.now()
        keep = reserve(owner, 8, start=begin, notice_lead_s=3600, end_action="keep").json()
        drain = reserve(owner, 8, start=begin, notice_lead_s=3600, end_action="drain").json()
        cluster = make_cluster(owner)
        pools = {}
        for name, r in (("keep", keep), ("drain", drain)):
            op = owner.post(
                f"/api/v1/clusters/{cluster}/nodepools",
                pool_body(name, 1, reservation=r["id"]),
                format="json",
            ).json()
            drive_pool(op["target_id"])
            pools[name] = op["target_id"]
        end = Reservation.objects.get(pk=keep["id"]).end

        # 2 h before the end: outside the 1 h notice lead, nothing happens
        assert sweep(now=end - timedelta(hours=2)) == {"announced": 0, "ended": 0, "settled": 0}
        # 30 min before: both announced, once
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            assert sweep(now=end - timedelta(minutes=30))["announced"] == 2
        assert sweep(now=end - timedelta(minutes=29))["announced"] == 0
        ending = WebhookDelivery.objects.filter(event_type="reservation.ending")
        assert sorted(d.event["data"]["end_action"] for d in ending) == ["drain", "keep"]
        for name in ("keep", "drain"):
            cond = condition(NodePool.objects.get(pk=pools[name]), "ReservationEnding")
            assert cond["status"] == "True" and end.isoformat() in cond["message"], cond
        # the announcement reaches a real receiver, signed
        assert callbacks  # deliveries are enqueued on commit
        for delivery in ending:
            deliver_webhook(str(delivery.id))
        got = sorted(json.loads(r.body)["data"]["id"] for r in receiver.received)
        assert got == sorted([keep["id"], drain["id"]])
        assert all(r.verified_with == [0] for r in receiver.received)
        assert {json.loads(r.body)["type"] for r in receiver.received} == {
            "dev.nvke.reservation.ending"
        }
    finally:
        server.shutdown()

    # the end comes (the clock moved: the rows' windows are shifted into the past)
    now = timezone.now()
    Reservation.objects.update(start=now - timedelta(hours=4), end=now - timedelta(seconds=1))
    counts = sweep()
    assert (counts["ended"], counts["settled"]) == (2, 2)
    assert WebhookDelivery.objects.filter(event_type="reservation.ended").count() == 2

    kept = NodePool.objects.get(pk=pools["keep"])
    assert kept.node_count == 1 and kept.nodes.filter(phase="READY").count() == 1
    assert condition(kept, "ReservationEnded")["reason"] == "RunningOnDemand"
    assert condition(kept, "ReservationEnding")["status"] == "False"
    drained = NodePool.objects.get(pk=pools["drain"])
    assert drained.node_count == 0
    assert condition(drained, "ReservationEnded")["reason"] == "ReservationDrained"
    drive_pool(drained.id)
    assert not Gpu.objects.filter(holder_id__in=drained.nodes.values("id")).exists()
    # the kept pool's 8 GPUs now count as on-demand; nothing is reserved any more
    room = capacity.on_demand_room(MODEL, "us-east-1", timezone.now())
    assert (room.capacity, room.on_demand, room.reserved_peak, room.free) == (16, 8, 0, 8)
    assert sweep() == {"announced": 0, "ended": 0, "settled": 0}  # idempotent
