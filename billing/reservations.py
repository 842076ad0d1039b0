"""Billing of capacity reservations (reservations/): reserved GPU-hours at the price sheet's
reservation rate, and the usage they cover, which USAGE lines then leave out.

* A reservation is billed for ``gpus x seconds([start, effective end) ∩ period)``, clipped
  at ``now`` for an open month (like usage), at the reservation rate in force
  (:func:`billing.prices.reservation_rate_segments`), used or not: one RESERVATION line per
  reservation and rate.
* The usage of a pool drawing from a reservation, *inside* the reservation's window, is
  covered: the invoice's USAGE lines leave it out (``billing_tmp_covered``). Usage outside
  the window (after a ``keep`` end) is on-demand usage like any other.
* Reservation bounds cut the hourly usage buckets (:func:`reservation_cuts`, beside the price
  cuts), so every usage record lies wholly inside or wholly outside each window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection
from django.db.models import Q

from nodepools.models import NodePool
from nvke.errors import Conflict
from reservations.models import Reservation

from .prices import reservation_rate_segments


def _reservations(tenant_id, start: datetime, end: datetime):
    return Reservation.objects.filter(tenant_id=tenant_id, start__lt=end).filter(
        Q(end__isnull=True) | Q(end__gt=start)
    )


def _window(r: Reservation, start: datetime, end: datetime) -> tuple[datetime, datetime]:
    lo = max(r.start, start)
    hi = min(t for t in (r.effective_end(), end) if t is not None)
    return lo, hi


def reservation_cuts(tenant_id, start: datetime, end: datetime) -> list[datetime]:
    """The tenant's reservation bounds inside ``(start, end)`` (bucket cuts)."""
    cuts = set()
    for r in _reservations(tenant_id, start, end):
        for t in (r.start, r.effective_end()):
            if t is not None and start < t < end:
                cuts.add(t)
    return sorted(cuts)


def fill_covered(tenant_id, start: datetime, end: datetime) -> None:
    """Temp table ``billing_tmp_covered (reservation_id, nodepool_id, s, e)``: the windows
    in which each reservation pool's usage is covered by its reservation."""
    rows = []
    pools = NodePool.objects.filter(
        tenant_id=tenant_id, reservation__in=_reservations(tenant_id, start, end)
    ).select_related("reservation")
    for pool in pools:
        lo, hi = _window(pool.reservation, start, end)
        if hi > lo:
            rows.append((pool.reservation_id, pool.id, lo, hi))
    with connection.cursor() as cursor:
        cursor.execute(
            "DROP TABLE IF EXISTS billing_tmp_covered;"
            "CREATE TEMP TABLE billing_tmp_covered (reservation_id uuid, nodepool_id uuid,"
            " s timestamptz, e timestamptz) ON COMMIT DROP"
        )
        if rows:
            cursor.execute(
                "INSERT INTO billing_tmp_covered SELECT * FROM unnest(%s::uuid[], %s::uuid[],"
                " %s::timestamptz[], %s::timestamptz[])",
                [
                    [r[0] for r in rows],
                    [r[1] for r in rows],
                    [r[2] for r in rows],
                    [r[3] for r in rows],
                ],
            )


#: usage records (``u``) not covered by a reservation (appended to the rating query)
NOT_COVERED = """
   AND NOT EXISTS (SELECT 1 FROM billing_tmp_covered c
                    WHERE c.nodepool_id = u.nodepool_id AND u.start >= c.s AND u.start < c.e)
"""


def covered_seconds(source_sql: str, params: dict) -> dict:
    """``{reservation_id: gpu_seconds}`` of the usage in ``source_sql`` that reservations
    cover (after :func:`fill_covered`)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT c.reservation_id, SUM(u.gpu_seconds - u.sla_credit_gpu_seconds)"
            f"  FROM ({source_sql}) u JOIN billing_tmp_covered c"
            f"    ON c.nodepool_id = u.nodepool_id AND u.start >= c.s AND u.start < c.e"
            f" GROUP BY c.reservation_id",
            params,
        )
        return {rid: secs for rid, secs in cursor.fetchall()}


@dataclass
class ReservationCharge:
    """Reserved GPU-seconds of one reservation at one reservation rate, in a period."""

    reservation: Reservation
    unit_price: Decimal
    source: str
    gpu_seconds: Decimal
    start: datetime
    end: datetime
    covered_gpu_seconds: Decimal


def _rate_stretches(tenant_id, currency: str, start: datetime, end: datetime):
    """``(reservation, rate segment)`` of each of the tenant's reservations over its part of
    ``[start, end)``, by reservation start, then time (``unit_price`` None: no rate)."""
    for r in _reservations(tenant_id, start, end).order_by("start", "id"):
        lo, hi = _window(r, start, end)
        if hi <= lo:
            continue
        for seg in reservation_rate_segments(
            tenant_id=tenant_id, currency=currency, gpu_model=r.gpu_model_id, start=lo, end=hi
        ):
            yield r, seg


def unpriced_reservations(tenant_id, currency: str, start: datetime, end: datetime) -> list[dict]:
    """The tenant's reservations with a stretch of ``[start, end)`` that has no reservation
    rate in ``currency`` (what :func:`reservation_charges` would raise
    ``missing_reservation_price`` on): ``[{"reservation_id", "reservation_name", "gpu_model",
    "at"}]``, ``at`` the first unpriced stretch's start."""
    out: dict = {}
    for r, seg in _rate_stretches(tenant_id, currency, start, end):
        if seg.unit_price is None and r.id not in out:
            out[r.id] = {
                "reservation_id": r.id,
                "reservation_name": r.name,
                "gpu_model": r.gpu_model_id,
                "at": seg.start,
            }
    return list(out.values())


def reservation_charges(
    tenant_id, currency: str, start: datetime, end: datetime, now: datetime, covered: dict
) -> list[ReservationCharge]:
    """What the tenant's reservations cost in ``[start, min(end, now))``. Conflict
    ``missing_reservation_price`` when a reserved stretch has no reservation rate."""
    out = []
    for r, seg in _rate_stretches(tenant_id, currency, start, min(end, now)):
        if seg.unit_price is None:
            raise Conflict(
                f"no {currency} reservation rate for {r.gpu_model_id} at {seg.start}",
                code="missing_reservation_price",
                extra={
                    "gpu_model": r.gpu_model_id,
                    "currency": currency,
                    "reservation": r.name,
                    "at": seg.start.isoformat(),
                },
            )
        seconds = Decimal(r.gpus) * Decimal(str((seg.end - seg.start).total_seconds()))
        out.append(
            ReservationCharge(
                r,
                seg.unit_price,
                seg.source,
                seconds,
                seg.start,
                seg.end,
                Decimal(covered.get(r.id, 0) or 0),
            )
        )
    return out
