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


def key_columns(params: dict, *, day_tz: str | None = None, tagged: bool = False):
    """The optional grouping columns of a rating of usage records ``u``: ``(day_sql, tag_sql,
    params)``. ``day_tz`` (an IANA zone): the bucket's local day, else NULL; ``tagged``: the
    source's own ``tag`` column (e.g. a ledger row id), else NULL."""
    day, tag = "NULL::date", "NULL::bigint"
    if day_tz is not None:
        day = "(u.start AT TIME ZONE %(day_tz)s)::date"
        params = {**params, "day_tz": day_tz}
    if tagged:
        tag = "u.tag"
    return day, tag, params


@dataclass(frozen=True)
class CoveredUsage:
    """Billable GPU-seconds (usage minus SLA credit) of one (cluster, pool, model, profile[,
    day][, tag]) that reservation ``reservation_id`` covers: no USAGE line bills them."""

    reservation_id: object
    cluster_id: object
    nodepool_id: object
    gpu_model: str
    mig_profile: str
    day: object
    tag: object
    gpu_seconds: Decimal


def covered_usage(
    source_sql: str, params: dict, *, day_tz: str | None = None, tagged: bool = False
) -> list[CoveredUsage]:
    """The usage in ``source_sql`` that reservations cover (after :func:`fill_covered`), by
    reservation and usage key (the local day with ``day_tz``, the source's ``tag`` with
    ``tagged``, as :func:`billing.invoices.rate_usage` groups)."""
    day, tag, params = key_columns(params, day_tz=day_tz, tagged=tagged)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT c.reservation_id, u.cluster_id, u.nodepool_id, u.gpu_model, u.mig_profile,"
            f"       {day}, {tag}, SUM(u.gpu_seconds - u.sla_credit_gpu_seconds)"
            f"  FROM ({source_sql}) u JOIN billing_tmp_covered c"
            f"    ON c.nodepool_id = u.nodepool_id AND u.start >= c.s AND u.start < c.e"
            f" GROUP BY 1, 2, 3, 4, 5, 6, 7",
            params,
        )
        return [CoveredUsage(*row[:7], Decimal(row[7])) for row in cursor.fetchall()]


def per_reservation(covered: list[CoveredUsage]) -> dict:
    """``{reservation_id: gpu_seconds}``: :func:`covered_usage` summed per reservation."""
    out: dict = {}
    for c in covered:
        out[c.reservation_id] = out.get(c.reservation_id, Decimal(0)) + c.gpu_seconds
    return out


def covered_seconds(source_sql: str, params: dict) -> dict:
    """``{reservation_id: gpu_seconds}`` of the usage in ``source_sql`` that reservations
    cover (after :func:`fill_covered`)."""
    return per_reservation(covered_usage(source_sql, params))


@dataclass
class ReservationCharge:
    """Reserved GPU-seconds of one reservation at one reservation rate, in a period."""

    reservation: Reservation
    #: None only in :func:`reservation_charges`' ``unpriced`` list (no reservation rate)
    unit_price: Decimal | None
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


def missing_reservation_rate(r: Reservation, currency: str, at: datetime) -> Conflict:
    """The Conflict ``missing_reservation_price`` (409) of reservation ``r`` with no reservation
    rate in ``currency`` from ``at``: what an invoice build raises, and the reason a view gives
    for a reservation it shows no cost for."""
    return Conflict(
        f"no {currency} reservation rate for {r.gpu_model_id} at {at}",
        code="missing_reservation_price",
        extra={
            "gpu_model": r.gpu_model_id,
            "currency": currency,
            "reservation": r.name,
            "at": at.isoformat(),
        },
    )


def reservation_charges(
    tenant_id,
    currency: str,
    start: datetime,
    end: datetime,
    now: datetime,
    covered: dict,
    *,
    unpriced: list[ReservationCharge] | None = None,
) -> list[ReservationCharge]:
    """What the tenant's reservations cost in ``[start, min(end, now))``. Conflict
    ``missing_reservation_price`` (:func:`missing_reservation_rate`) when a reserved stretch
    has no reservation rate; with an ``unpriced`` list, such a stretch is appended to it
    instead (``unit_price`` None) and the priced stretches are still returned."""
    out = []
    for r, seg in _rate_stretches(tenant_id, currency, start, min(end, now)):
        if seg.unit_price is None and unpriced is None:
            raise missing_reservation_rate(r, currency, seg.start)
        seconds = Decimal(r.gpus) * Decimal(str((seg.end - seg.start).total_seconds()))
        charge = ReservationCharge(
            r,
            seg.unit_price,
            seg.source,
            seconds,
            seg.start,
            seg.end,
            Decimal(covered.get(r.id, 0) or 0),
        )
        if seg.unit_price is None and unpriced is not None:
            unpriced.append(charge)
        else:
            out.append(charge)
    return out
