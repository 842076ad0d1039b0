"""Monthly invoices: usage lines, SLA-credit lines, adjustments; ``DRAFT -> FINALIZED``.

:func:`build_invoice` (idempotent) aggregates the tenant's month (in its time zone), rates the
usage records with the price versions in force (:mod:`billing.prices`) and writes one DRAFT
invoice with lines per cluster / node pool / GPU model / MIG profile / unit price:

* USAGE: ``gpu_seconds`` of the records, ``amount = round_half_even(gpu_seconds x price /
  3600)`` to the currency's minor unit (:func:`billing.money.line_amount`);
* SLA_CREDIT (its own line, negative): the credited part of the same usage at the same price,
  with the unhealthy intervals that explain it in ``details``;
* adjustments (``adjusts`` = an earlier FINALIZED invoice): that month recomputed from today's
  ledger and Xids, minus what was invoiced for it (its lines and earlier adjustments), per
  line key, so late data is billed once, in the next open invoice.

``total`` is the sum of the rounded line amounts. :func:`finalize_invoice` rebuilds the draft,
then freezes it (guarded UPDATE; a database trigger refuses any later change) and moves the
account's ``closed_through`` to the period's end.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.db import connection, transaction
from django.utils import timezone
from psycopg.types.range import Range

from clusters.models import Cluster
from nodepools.models import NodePool
from nvke.errors import Conflict

from .aggregation import aggregate_usage, compute_usage, get_account
from .health import credit_intervals
from .ledger import first_use
from .models import Invoice, InvoiceLine, InvoiceStatus, LedgerEntry, LineKind
from .money import format_rate, gpu_hours, line_amount
from .periods import Period, month_period, period_of
from .prices import RateSegment, rate_segments
from .reservations import (
    NOT_COVERED,
    ReservationCharge,
    covered_seconds,
    fill_covered,
    key_columns,
    reservation_charges,
)
from .signals import invoice_finalized

#: Finalized invoices older than this are not re-checked for adjustments.
ADJUSTMENT_LOOKBACK = timedelta(days=400)

#: the tenant's stored usage records whose bucket starts in ``[ps, pe)``
RECORDS = """
SELECT cluster_id, nodepool_id, gpu_model, mig_profile, start, gpu_seconds,
       sla_credit_gpu_seconds
  FROM billing_usagerecord
 WHERE tenant_id = %(tenant)s AND start >= %(ps)s AND start < %(pe)s
"""
_RECOMPUTED = """
SELECT cluster_id, nodepool_id, gpu_model, mig_profile, s AS start, gpu_seconds,
       sla_credit_gpu_seconds
  FROM billing_tmp_usage
"""
_RATE_SQL = """
SELECT u.cluster_id, u.nodepool_id, u.gpu_model, u.mig_profile, r.unit_price,
       string_agg(DISTINCT r.source, '; '), SUM(u.gpu_seconds), SUM(u.sla_credit_gpu_seconds),
       min(u.start), {day}, {tag}
  FROM ({source}) u
  JOIN billing_tmp_rates r
    ON r.gpu_model = u.gpu_model AND r.mig_profile = u.mig_profile
   AND u.start >= r.s AND u.start < r.e
 WHERE TRUE {not_covered}
 GROUP BY u.cluster_id, u.nodepool_id, u.gpu_model, u.mig_profile, r.unit_price, 10, 11
"""

#: the codes of an invoice build that fails until an operator adds a price
UNPRICEABLE = ("missing_price", "missing_reservation_price")


@dataclass
class RatedKey:
    """Usage of one (cluster, pool, model, profile, unit price) in a period; ``unit_price``
    None only in :func:`rate_usage`'s ``unpriced`` list (usage with no price)."""

    cluster_id: uuid.UUID
    nodepool_id: uuid.UUID
    gpu_model: str
    mig_profile: str
    unit_price: Decimal | None
    source: str
    gpu_seconds: Decimal
    credit_gpu_seconds: Decimal
    first_start: datetime
    details: list[dict] = field(default_factory=list)
    #: the local day of the usage when rated ``by_day`` (else None)
    day: date | None = None
    #: the source's ``tag`` when rated ``tagged`` (e.g. a ledger row id; else None)
    tag: int | None = None

    @property
    def key(self) -> tuple:
        return (
            self.cluster_id,
            self.nodepool_id,
            self.gpu_model,
            self.mig_profile,
            self.unit_price,
        )


