"""Reservations under concurrency: 20 admissions race through separate PostgreSQL connections.

The fleet: 2 simulated hosts x 8 H100 in us-east-1a (16 GPUs). Twenty requests with
overlapping windows (3-5 GPUs each, 2-4 h long, starting 1-4 h from now) are released at once
behind a barrier. Afterwards the admitted set is checked *independently* of the service's
own arithmetic: at every instant (every window boundary) the reserved GPUs sum to at most
16, and every refused request would overflow some instant if added to the admitted set (the
admitted set only grows, so a request refused against a subset must overflow the full set).
With the advisory lock removed and every admission held between its read and its insert,
the same race overbooks, which shows the test tests the lock.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.helpers import race_outcome, run_at_once

pytestmark = pytest.mark.django_db(transaction=True)

CAPACITY = 16
MODEL = "h100-sxm5-80gb"


@pytest.fixture
def fleet(make_host, tenant_a, tenant_b):
    make_host(MODEL, gpus=8, zone="us-east-1a")
    make_host(MODEL, gpus=8, zone="us-east-1a")
    return [tenant_a, tenant_b]


def requests_of(now):
    base = (now + timedelta(hours=1)).replace(microsecond=0)
    out = []
    for i in range(20):
        start = base + timedelta(hours=i % 4)
        out.append(
            {
                "gpus": 3 + i % 3,
                "start": start,
                "end": start + timedelta(hours=2 + i % 3),
                # drain: the GPUs come back at the end (a keep reservation counts after its
                # end too, tested in test_admission.py)
                "end_action": "drain",
            }
        )
    return out


def race(tenants, *, barrier_inside: bool):
    """Admit the 20 requests at once; returns ``[(request, "ok" or the refusal's code)]``."""
    from reservations import admission

    now = timezone.now()
    asks = requests_of(now)

    def admit(i, wait):
        wait()
        admission.create_reservation(
            actor="test",
            tenant=tenants[i % 2],
            gpu_model=MODEL,
            region="us-east-1",
            now=now,
            **asks[i],
        )
        return "ok"

    hook = (admission, "_after_read") if barrier_inside else None
    outcomes = run_at_once(len(asks), admit, hook=hook)
    return [(ask, race_outcome(o)) for ask, o in zip(asks, outcomes, strict=True)]


def peak_by_hand(windows):
    """Largest sum of gpus over any instant, by a sweep over every boundary (independent of
    reservations.capacity)."""
    points = sorted({w["start"] for w in windows} | {w["end"] for w in windows})
    windows = [{k: w[k] for k in ("gpus", "start", "end")} for w in windows]
    return max(
        (sum(w["gpus"] for w in windows if w["start"] <= t < w["end"]) for t in points),
        default=0,
    )


def test_twenty_concurrent_reservations_never_overbook_any_instant(fleet):
    from reservations.models import Reservation

    results = race(fleet, barrier_inside=False)
    codes = sorted({code for _, code in results})
    assert codes == ["ok", "reservation_capacity"], results
    stored = [{"gpus": r.gpus, "start": r.start, "end": r.end} for r in Reservation.objects.all()]
    assert len(stored) == sum(1 for _, c in results if c == "ok")
    assert peak_by_hand(stored) <= CAPACITY
    refused = [ask for ask, code in results if code == "reservation_capacity"]
    assert refused  # 20 x 3-5 GPUs over 4 staggered hours cannot all fit in 16
    for ask in refused:  # refused for a reason: it overflows the final admitted set
        assert peak_by_hand([*stored, ask]) > CAPACITY, ask


def test_without_the_lock_the_same_race_overbooks(fleet, monkeypatch):
    from reservations import admission
    from reservations.models import Reservation

    monkeypatch.setattr(admission, "LOCK_ADMISSION", False)
    results = race(fleet, barrier_inside=True)
    assert all(code == "ok" for _, code in results), results
    stored = [{"gpus": r.gpus, "start": r.start, "end": r.end} for r in Reservation.objects.all()]
    assert peak_by_hand(stored) > CAPACITY
