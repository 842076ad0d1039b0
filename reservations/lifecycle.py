"""Announcing, ending and cancelling reservations (beat: ``reservations.tasks.sweep_reservations``).

Each step is a guarded UPDATE (``… WHERE announced_at IS NULL``), so two sweeps running at
once (or a sweep and a cancel) announce and end each reservation exactly once; the signals are
sent in the same transaction as the UPDATE, so their receivers' writes (conditions, webhook
deliveries) commit with it or not at all.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from nvke.errors import Conflict
from tenants import audit

from .choices import ReservationState
from .models import Reservation
from .signals import reservation_ended, reservation_ending

#: the most reservations one sweep handles per step (the next sweep takes the rest)
BATCH = 200


def _announce(r: Reservation, now: datetime) -> bool:
    """Set ``announced_at`` once and send ``reservation_ending`` (inside the caller's
    transaction). False when someone else announced it first."""
    if not Reservation.objects.filter(pk=r.pk, announced_at__isnull=True).update(announced_at=now):
        return False
    r.announced_at = now
    reservation_ending.send(sender=Reservation, reservation=r)
    return True


def _end(r: Reservation, now: datetime) -> bool:
    """Set ``ended_at`` once and send ``reservation_ended(first=True)``."""
    if not Reservation.objects.filter(pk=r.pk, ended_at__isnull=True).update(ended_at=now):
        return False
    r.ended_at = now
    reservation_ended.send(sender=Reservation, reservation=r, first=True)
    return True


def _settle(r: Reservation, now: datetime) -> bool:
    """Ask the receivers to apply ``end_action``; settled (True) when none has pools left."""
    with transaction.atomic():
        left = sum(
            n
            for _, n in reservation_ended.send(sender=Reservation, reservation=r, first=False)
            if isinstance(n, int)
        )
        if left:
            return False
        return bool(
            Reservation.objects.filter(pk=r.pk, settled_at__isnull=True).update(settled_at=now)
        )


def sweep(now: datetime | None = None) -> dict[str, int]:
    """Announce reservations entering their notice lead, end those past their end, and
    settle ended ones (drain their pools). Idempotent. ``{"announced", "ended", "settled"}``."""
    now = now or timezone.now()
    counts = {"announced": 0, "ended": 0, "settled": 0}
    due = Reservation.objects.filter(
        end__isnull=False, announced_at__isnull=True, cancelled_at__isnull=True, end__gt=now
    ).order_by("end")[:BATCH]
    for r in due:
        if r.announce_at() > now:
            continue
        with transaction.atomic():
            counts["announced"] += _announce(r, now)
    ending = Reservation.objects.filter(ended_at__isnull=True).filter(
        Q(end__lte=now) | Q(cancelled_at__lte=now)
    )[:BATCH]
    for r in ending:
        with transaction.atomic():
            counts["ended"] += _end(r, now)
    for r in Reservation.objects.filter(ended_at__isnull=False, settled_at__isnull=True)[:BATCH]:
        counts["settled"] += _settle(r, now)
    return counts


def cancel_reservation(
    *, actor: str, reservation: Reservation, now: datetime | None = None
) -> Reservation:
    """Cancel a SCHEDULED or ACTIVE reservation now: its GPUs stop counting at ``now``
    (``cancelled_at``; billing stops there too, :mod:`billing.reservations`), and its end is
    processed at once, as at a normal end: announced (``reservation_ending``: the pools' condition
    ``ReservationEnding``, webhook ``reservation.ending``), ended (``reservation.ended``), and
    its pools then do what ``end_action`` says (``keep``: run on, billed on-demand from ``now``;
    ``drain``: scaled to zero, tried again by the sweep while their cluster is busy).

    Conflict (409, field ``id``): ``reservation_cancelled`` when it was cancelled already (a
    retry with the same ``Idempotency-Key`` gets the first answer instead),
    ``reservation_ended`` when it has ended. Writes the AuditEvent ``reservation.cancel``.
    """
    now = now or timezone.now()
    with transaction.atomic():
        r = Reservation.objects.select_for_update().get(pk=reservation.pk)
        state = r.state_at(now)
        if r.cancelled_at is not None:
            raise Conflict(
                f"reservation {r.id} was cancelled at {r.cancelled_at.isoformat()}",
                code="reservation_cancelled",
                extra={"state": state, "cancelled_at": r.cancelled_at.isoformat()},
            )
        if state == ReservationState.ENDED or r.ended_at is not None:
            end = r.effective_end()
            raise Conflict(
                f"reservation {r.id} ended at {end.isoformat() if end else r.ended_at}",
                code="reservation_ended",
                extra={"state": ReservationState.ENDED, "end": end.isoformat() if end else None},
            )
        Reservation.objects.filter(pk=r.pk).update(cancelled_at=now)
        r.cancelled_at = now
        audit.record(
            actor=actor,
            action="reservation.cancel",
            target_type="reservation",
            target_id=r.id,
            tenant_id=r.tenant_id,
            before={"state": state, "cancelled_at": None},
            after={"state": ReservationState.CANCELLED, "cancelled_at": now.isoformat()},
        )
        _announce(r, now)
        _end(r, now)
    _settle(r, now)
    r.refresh_from_db()
    return r
