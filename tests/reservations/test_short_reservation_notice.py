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