def invoice_number(tenant_id: uuid.UUID, label: str) -> str:
    """``NVKE-YYYYMM-XXXXXXXX`` (the tenant id's first 8 hex digits)."""
    return f"NVKE-{label.replace('-', '')}-{uuid.UUID(str(tenant_id)).hex[:8].upper()}"


def missing_price(model: str, profile: str, currency: str, at: datetime) -> Conflict:
    """The Conflict ``missing_price`` (409) of usage of (model, profile) with no price in
    ``currency`` from ``at``: what an invoice build raises, and the reason a view gives for
    usage it shows no cost for."""
    return Conflict(
        f"no {currency} price for {model} {profile or '(whole GPU)'} at {at}",
        code="missing_price",
        extra={
            "gpu_model": model,
            "mig_profile": profile,
            "currency": currency,
            "at": at.isoformat(),
        },
    )


def rate_usage(
    tenant_id,
    currency: str,
    period: Period,
    source_sql: str,
    params: dict,
    now: datetime,
    *,
    day_tz: str | None = None,
    tagged: bool = False,
    unpriced: list[RatedKey] | None = None,
) -> list[RatedKey]:
    """Group ``source_sql``'s usage records (bucket starts in ``period``) by line key and the
    unit price in force at each bucket's start, leaving out usage a reservation covers: the
    invoice's USAGE and SLA_CREDIT lines, and every other view of what usage costs
    (:mod:`billing.costs`, the idle cost of :mod:`billing.reports`). ``day_tz`` (an IANA zone)
    also groups by the local day of the bucket (``RatedKey.day``); ``tagged`` by the source's
    ``tag`` column (``RatedKey.tag``). Must run inside a transaction (temporary tables).

    Usage with no price in ``currency``: Conflict :func:`missing_price` (409, naming the model,
    profile, currency and the time of its first usage, :func:`billing.ledger.first_use`), the
    invoice's rule; with an ``unpriced`` list, its keys are appended there instead
    (``unit_price`` None) and the priced keys are still returned."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT DISTINCT gpu_model, mig_profile FROM ({source_sql}) u", params)
        pairs = {(m, p) for m, p in cursor.fetchall()}
    segments = rate_segments(
        tenant_id=tenant_id, currency=currency, pairs=pairs, start=period.start, end=period.end
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "DROP TABLE IF EXISTS billing_tmp_rates;"
            "CREATE TEMP TABLE billing_tmp_rates (gpu_model text, mig_profile text,"
            " s timestamptz, e timestamptz, unit_price numeric, source text) ON COMMIT DROP"
        )
        if segments:
            cursor.execute(
                "INSERT INTO billing_tmp_rates SELECT * FROM unnest(%s::text[], %s::text[],"
                " %s::timestamptz[], %s::timestamptz[], %s::numeric[], %s::text[])",
                [
                    [s.gpu_model for s in segments],
                    [s.mig_profile for s in segments],
                    [s.start for s in segments],
                    [s.end for s in segments],
                    [s.unit_price for s in segments],
                    [s.source for s in segments],
                ],
            )
        fill_covered(tenant_id, period.start, period.end)
        day, tag, params = key_columns(params, day_tz=day_tz, tagged=tagged)
        cursor.execute(
            _RATE_SQL.format(source=source_sql, not_covered=NOT_COVERED, day=day, tag=tag),
            params,
        )
        rows = cursor.fetchall()
    rated = []
    for cluster, pool, model, profile, price, source, seconds, credit, first, on, tg in rows:
        key = RatedKey(
            cluster, pool, model, profile, price, source, seconds, credit, first, day=on, tag=tg
        )
        if price is None:
            if not seconds:
                continue
            # name the first usage the missing price stops, not its hour bucket's start
            hour = first.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
            first = (
                first_use(
                    tenant_id, model, profile, first, hour, cluster_id=cluster, nodepool_id=pool
                )
                or first
            )
            key.first_start = first
            if unpriced is None:
                raise missing_price(model, profile, currency, first)
            unpriced.append(key)
            continue
        rated.append(key)
    _attach_credit_details(tenant_id, period, rated, segments, now)
    return rated


def _attach_credit_details(
    tenant_id, period: Period, rated: list[RatedKey], segments: list[RateSegment], now: datetime
) -> None:
    """Credit lines' ``details``: merged unhealthy intervals per ledger row, clipped to the
    period and to the line's price segments, with the Xid that opened them."""
    with_credit = [r for r in rated if r.credit_gpu_seconds]
    if not with_credit:
        return
    intervals = credit_intervals(start=period.start, end=period.end, tenant_id=tenant_id)
    entries = LedgerEntry.objects.in_bulk({c.entry_id for c in intervals})
    merged: dict[int, list[list]] = defaultdict(list)
    for c in sorted(intervals, key=lambda c: (c.entry_id, c.start)):
        row = entries[c.entry_id]
        lo = max(c.start, row.period.lower, period.start)
        hi = min(x for x in (c.end, row.period.upper, period.end, now) if x is not None)
        if hi <= lo:
            continue
        spans = merged[c.entry_id]
        if spans and lo <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], hi)
            continue
        spans.append([lo, hi, c])
    for entry_id, spans in merged.items():
        row = entries[entry_id]
        for target in with_credit:
            if (row.cluster_id, row.nodepool_id, row.gpu_model, row.mig_profile) != target.key[:4]:
                continue
            for seg in segments:
                if (seg.gpu_model, seg.mig_profile) != target.key[2:4]:
                    continue
                if seg.unit_price != target.unit_price:
                    continue
                for lo, hi, why in spans:
                    s, e = max(lo, seg.start), min(hi, seg.end)
                    if e <= s:
                        continue
                    target.details.append(
                        {
                            "gpu_uuid": row.gpu_uuid,
                            "mig_gpu_instance_id": row.mig_gpu_instance_id,
                            "ledger_entry_id": str(row.public_id),
                            "xid": why.xid,
                            "health_interval_id": why.interval_id,
                            "xid_gpu_uuid": why.xid_gpu_uuid,
                            "scope": why.scope,
                            "start": s.isoformat(),
                            "end": e.isoformat(),
                            "gpu_seconds": str(
                                row.billable_fraction * Decimal((e - s).total_seconds())
                            ),
                        }
                    )


