"""Announcing and ending reservations (beat: ``reservations.tasks.sweep_reservations``).

Each step is a guarded UPDATE (``… WHERE announced_at IS NULL``), so two sweeps running at
once announce and end each reservation exactly once; the signals are sent in the same
transaction as the UPDATE, so their receivers' writes (conditions, webhook deliveries) commit
with it or not at all.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from .models import Reservation
from .signals import reservation_ended, reservation_ending

#: the most reservations one sweep handles per step (the next sweep takes the rest)
BATCH = 200


def sweep(now: datetime | None = None) -> dict[str, int]:
    """Announce reservations entering their notice lead, end those past their end, and
    settle ended ones (drain their pools). Idempotent. ``{"announced", "ended", "settled"}``."""
    now = now or timezone.now()
    counts = {"announced": 0, "ended": 0, "settled": 0}
    due = Reservation.objects.filter(
        end__isnull=False, announced_at__isnull=True, cancelled_at__isnull=True, end__gt=now
    ).order_by("end")[:BATCH]
    for r in due:
        if r.end - timedelta(seconds=r.notice_lead_s) > now:
            continue
        with transaction.atomic():
            if Reservation.objects.filter(pk=r.pk, announced_at__isnull=True).update(
                announced_at=now
            ):
                r.announced_at = now
                reservation_ending.send(sender=Reservation, reservation=r)
                counts["announced"] += 1
    ending = Reservation.objects.filter(ended_at__isnull=True).filter(
        Q(end__lte=now) | Q(cancelled_at__lte=now)
    )[:BATCH]
    for r in ending:
        with transaction.atomic():
            if Reservation.objects.filter(pk=r.pk, ended_at__isnull=True).update(ended_at=now):
                r.ended_at = now
                reservation_ended.send(sender=Reservation, reservation=r, first=True)
                counts["ended"] += 1
    for r in Reservation.objects.filter(ended_at__isnull=False, settled_at__isnull=True)[:BATCH]:
        with transaction.atomic():
            left = sum(
                n
                for _, n in reservation_ended.send(sender=Reservation, reservation=r, first=False)
                if isinstance(n, int)
            )
            if not left:
                Reservation.objects.filter(pk=r.pk, settled_at__isnull=True).update(settled_at=now)
                counts["settled"] += 1
    return counts
