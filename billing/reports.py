"""Read-side reports: usage by group, the per-GPU hour accounting, utilization beside cost.

Nothing here writes or feeds the bill: usage reads the stored :class:`UsageRecord` rows;
utilization reads GPU telemetry (``fleet_gpusample``) and is for right-sizing only.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_FLOOR, Decimal

from django.db import connection, transaction
from django.db.models import Max, QuerySet, Sum
from django.db.models.expressions import RawSQL

from reservations.models import Reservation

from .aggregation import get_account
from .costs import cost_error, cost_window, reason, usage_through
from .invoices import missing_price, rate_usage
from .models import LedgerEntry, UsageRecord
from .money import SECONDS_PER_HOUR, gpu_hours, line_amount, quantum, round_money
from .periods import Period
from .prices import price_cuts
from .reservations import covered_usage, reservation_cuts
from .samples import samples_of

#: ``group_by`` names of the usage API -> UsageRecord fields.
USAGE_GROUPS = {
    "tenant": "tenant_id",
    "cluster": "cluster_id",
    "pool": "nodepool_id",
    "model": "gpu_model",
    "profile": "mig_profile",
    "day": "day",
}

_LOCAL_DAY = (
    "(billing_usagerecord.start AT TIME ZONE COALESCE((SELECT a.time_zone FROM"
    " billing_billingaccount a WHERE a.tenant_id = billing_usagerecord.tenant_id), 'UTC'))::date"
)


def usage_rows(
    records: QuerySet[UsageRecord], group_by: list[str], start: datetime, end: datetime
) -> tuple[list[dict], dict]:
    """Sum the (already scoped) records whose bucket starts in ``[start, end)`` by ``group_by``.

    ``day`` is the calendar day in the record's tenant's billing time zone. Returns
    ``(rows, totals)``; each has ``gpu_seconds``, ``gpu_hours``, ``device_hours``,
    ``sla_credit_gpu_hours``, ``billable_gpu_hours`` (usage minus credit) as Decimals.

    GPU-hours are weighted by the billable fraction everywhere (a shared 1g.10gb instance held
    one hour: 0.142857 GPU-h), as the invoice bills and the utilization API's
    ``allocated_gpu_hours`` count them. ``device_hours`` is the unweighted count: each GPU or
    MIG GPU instance held one hour is 1 device-hour, whatever its fraction.
    """
    qs = records.filter(start__gte=start, start__lt=end).annotate(day=RawSQL(_LOCAL_DAY, []))
    fields = [USAGE_GROUPS[g] for g in group_by]
    sums = {
        "gpu_seconds": Sum("gpu_seconds"),
        "allocated_seconds": Sum("allocated_seconds"),
        "credit": Sum("sla_credit_gpu_seconds"),
        "computed_at": Max("computed_at"),
    }
    grouped = qs.values(*fields).annotate(**sums).order_by(*fields) if fields else None
    rows = [_usage_row(r) for r in grouped] if grouped is not None else []
    totals = _usage_row(qs.aggregate(**sums))
    if "cluster_id" in fields or "nodepool_id" in fields:
        _add_names(rows)
    return rows, totals


def _usage_row(r: dict) -> dict:
    seconds = r.pop("gpu_seconds") or Decimal(0)
    allocated = r.pop("allocated_seconds") or Decimal(0)
    credit = r.pop("credit") or Decimal(0)
    r["aggregated_at"] = r.pop("computed_at")
    r.update(
        gpu_seconds=seconds,
        gpu_hours=gpu_hours(seconds),
        device_hours=gpu_hours(allocated),
        sla_credit_gpu_hours=gpu_hours(credit),
        billable_gpu_hours=gpu_hours(seconds - credit),
    )
    return r


def _add_names(rows: list[dict]) -> None:
    from clusters.models import Cluster
    from nodepools.models import NodePool

    clusters = dict(
        Cluster.objects.filter(id__in={r.get("cluster_id") for r in rows}).values_list("id", "name")
    )
    pools = dict(
        NodePool.objects.filter(id__in={r.get("nodepool_id") for r in rows}).values_list(
            "id", "name"
        )
    )
    for r in rows:
        if "cluster_id" in r:
            r["cluster_name"] = clusters.get(r["cluster_id"])
        if "nodepool_id" in r:
            r["nodepool_name"] = pools.get(r["nodepool_id"])


_ACCOUNTING_SQL = """
SELECT tenant_id,
       SUM(billable_fraction * EXTRACT(EPOCH FROM
           upper(period * tstzrange(%(start)s, %(end)s, '[)'))
         - lower(period * tstzrange(%(start)s, %(end)s, '[)'))))
  FROM billing_ledgerentry
 WHERE gpu_uuid = %(gpu)s AND period && tstzrange(%(start)s, %(end)s, '[)')
 GROUP BY tenant_id