def _names(rated: list[RatedKey]) -> tuple[dict, dict]:
    clusters = dict(
        Cluster.objects.filter(id__in={r.cluster_id for r in rated}).values_list("id", "name")
    )
    pools = dict(
        NodePool.objects.filter(id__in={r.nodepool_id for r in rated}).values_list("id", "name")
    )
    return clusters, pools


def _what(r: RatedKey, clusters: dict, pools: dict) -> str:
    profile = f"MIG {r.mig_profile}" if r.mig_profile else "whole GPU"
    cluster = clusters.get(r.cluster_id, r.cluster_id)
    return f"{cluster} / {pools.get(r.nodepool_id, r.nodepool_id)} / {r.gpu_model} ({profile})"


def _adjustments(
    tenant_id, tz: str, currency: str, period: Period, now: datetime
) -> list[tuple[Invoice, RatedKey, LineKind, Decimal, Decimal]]:
    """``[(finalized invoice, key, kind, gpu_seconds diff, amount diff)]`` for late changes."""
    out = []
    earlier = Invoice.objects.filter(
        tenant_id=tenant_id,
        status=InvoiceStatus.FINALIZED,
        period_end__lte=period.start,
        period_start__gte=period.start - ADJUSTMENT_LOOKBACK,
    ).order_by("period_start")
    for old in earlier:
        old_period = Period(old.period_label, old.period_start, old.period_end)
        compute_usage(tenant_id, tz, old.period_start, old.period_end, now)
        rated = rate_usage(tenant_id, currency, old_period, _RECOMPUTED, {}, now)
        truth: dict[tuple, tuple[Decimal, Decimal, RatedKey]] = {}
        for r in rated:
            truth[(LineKind.USAGE, *r.key)] = (
                r.gpu_seconds,
                line_amount(r.gpu_seconds, r.unit_price, currency),
                r,
            )
            if r.credit_gpu_seconds:
                truth[(LineKind.SLA_CREDIT, *r.key)] = (
                    -r.credit_gpu_seconds,
                    -line_amount(r.credit_gpu_seconds, r.unit_price, currency),
                    r,
                )
        billed: dict[tuple, tuple[Decimal, Decimal]] = defaultdict(lambda: (Decimal(0), Decimal(0)))
        lines = (
            InvoiceLine.objects.filter(invoice__status=InvoiceStatus.FINALIZED).filter(
                invoice=old, adjusts__isnull=True
            )
            | InvoiceLine.objects.filter(invoice__status=InvoiceStatus.FINALIZED, adjusts=old)
        ).exclude(kind=LineKind.RESERVATION)  # reserved hours are fixed: never adjusted
        for line in lines:
            key = (
                line.kind,
                line.cluster_id,
                line.nodepool_id,
                line.gpu_model,
                line.mig_profile,
                line.unit_price,
            )
            secs, amount = billed[key]
            billed[key] = (secs + line.gpu_seconds, amount + line.amount)
        for key in sorted(set(truth) | set(billed), key=str):
            t_secs, t_amount, r = truth.get(key, (Decimal(0), Decimal(0), None))
            b_secs, b_amount = billed.get(key, (Decimal(0), Decimal(0)))
            if t_secs == b_secs and t_amount == b_amount:
                continue
            if r is None:
                r = RatedKey(*key[1:6], "", Decimal(0), Decimal(0), old.period_start)
            out.append((old, r, key[0], t_secs - b_secs, t_amount - b_amount))
    return out


