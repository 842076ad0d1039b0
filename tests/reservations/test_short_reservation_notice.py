"""A reservation shorter than its notice lead is not announced as ending at its start (issue
33 item 6): a 2-hour reservation with the default 24 h notice showed "ReservationEnding …
drained" from its first minute. Its end is now announced half-way (1 h in), a normal one
``notice_lead_s`` before its end."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 10, 8, tzinfo=UTC)


def _reservation(tenant, hours, lead_s):
    from reservations.models import Reservation

    return Reservation.objects.create(
        tenant=tenant,
        name=f"r{hours}",
        gpu_model_id="h100-sxm5-80gb",
        region="us-east-1",
        gpus=1,
        start=START,
        end=START + timedelta(hours=hours),
        end_action="drain",
        notice_lead_s=lead_s,
        created_at=START - timedelta(days=1),
    )


def test_a_two_hour_reservation_is_announced_half_way_not_at_its_start(catalog, tenant_a):
    from reservations.lifecycle import sweep

    r = _reservation(tenant_a, 2, 24 * 3600)
    assert r.announce_at() == START + timedelta(hours=1)
    assert sweep(now=START + timedelta(minutes=1))["announced"] == 0
    assert sweep(now=START + timedelta(minutes=59))["announced"] == 0
    assert sweep(now=START + timedelta(hours=1))["announced"] == 1


def test_a_long_reservation_keeps_its_full_notice(catalog, tenant_a):
    r = _reservation(tenant_a, 72, 24 * 3600)
    assert r.announce_at() == START + timedelta(hours=48)


def test_the_api_says_when_the_end_is_announced(catalog, owner, make_host):
    """A fresh-user trial read ``notice_lead_s: 86400`` on a 2-hour reservation whose end was
    announced half-way: the reservation now says when (``announce_at``), by the sweep's rule.
    By hand: 2 h from tomorrow 10:00 with 24 h notice -> 11:00; 72 h -> end - 24 h = start +
    48 h, 10:00 two days later."""
    from django.utils import timezone

    from tests.reservations.conftest import reserve

    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    day = timezone.now().date() + timedelta(days=1)
    start = datetime(day.year, day.month, day.day, 10, tzinfo=UTC)
    at_11 = f"{day.isoformat()}T11:00:00Z"
    two_days_later = f"{(day + timedelta(days=2)).isoformat()}T10:00:00Z"
    short = reserve(owner, 2, start=start, hours=2)
    assert short.status_code == 201, short.content
    body = short.json()
    assert (body["notice_lead_s"], body["announce_at"]) == (86400, at_11)
    long = reserve(owner, 2, start=start, hours=72).json()
    assert long["announce_at"] == two_days_later
    page = owner.get("/api/v1/reservations").json()
    listed = {r["id"]: r["announce_at"] for r in page["results"]}
    assert listed == {body["id"]: at_11, long["id"]: two_days_later}
    open_ended = reserve(owner, 2, start=start, hours=None).json()
    assert open_ended["announce_at"] is None