"""


def gpu_hour_accounting(gpu_uuid: str, start: datetime, end: datetime) -> dict[str, Decimal]:
    """Where the GPU-seconds of one physical GPU went in ``[start, end)``.

    ``{"<tenant id>": gpu_seconds, ..., "idle": seconds}``; the values add up to exactly
    ``end - start`` seconds (one GPU-hour per hour). Raises AssertionError if the rows billed
    more than the GPU had (the ledger's constraints make that impossible).
    """
    with connection.cursor() as cursor:
        cursor.execute(_ACCOUNTING_SQL, {"gpu": gpu_uuid, "start": start, "end": end})
        out = {str(t): Decimal(s) for t, s in cursor.fetchall()}
    total = Decimal((end - start).total_seconds())
    idle = total - sum(out.values(), Decimal(0))
    if idle < 0:
        raise AssertionError(f"{gpu_uuid} billed {total - idle} s in a {total} s window")
    out["idle"] = idle
    return out


# ----------------------------------------------------------------- utilization beside cost

#: each tenant's window ``[start, stop)`` (:func:`billing.costs.usage_through`)
_STOPS = """
stops AS (
    SELECT * FROM unnest(%(tenants)s::uuid[], %(stops)s::timestamptz[]) AS x(tenant_id, stop)
)"""

_UTILIZATION_SQL = (
    "WITH"
    + _STOPS
    + """,
rows AS (
    SELECT l.id, l.tenant_id, l.cluster_id, l.nodepool_id, l.gpu_uuid, l.gpu_model,
           l.mig_profile, l.mig_gpu_instance_id, l.billable_fraction AS f,
           l.period * tstzrange(%(start)s, st.stop, '[)') AS p
      FROM billing_ledgerentry l
      JOIN stops st ON st.tenant_id = l.tenant_id
     WHERE l.period && tstzrange(%(start)s, st.stop, '[)')
       AND l.id = ANY(%(ids)s)
),
hours AS (
    SELECT r.id, date_trunc('hour', s.ts) AS h,
           avg(s.utilization_gpu_pct) AS util,
           avg(s.memory_used_bytes::numeric / NULLIF(s.memory_total_bytes, 0)) AS mem,
           max(s.memory_used_bytes::numeric / NULLIF(s.memory_total_bytes, 0)) AS mem_peak
      FROM rows r
      JOIN fleet_gpusample s
        ON """
    + samples_of("r")
    + """
       AND s.ts >= %(start)s AND s.ts < %(stop)s AND s.ts <@ r.p
     GROUP BY r.id, date_trunc('hour', s.ts)
)
SELECT id, tenant_id, cluster_id, nodepool_id, gpu_uuid, gpu_model, mig_profile,
       h, util, mem, mem_peak, f * EXTRACT(EPOCH FROM upper(x) - lower(x)) AS w, f,
       lower(x), upper(x)
  FROM (SELECT r.*, h.h, h.util, h.mem, h.mem_peak,
               r.p * tstzrange(h.h, h.h + interval '1 hour', '[)') AS x
          FROM hours h JOIN rows r ON r.id = h.id) pieces
"""
)

_ALLOCATED_SQL = (
    "WITH"
    + _STOPS
    + """
SELECT l.id, l.tenant_id, l.cluster_id, l.nodepool_id,
       l.billable_fraction * EXTRACT(EPOCH FROM
           upper(l.period * tstzrange(%(start)s, st.stop, '[)'))
         - lower(l.period * tstzrange(%(start)s, st.stop, '[)')))
  FROM billing_ledgerentry l
  JOIN stops st ON st.tenant_id = l.tenant_id
 WHERE l.period && tstzrange(%(start)s, st.stop, '[)') AND l.id = ANY(%(ids)s)
"""
)

UTILIZATION_GROUPS = {"tenant": "tenant_id", "cluster": "cluster_id", "pool": "nodepool_id"}


@dataclass
class _Acc:
    allocated: Decimal = Decimal(0)
    measured: Decimal = Decimal(0)
    util_w: Decimal = Decimal(0)
    mem_measured: Decimal = Decimal(0)
    mem_w: Decimal = Decimal(0)
    mem_peak: Decimal | None = None
    idle: Decimal = Decimal(0)


@dataclass(frozen=True)
class _IdlePiece:
    """A ledger row's allocated time ``[lo, hi)`` inside one UTC hour whose mean utilization
    was below the threshold; ``gpu_seconds`` = billable fraction x seconds."""

    ledger_id: int
    tenant_id: object
    cluster_id: object
    nodepool_id: object
    gpu_uuid: str
    gpu_model: str
    mig_profile: str
    fraction: Decimal
    lo: datetime
    hi: datetime

    @property
    def seconds(self) -> Decimal:
        return Decimal(str((self.hi - self.lo).total_seconds()))

    @property
    def gpu_seconds(self) -> Decimal:
        return self.fraction * self.seconds


def utilization(
    ledger_ids: list[int],
    *,
    group_by: str,
    start: datetime,
    end: datetime,
    now: datetime,
    idle_threshold_pct: float = 5.0,
    idle_min_hours: int = 1,
    tenant_ids: Iterable = (),
) -> dict:
    """GPU-hour-weighted utilization, memory headroom and idle GPUs of the given ledger rows.

    The window is the usage view's cost window, not ``[start, min(end, now))``: each tenant's
    rows count up to where its stored usage ends (:func:`billing.costs.usage_through`, the
    last aggregation while a node runs), as its usage records and cost do, so a group's
    ``allocated_gpu_hours`` is its billed ``gpu_hours`` of the usage API and its idle GPU-hours
    (and idle cost) never exceed them. Returns it as ``cost_window`` (``{"start", "end"}``: the
    earliest tenant's end, as the usage API's ``totals.cost_window``; ``tenant_ids`` are
    tenants that count in it even with no row, as there).

    Per UTC hour and allocation: the mean of its samples taken while allocated (utilization
    %, memory used / total): a whole GPU's, or a MIG GPU instance's own (:mod:`billing.samples`; a
    shared GPU's whole-GPU samples carry the co-tenants' memory). Weighted by the
    allocation's billable GPU-seconds in that hour. An hour is idle when its mean
    utilization is below ``idle_threshold_pct``; an idle GPU is an allocation idle in at
    least ``idle_min_hours`` clock hours of the window; its ``idle_hours`` is the time it was
    allocated in those hours (3 minutes held: 0.05, not 1).

    Idle cost is rated as the invoice rates usage (:func:`_idle_costs`): the unit price in
    force, idle time inside a capacity reservation costs nothing more (``idle_covered_gpu_hours``,
    ``idle_covered_by``); idle time with no price in the tenant's currency gives ``idle_cost``
    None and ``idle_cost_error`` (the invoice build's reason), never a guess. MIG GPU instances
    report no utilization (NVML: N/A) and are counted as allocated but not measured.
    Returns ``{"groups": [...], "idle_gpus": [...], "cost_window": {...}}`` (Decimals;
    percentages 0-100).
    """
    tenants = set(tenant_ids) | set(
        LedgerEntry.objects.filter(id__in=ledger_ids).values_list("tenant_id", flat=True)
    )
    # never before start: a window that has not begun yet is empty (an inverted range is a
    # PostgreSQL error)
    stops = {t: usage_through(t, start, end, now) for t in tenants}
    window = cost_window(stops.values(), start, max(start, min(end, now)))
    params = {
        "start": start,
        "stop": max(stops.values(), default=start),
        "ids": ledger_ids,
        "tenants": list(stops),
        "stops": list(stops.values()),
    }
    key = UTILIZATION_GROUPS[group_by]
    groups: dict = defaultdict(_Acc)
    with connection.cursor() as cursor:
        cursor.execute(_ALLOCATED_SQL, params)
        cols = ["id", "tenant_id", "cluster_id", "nodepool_id"]
        for *ids, seconds in cursor.fetchall():
            groups[dict(zip(cols, ids, strict=True))[key]].allocated += Decimal(seconds)
        cursor.execute(_UTILIZATION_SQL, params)
        hours = cursor.fetchall()
    threshold = Decimal(str(idle_threshold_pct))
    idle_by_row: dict[int, list[_IdlePiece]] = defaultdict(list)
    for lid, tenant, cluster, pool, gpu, model, profile, _h, util, mem, peak, w, f, lo, hi in hours:
        row = {"tenant_id": tenant, "cluster_id": cluster, "nodepool_id": pool}
        acc = groups[row[key]]
        w = Decimal(w)
        if util is not None:
            acc.measured += w
            acc.util_w += w * Decimal(util)
            if Decimal(util) < threshold:
                acc.idle += w
                idle_by_row[lid].append(
                    _IdlePiece(lid, tenant, cluster, pool, gpu, model, profile, f, lo, hi)
                )
        if mem is not None:
            acc.mem_measured += w
            acc.mem_w += w * mem
            acc.mem_peak = peak if acc.mem_peak is None else max(acc.mem_peak, peak)
    rows_cost, groups_cost = _idle_costs(idle_by_row, start, stops, now)
    out_groups = []
    for group, acc in sorted(groups.items(), key=lambda kv: str(kv[0])):
        out_groups.append(
            {
                key: group,
                "allocated_gpu_hours": gpu_hours(acc.allocated),
                "measured_gpu_hours": gpu_hours(acc.measured),
                "gpu_utilization_pct": _pct(acc.util_w, acc.measured),
                "memory_headroom_pct": None
                if not acc.mem_measured
                else _round2(100 * (1 - acc.mem_w / acc.mem_measured)),
                "min_memory_headroom_pct": None
                if acc.mem_peak is None
                else _round2(100 * (1 - acc.mem_peak)),
                "idle_gpu_hours": gpu_hours(acc.idle),
                **groups_cost.get((key, group), _IdleCost()).as_dict(),
            }
        )
    idle_gpus = []
    # tenants see a ledger row's public id, never its serial (nvke/public_ids.py)
    public_ids = dict(
        LedgerEntry.objects.filter(id__in=list(idle_by_row)).values_list("id", "public_id")
    )
    for lid, pieces in sorted(idle_by_row.items()):
        if len(pieces) < idle_min_hours:
            continue
        first = pieces[0]
        idle_gpus.append(
            {
                "ledger_entry_id": str(public_ids[lid]),
                "tenant_id": first.tenant_id,
                "cluster_id": first.cluster_id,
                "nodepool_id": first.nodepool_id,
                "gpu_uuid": first.gpu_uuid,
                "gpu_model": first.gpu_model,
                "idle_hours": gpu_hours(sum((p.seconds for p in pieces), Decimal(0))),
                "idle_gpu_hours": gpu_hours(sum((p.gpu_seconds for p in pieces), Decimal(0))),
                **rows_cost.get(lid, _IdleCost()).as_dict(),
            }
        )
    return {"groups": out_groups, "idle_gpus": idle_gpus, "cost_window": window}


def _pct(weighted: Decimal, weight: Decimal) -> Decimal | None:
    return None if not weight else _round2(weighted / weight)


def _round2(value: Decimal) -> Decimal:
    return Decimal(value).quantize(Decimal("0.01"))


@dataclass
class _IdleCost:
    """The idle cost of a ledger row or a group: ``{currency: amount}`` (a group: the sum of
    its rated lines, each rounded once like an invoice line; a row: its share of those lines,
    :func:`_shares`, so the rows add up to the group), the covered GPU-seconds and the
    reasons of what has no price."""

    cost: dict[str, Decimal] = field(default_factory=dict)
    covered: Decimal = Decimal(0)
    covered_by: set[str] = field(default_factory=set)
    reasons: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        out: dict = {
            "idle_cost": None if self.reasons else self.cost,
            "idle_covered_gpu_hours": gpu_hours(self.covered),
            "idle_covered_by": sorted(self.covered_by),
        }
        if self.reasons:
            out["idle_cost_error"] = cost_error(self.reasons)
        return out


#: the idle pieces of one tenant (:func:`_idle_costs`), as usage records with a ``tag``
_IDLE = """
SELECT tag, cluster_id, nodepool_id, gpu_model, mig_profile, start, gpu_seconds,
       sla_credit_gpu_seconds
  FROM billing_tmp_idle
"""


def _idle_costs(
    idle_by_row: dict[int, list[_IdlePiece]], start: datetime, stops: dict, now: datetime
) -> tuple[dict[int, _IdleCost], dict[tuple, _IdleCost]]:
    """Rate the idle time of each ledger row as the invoice rates usage: each tenant's idle
    pieces, cut at its price and reservation bounds (as usage buckets are), go through
    :func:`billing.invoices.rate_usage` tagged with their ledger row (reservation-covered time
    left out, unpriced time reported, not raised) and :func:`billing.reservations.covered_usage`.
    A group's cost is rounded once per line (cluster, pool, model, profile, unit price), as
    the usage view rounds the same GPU-hours; each row gets its share (:func:`_shares`).
    ``stops``: each tenant's window end. Returns ``(by ledger row id, by (group field, id))``
    for tenant, cluster and pool groups."""
    rows: dict[int, _IdleCost] = defaultdict(_IdleCost)
    groups: dict[tuple, _IdleCost] = defaultdict(_IdleCost)
    by_tenant: dict = defaultdict(list)
    for pieces in idle_by_row.values():
        for piece in pieces:
            by_tenant[piece.tenant_id].append(piece)
    meta = {lid: pieces[0] for lid, pieces in idle_by_row.items()}

    def targets(lid: int) -> list[_IdleCost]:
        p = meta[lid]
        return [
            rows[lid],
            groups[("tenant_id", p.tenant_id)],
            groups[("cluster_id", p.cluster_id)],
            groups[("nodepool_id", p.nodepool_id)],
        ]

    for tenant, pieces in by_tenant.items():
        currency = get_account(tenant).currency
        stop = stops[tenant]
        cuts = sorted({*price_cuts(tenant, start, stop), *reservation_cuts(tenant, start, stop)})
        records = []
        for p in pieces:
            bounds = [p.lo, *(c for c in cuts if p.lo < c < p.hi), p.hi]
            for lo, hi in itertools.pairwise(bounds):
                seconds = p.fraction * Decimal(str((hi - lo).total_seconds()))
                records.append((p, lo, seconds))
        missing: list = []
        with transaction.atomic():  # the rating's temporary tables live until the commit
            with connection.cursor() as cursor:
                cursor.execute(
                    "DROP TABLE IF EXISTS billing_tmp_idle;"
                    "CREATE TEMP TABLE billing_tmp_idle (tag bigint, cluster_id uuid,"
                    " nodepool_id uuid, gpu_model text, mig_profile text, start timestamptz,"
                    " gpu_seconds numeric, sla_credit_gpu_seconds numeric) ON COMMIT DROP"
                )
                cursor.execute(
                    "INSERT INTO billing_tmp_idle SELECT t, c, n, m, pr, s, g, 0 FROM"
                    " unnest(%s::bigint[], %s::uuid[], %s::uuid[], %s::text[], %s::text[],"
                    " %s::timestamptz[], %s::numeric[]) AS x(t, c, n, m, pr, s, g)",
                    [
                        [p.ledger_id for p, _, _ in records],
                        [p.cluster_id for p, _, _ in records],
                        [p.nodepool_id for p, _, _ in records],
                        [p.gpu_model for p, _, _ in records],
                        [p.mig_profile for p, _, _ in records],
                        [lo for _, lo, _ in records],
                        [g for _, _, g in records],
                    ],
                )
            window = Period("", start, stop)
            rated = rate_usage(
                tenant, currency, window, _IDLE, {}, now, tagged=True, unpriced=missing
            )
            covered = covered_usage(_IDLE, {}, tagged=True)
        lines: dict[tuple, list] = defaultdict(list)
        for r in rated:
            lines[r.key].append(r)
        for line in lines.values():
            # one rounding per cost line, as the usage view and the invoice round the same
            # GPU-hours; the line's rows share its amount (:func:`_shares`)
            first = meta[line[0].tag]
            amount = line_amount(
                sum((r.gpu_seconds for r in line), Decimal(0)), line[0].unit_price, currency
            )
            for target in [
                groups[("tenant_id", first.tenant_id)],
                groups[("cluster_id", first.cluster_id)],
                groups[("nodepool_id", first.nodepool_id)],
            ]:
                target.cost[currency] = target.cost.get(currency, Decimal(0)) + amount
            exact = {r.tag: r.gpu_seconds * r.unit_price / SECONDS_PER_HOUR for r in line}
            for tag, share in _shares(amount, exact, currency).items():
                rows[tag].cost[currency] = rows[tag].cost.get(currency, Decimal(0)) + share
        for r in missing:
            why = reason(missing_price(r.gpu_model, r.mig_profile, currency, r.first_start))
            for target in targets(r.tag):
                target.reasons.append(why)
        names = dict(
            Reservation.objects.filter(id__in={c.reservation_id for c in covered}).values_list(
                "id", "name"
            )
        )
        for c in covered:
            name = names.get(c.reservation_id) or str(c.reservation_id)
            for target in targets(c.tag):
                target.covered += c.gpu_seconds
                target.covered_by.add(name)
                # covered idle time costs nothing more: 0, not "unknown"
                target.cost.setdefault(currency, round_money(Decimal(0), currency))
    return rows, groups


def _shares(amount: Decimal, exact: dict[int, Decimal], currency: str) -> dict[int, Decimal]:
    """Split a line's rounded ``amount`` among its ledger rows (``{row id: exact amount}``) by
    the largest-remainder rule: each row gets its exact amount rounded down to the currency's
    minor unit, and the units left go one each to the rows with the largest remainders (ties:
    the lower row id). The shares add up to ``amount`` exactly. Example: 4 GPUs of 0.238499 USD
    each, line 0.95 USD: 0.24, 0.24, 0.24, 0.23."""
    unit = quantum(currency)
    floors = {
        t: (x / unit).to_integral_value(rounding=ROUND_FLOOR) * unit for t, x in exact.items()
    }
    left = int((amount - sum(floors.values(), Decimal(0))) / unit)
    order = sorted(exact, key=lambda t: (-(exact[t] - floors[t]), t))
    for t in order[: max(left, 0)]:
        floors[t] += unit
    return {t: round_money(v, currency) for t, v in floors.items()}


def scoped_ledger_ids(ledger_qs, start: datetime, end: datetime) -> list[int]:
    """Ids of the (scoped) ledger rows overlapping ``[start, end)``."""
    return list(ledger_qs.filter(period__overlap=(start, end)).values_list("id", flat=True))