def tenant_existed_in(period: Period, since: datetime) -> bool:
    """True when the tenant existed during some of ``[period.start, period.end)``, ``since``
    being :func:`tenant_since`: a month that ends at or before it has nothing to bill (an empty
    invoice for it would only be noise). Example: a tenant created 2026-11-03 10:00 UTC (zone
    UTC) existed in 2026-11, not in 2026-10 (which ends 2026-11-01 00:00 UTC)."""
    return period.end > since


def tenant_since(tenant_id) -> datetime | None:
    """Since when the tenant exists, for billing: its creation, or its first allocation (the
    ledger's earliest start) or the start of its first capacity reservation when earlier
    (usage or reserved capacity recorded from before the tenant row was made is still billed).
    None when the tenant is gone."""
    from reservations.models import Reservation
    from tenants.models import Tenant

    created = Tenant.objects.filter(pk=tenant_id).values_list("created_at", flat=True).first()
    if created is None:
        return None
    first = (
        LedgerEntry.objects.filter(tenant_id=tenant_id)
        .order_by("period__startswith")
        .values_list("period", flat=True)
        .first()
    )
    reserved = (
        Reservation.objects.filter(tenant_id=tenant_id)
        .order_by("start")
        .values_list("start", flat=True)
        .first()
    )
    return min(d for d in (created, first.lower if first else None, reserved) if d is not None)


