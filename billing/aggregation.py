"""Hourly usage records from the ledger, in SQL, idempotently (issue 7).

:func:`aggregate_usage` recomputes a tenant's :class:`~billing.models.UsageRecord` rows for a
window of whole local days: DELETE the window's records, INSERT the result of one SQL query
over the ledger, in one transaction under the tenant's account row lock. Running it twice, or
again after late ledger changes or late Xids, leaves exactly what one run on the current
ledger gives (nothing accumulates). Time before the account's ``closed_through`` (finalized
invoices) is frozen and skipped; corrections to it become adjustments on the next invoice.

The query (``_USAGE_SQL``): each ledger row of the tenant, clipped at ``now`` (an open row
counts up to now), is intersected with the buckets of :func:`billing.periods.bucket_bounds`
(temp table, B-tree on the start) and with the union of its SLA-credit intervals
(:mod:`billing.health`, ``range_agg``); per (cluster, pool, model, profile, bucket):

* ``gpu_seconds`` = sum of ``billable_fraction x seconds(row ∩ bucket)``
* ``allocated_seconds`` = sum of ``seconds(row ∩ bucket)``
* ``sla_credit_gpu_seconds`` = sum of ``billable_fraction x seconds(row ∩ bucket ∩ unhealthy)``
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

from .health import credit_intervals
from .models import BillingAccount, LedgerEntry, UsageRecord
from .periods import bucket_bounds, local_date, local_midnight
from .prices import price_cuts
from .reservations import reservation_cuts

_TEMP_TABLES = """
DROP TABLE IF EXISTS billing_tmp_buckets;
DROP TABLE IF EXISTS billing_tmp_credits;
DROP TABLE IF EXISTS billing_tmp_usage;
CREATE TEMP TABLE billing_tmp_buckets (s timestamptz PRIMARY KEY, e timestamptz NOT NULL)
    ON COMMIT DROP;
CREATE TEMP TABLE billing_tmp_credits (entry_id bigint, s timestamptz, e timestamptz)
    ON COMMIT DROP;
"""

_USAGE_SQL = """
CREATE TEMP TABLE billing_tmp_usage ON COMMIT DROP AS
WITH rows AS (
    SELECT l.id, l.cluster_id, l.nodepool_id, l.gpu_model, l.mig_profile,
           l.billable_fraction AS f,
           l.period * tstzrange(%(ws)s, LEAST(%(we)s, %(now)s), '[)') AS p
      FROM billing_ledgerentry l
     WHERE l.tenant_id = %(tenant)s
       AND l.period && tstzrange(%(ws)s, LEAST(%(we)s, %(now)s), '[)')
),
credits AS (
    SELECT entry_id, range_agg(tstzrange(s, e, '[)')) AS m
      FROM billing_tmp_credits GROUP BY entry_id
),
pieces AS (
    SELECT r.cluster_id, r.nodepool_id, r.gpu_model, r.mig_profile, b.s, b.e, r.f,
           tstzrange(GREATEST(lower(r.p), b.s), LEAST(upper(r.p), b.e), '[)') AS x,
           c.m
      FROM rows r
      JOIN billing_tmp_buckets b
        ON b.s >= lower(r.p) - interval '1 hour' AND b.s < upper(r.p) AND b.e > lower(r.p)
      LEFT JOIN credits c ON c.entry_id = r.id
     WHERE NOT isempty(r.p)
)
SELECT cluster_id, nodepool_id, gpu_model, mig_profile, s, e,
       SUM(f * EXTRACT(EPOCH FROM upper(x) - lower(x))) AS gpu_seconds,
       SUM(EXTRACT(EPOCH FROM upper(x) - lower(x))) AS allocated_seconds,
       SUM(CASE WHEN m IS NULL THEN 0 ELSE f * COALESCE((
           SELECT SUM(EXTRACT(EPOCH FROM upper(y) - lower(y)))
             FROM unnest(m * tstzmultirange(x)) AS y), 0) END) AS sla_credit_gpu_seconds
  FROM pieces
 WHERE NOT isempty(x)
 GROUP BY cluster_id, nodepool_id, gpu_model, mig_profile, s, e
"""

_STORE_SQL = """
DELETE FROM billing_usagerecord
 WHERE tenant_id = %(tenant)s AND start >= %(ws)s AND start < %(we)s;
INSERT INTO billing_usagerecord
       (tenant_id, cluster_id, nodepool_id, gpu_model, mig_profile, start, "end",
        gpu_seconds, allocated_seconds, sla_credit_gpu_seconds, computed_at)
SELECT %(tenant)s, cluster_id, nodepool_id, gpu_model, mig_profile, s, e,
       gpu_seconds, allocated_seconds, sla_credit_gpu_seconds, %(now)s
  FROM billing_tmp_usage;
"""


@dataclass(frozen=True)
class AggregationResult:
    """What one run wrote: the window ``[start, end)`` (UTC), record count, GPU-seconds."""

    start: datetime
    end: datetime
    records: int
    gpu_seconds: Decimal
    sla_credit_gpu_seconds: Decimal


def get_account(tenant_id, *, lock: bool = False) -> BillingAccount:
    """The tenant's billing account (created with UTC / USD on first use)."""
    BillingAccount.objects.get_or_create(tenant_id=tenant_id)
    qs = BillingAccount.objects.filter(tenant_id=tenant_id)
    return (qs.select_for_update() if lock else qs).get()