def build_invoice(tenant_id, label: str, now: datetime | None = None) -> Invoice:
    """Build (or rebuild) the tenant's DRAFT invoice for month ``label`` (``YYYY-MM``, local).

    A FINALIZED invoice of that month is returned unchanged. Raises Conflict ``missing_price``
    when usage has no price in the tenant's currency (``missing_reservation_price``: a
    reservation without a reservation rate), Conflict ``period_before_tenant`` when the month
    ended before the tenant was created (:func:`tenant_existed_in`).

    A rebuild that fails for a missing price leaves the DRAFT as it was, but marks it
    (``Invoice.build_error``, :func:`mark_build_failed`): its lines are stale and it cannot be
    finalized until a rebuild succeeds, which clears the mark.
    """
    now = now or timezone.now()
    try:
        return _build_invoice(tenant_id, label, now)
    except Conflict as exc:
        if exc.code in UNPRICEABLE:
            mark_build_failed(tenant_id, label, exc, now)
        raise


def mark_build_failed(tenant_id, label: str, exc: Conflict, now: datetime) -> None:
    """Record on the tenant's DRAFT of month ``label`` that its latest rebuild failed:
    ``build_error`` = ``{"code", "detail", "failed_at", …the Conflict's extra (gpu_model,
    mig_profile, currency, at)}``. Written outside the failed build's transaction; a no-op
    when there is no draft (nothing stale to warn about)."""
    account = get_account(tenant_id)
    period = month_period(account.time_zone, label)
    Invoice.objects.filter(
        tenant_id=tenant_id, period_start=period.start, status=InvoiceStatus.DRAFT
    ).update(
        build_error={
            "code": exc.code,
            "detail": str(exc.detail),
            "failed_at": now.isoformat(),
            **{k: str(v) for k, v in exc.extra.items()},
        }
    )


def _build_invoice(tenant_id, label: str, now: datetime) -> Invoice:
    with transaction.atomic():
        account = get_account(tenant_id, lock=True)
        tz, currency = account.time_zone, account.currency
        period = month_period(tz, label)
        since = tenant_since(tenant_id)
        if since is not None and not tenant_existed_in(period, since):
            raise Conflict(
                f"{label} ({tz}) ended at {period.end.isoformat()}, before the tenant existed "
                f"(since {since.isoformat()}): no invoice",
                code="period_before_tenant",
                field="period",
            )
        existing = Invoice.objects.filter(tenant_id=tenant_id, period_start=period.start).first()
        if existing is not None and existing.status == InvoiceStatus.FINALIZED:
            return existing
        aggregate_usage(tenant_id, period.start, period.end, now)
        rated = rate_usage(
            tenant_id,
            currency,
            period,
            RECORDS,
            {"tenant": tenant_id, "ps": period.start, "pe": period.end},
            now,
        )
        params = {"tenant": tenant_id, "ps": period.start, "pe": period.end}
        charges = reservation_charges(
            tenant_id,
            currency,
            period.start,
            period.end,
            now,
            covered_seconds(RECORDS, params),
        )
        adjustments = _adjustments(tenant_id, tz, currency, period, now)
        invoice, _ = Invoice.objects.update_or_create(
            tenant_id=tenant_id,
            period_start=period.start,
            defaults={
                "number": invoice_number(tenant_id, label),
                "period_label": label,
                "period_end": period.end,
                "time_zone": tz,
                "currency": currency,
                "status": InvoiceStatus.DRAFT,
                "computed_at": now,
                "build_error": None,
            },
        )
        invoice.lines.all().delete()
        lines = _lines(invoice, rated, adjustments, currency)
        lines += _reservation_lines(invoice, charges, currency, start=len(lines))
        InvoiceLine.objects.bulk_create(lines)
        charged = (LineKind.USAGE, LineKind.RESERVATION)
        usage = sum(
            (ln.amount for ln in lines if ln.kind in charged and not ln.adjusts_id),
            Decimal(0),
        )
        credit = sum(
            (ln.amount for ln in lines if ln.kind == LineKind.SLA_CREDIT and not ln.adjusts_id),
            Decimal(0),
        )
        adjust = sum((ln.amount for ln in lines if ln.adjusts_id), Decimal(0))
        invoice.usage_amount, invoice.credit_amount = usage, credit
        invoice.adjustment_amount, invoice.total = adjust, usage + credit + adjust
        invoice.save(update_fields=["usage_amount", "credit_amount", "adjustment_amount", "total"])
    return invoice


def _lines(invoice: Invoice, rated, adjustments, currency: str) -> list[InvoiceLine]:
    clusters, pools = _names(rated + [a[1] for a in adjustments])
    lines: list[InvoiceLine] = []

    def add(kind, r: RatedKey, seconds: Decimal, amount: Decimal, text: str, adjusts=None):
        lines.append(
            InvoiceLine(
                invoice=invoice,
                position=len(lines) + 1,
                kind=kind,
                adjusts=adjusts,
                cluster_id=r.cluster_id,
                nodepool_id=r.nodepool_id,
                gpu_model=r.gpu_model,
                mig_profile=r.mig_profile,
                unit_price=r.unit_price,
                gpu_seconds=seconds,
                gpu_hours=gpu_hours(seconds),
                amount=amount,
                description=text[:300],
                details=r.details if kind == LineKind.SLA_CREDIT else [],
            )
        )

    order = sorted(
        rated,
        key=lambda r: (
            clusters.get(r.cluster_id, ""),
            pools.get(r.nodepool_id, ""),
            r.gpu_model,
            r.mig_profile,
            r.first_start,
        ),
    )
    for r in order:
        what = _what(r, clusters, pools)
        price = f"{format_rate(r.unit_price, currency)} {currency}/GPU-h ({r.source})"
        add(
            LineKind.USAGE,
            r,
            r.gpu_seconds,
            line_amount(r.gpu_seconds, r.unit_price, currency),
            f"{what}: {gpu_hours(r.gpu_seconds)} GPU-h x {price}",
        )
        if r.credit_gpu_seconds:
            xids = sorted({d["xid"] for d in r.details if d["xid"] is not None})
            add(
                LineKind.SLA_CREDIT,
                r,
                -r.credit_gpu_seconds,
                -line_amount(r.credit_gpu_seconds, r.unit_price, currency),
                f"SLA credit {what}: -{gpu_hours(r.credit_gpu_seconds)} GPU-h x {price},"
                f" unhealthy after Xid {', '.join(map(str, xids))}",
            )
    for old, r, kind, secs, amount in adjustments:
        label = "SLA credit" if kind == LineKind.SLA_CREDIT else "usage"
        add(
            kind,
            r,
            secs,
            amount,
            f"Adjustment to {old.number} ({old.period_label}), {label} of "
            f"{_what(r, clusters, pools)}: {gpu_hours(secs)} GPU-h at "
            f"{format_rate(r.unit_price, currency)} {currency}/GPU-h",
            adjusts=old,
        )
    return lines


def _reservation_lines(
    invoice: Invoice, charges: list[ReservationCharge], currency: str, start: int
) -> list[InvoiceLine]:
    """One RESERVATION line per reservation and reservation rate (after the usage lines)."""
    lines = []
    for c in charges:
        r = c.reservation
        price = f"{format_rate(c.unit_price, currency)} {currency}/GPU-h ({c.source})"
        covered = gpu_hours(c.covered_gpu_seconds)
        lines.append(
            InvoiceLine(
                invoice=invoice,
                position=start + len(lines) + 1,
                kind=LineKind.RESERVATION,
                reservation=r,
                gpu_model=r.gpu_model_id,
                mig_profile="",
                unit_price=c.unit_price,
                gpu_seconds=c.gpu_seconds,
                gpu_hours=gpu_hours(c.gpu_seconds),
                amount=line_amount(c.gpu_seconds, c.unit_price, currency),
                description=(
                    f"Reservation {r.name or r.id}: {r.gpus} x {r.gpu_model_id} in "
                    f"{r.zone or r.region}, {gpu_hours(c.gpu_seconds)} reserved GPU-h x {price}; "
                    f"{covered} GPU-h used inside it (not billed again)"
                )[:300],
                details=[
                    {
                        "reservation_id": str(r.id),
                        "start": c.start.isoformat(),
                        "end": c.end.isoformat(),
                        "gpus": r.gpus,
                        "covered_gpu_seconds": str(c.covered_gpu_seconds),
                    }
                ],
            )
        )
    return lines