def time_zone_of(tenant_id) -> str:
    """The tenant's billing time zone (read only: ``UTC`` without an account, or for
    ``tenant_id`` None, an operator's view of every tenant)."""
    if tenant_id is None:
        return "UTC"
    tz = BillingAccount.objects.filter(tenant_id=tenant_id).values_list("time_zone", flat=True)
    return tz.first() or "UTC"


def day_window(tz: str, start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """``[start, end)`` widened to whole local days of ``tz`` (canonical bucket bounds)."""
    first = local_midnight(tz, local_date(tz, start))
    last_day = local_date(tz, end)
    last = local_midnight(tz, last_day)
    if last < end:
        last = local_midnight(tz, last_day + timedelta(days=1))
    return first, last


def compute_usage(tenant_id, tz: str, start: datetime, end: datetime, now: datetime) -> None:
    """Fill temp table ``billing_tmp_usage`` with the usage of ``[start, end)`` as of ``now``.

    Must run inside a transaction (temp tables drop on commit). ``start``/``end`` must be
    canonical bounds (local midnights) for the result to match stored records.
    """
    stop = min(end, now)
    cuts = sorted({*price_cuts(tenant_id, start, end), *reservation_cuts(tenant_id, start, end)})
    buckets = [b for b in bucket_bounds(tz, start, end, cuts)]
    buckets = [b for b in buckets if b[0] < stop]
    credits = credit_intervals(start=start, end=stop, tenant_id=tenant_id) if stop > start else []
    with connection.cursor() as cursor:
        cursor.execute(_TEMP_TABLES)
        if buckets:
            cursor.execute(
                "INSERT INTO billing_tmp_buckets (s, e)"
                " SELECT * FROM unnest(%s::timestamptz[], %s::timestamptz[])",
                [[s for s, _ in buckets], [e for _, e in buckets]],
            )
        if credits:
            cursor.execute(
                "INSERT INTO billing_tmp_credits (entry_id, s, e) SELECT * FROM"
                " unnest(%s::bigint[], %s::timestamptz[], %s::timestamptz[])",
                [
                    [c.entry_id for c in credits],
                    [c.start for c in credits],
                    [c.end for c in credits],
                ],
            )
        cursor.execute("ANALYZE billing_tmp_buckets")
        cursor.execute(_USAGE_SQL, {"tenant": tenant_id, "ws": start, "we": end, "now": now})


def aggregate_usage(
    tenant_id, start: datetime, end: datetime, now: datetime | None = None
) -> AggregationResult:
    """Recompute and store the tenant's usage records for ``[start, end)`` (whole local days).

    The window is widened to whole local days of the tenant's time zone and starts no earlier
    than the account's ``closed_through``. Idempotent; serialised per tenant by a row lock.
    """
    now = now or timezone.now()
    with transaction.atomic():
        account = get_account(tenant_id, lock=True)
        ws, we = day_window(account.time_zone, start, end)
        if account.closed_through is not None:
            ws = max(ws, account.closed_through)
        if we <= ws:
            return AggregationResult(ws, ws, 0, Decimal(0), Decimal(0))
        compute_usage(tenant_id, account.time_zone, ws, we, now)
        params = {"tenant": tenant_id, "ws": ws, "we": we, "now": now}
        with connection.cursor() as cursor:
            cursor.execute(_STORE_SQL, params)
            cursor.execute(
                "SELECT count(*), COALESCE(SUM(gpu_seconds), 0),"
                " COALESCE(SUM(sla_credit_gpu_seconds), 0) FROM billing_tmp_usage"
            )
            count, seconds, credit = cursor.fetchone()
    return AggregationResult(ws, we, count, Decimal(seconds), Decimal(credit))


def usage_complete_through(tenant_id, now: datetime) -> datetime:
    """Until when the tenant's stored usage records hold all its usage: its last aggregation
    (the records' ``computed_at``: each aggregation counts usage up to its own ``now``), or
    ``now`` when no allocation of the tenant overlaps the time since (nothing left to count).
    Never aggregated: the start of its first allocation (``now`` without one).

    Example: aggregated at 10:05, a node still running: 10:05 (the usage of 10:05-now is not
    in the records yet); its last node released at 10:00: ``now``."""
    last = UsageRecord.objects.filter(tenant_id=tenant_id).aggregate(t=Max("computed_at"))["t"]
    rows = LedgerEntry.objects.filter(tenant_id=tenant_id)
    if last is None:
        first = rows.order_by("period__startswith").values_list("period", flat=True).first()
        return min(first.lower, now) if first is not None else now
    if last >= now or not rows.filter(period__overlap=(last, now)).exists():
        return now
    return last


def tenants_with_usage(start: datetime, end: datetime) -> list:
    """Ids of tenants holding any ledger row that overlaps ``[start, end)``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT tenant_id FROM billing_ledgerentry"
            " WHERE period && tstzrange(%s, %s, '[)') ORDER BY tenant_id",
            [start, end],
        )
        return [row[0] for row in cursor.fetchall()]