def finalize_invoice(invoice_id, now: datetime | None = None) -> Invoice:
    """Rebuild the DRAFT from current data, then freeze it: ``DRAFT -> FINALIZED``.

    Raises Conflict ``period_not_ended`` (the month is not over), ``invoice_finalized``
    (already final) or ``earlier_period_not_finalized`` (usage before this month that no
    finalized invoice covers: finalize months in order). When the rebuild fails for a missing
    price, the draft is not frozen (its lines are stale): the Conflict keeps its code
    (``missing_price`` / ``missing_reservation_price``, 409) and says which invoice could not
    be finalized and why, and the draft is marked (:func:`mark_build_failed`).
    """
    now = now or timezone.now()
    try:
        return _finalize_invoice(invoice_id, now)
    except Conflict as exc:
        if exc.code not in UNPRICEABLE:
            raise
        invoice = Invoice.objects.get(pk=invoice_id)
        # the rebuild's own mark was rolled back with the finalization: write it again
        mark_build_failed(invoice.tenant_id, invoice.period_label, exc, now)
        raise Conflict(
            f"{invoice.number} cannot be finalized: its rebuild failed: {exc.detail}",
            code=exc.code,
            extra=exc.extra,
        ) from exc


def _finalize_invoice(invoice_id, now: datetime) -> Invoice:
    with transaction.atomic():
        invoice = Invoice.objects.get(pk=invoice_id)
        account = get_account(invoice.tenant_id, lock=True)
        if invoice.status == InvoiceStatus.FINALIZED:
            raise Conflict(f"{invoice.number} is already FINALIZED", code="invoice_finalized")
        if now < invoice.period_end:
            raise Conflict(
                f"{invoice.period_label} ends at {invoice.period_end.isoformat()}",
                code="period_not_ended",
            )
        since = account.closed_through
        if since is None or since < invoice.period_start:
            unbilled = (
                LedgerEntry.objects.filter(
                    tenant_id=invoice.tenant_id,
                    period__overlap=Range(since, invoice.period_start, "[)"),
                )
                .order_by("period__startswith")
                .first()
            )
            if unbilled is not None:
                start = max(since or unbilled.period.lower, unbilled.period.lower)
                first = period_of(account.time_zone, start)
                raise Conflict(
                    f"finalize {first.label} first: it has usage no finalized invoice covers",
                    code="earlier_period_not_finalized",
                )
        invoice = build_invoice(invoice.tenant_id, invoice.period_label, now)
        updated = Invoice.objects.filter(pk=invoice.pk, status=InvoiceStatus.DRAFT).update(
            status=InvoiceStatus.FINALIZED, finalized_at=now
        )
        if updated != 1:  # pragma: no cover - the account lock serialises finalizations
            raise Conflict(f"{invoice.number} changed meanwhile", code="invoice_finalized")
        account.closed_through = max(since or invoice.period_end, invoice.period_end)
        account.save(update_fields=["closed_through"])
        invoice.refresh_from_db()
        # receivers write in this transaction (each in its own savepoint); send_robust: a
        # receiver's failure never blocks a finalization
        invoice_finalized.send_robust(sender=Invoice, invoice=invoice)
    return invoice
