"""Read-side reports: usage by group, the per-GPU hour accounting, utilization beside cost.

Nothing here writes or feeds the bill: usage reads the stored :class:`UsageRecord` rows;
utilization reads GPU telemetry (``fleet_gpusample``) and is for right-sizing only.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection
from django.db.models import Max, QuerySet, Sum
from django.db.models.expressions import RawSQL

from .models import BillingAccount, LedgerEntry, UsageRecord
from .money import SECONDS_PER_HOUR, gpu_hours, round_money
from .prices import rate_segments
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
    ``(rows, totals)``; each has ``gpu_seconds``, ``gpu_hours``, ``allocated_hours``,
    ``sla_credit_gpu_hours``, ``billable_gpu_hours`` (usage minus credit) as Decimals.
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
        allocated_hours=gpu_hours(allocated),
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

_UTILIZATION_SQL = (
    """
WITH rows AS (
    SELECT l.id, l.tenant_id, l.cluster_id, l.nodepool_id, l.gpu_uuid, l.gpu_model,
           l.mig_profile, l.mig_gpu_instance_id, l.billable_fraction AS f,
           l.period * tstzrange(%(start)s, %(stop)s, '[)') AS p
      FROM billing_ledgerentry l
     WHERE l.period && tstzrange(%(start)s, %(stop)s, '[)')
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
SELECT r.id, r.tenant_id, r.cluster_id, r.nodepool_id, r.gpu_uuid, r.gpu_model, r.mig_profile,
       h.h, h.util, h.mem, h.mem_peak,
       r.f * EXTRACT(EPOCH FROM upper(r.p * tstzrange(h.h, h.h + interval '1 hour', '[)'))
                              - lower(r.p * tstzrange(h.h, h.h + interval '1 hour', '[)'))) AS w
  FROM hours h JOIN rows r ON r.id = h.id
"""
)

_ALLOCATED_SQL = """
SELECT l.id, l.tenant_id, l.cluster_id, l.nodepool_id,
       l.billable_fraction * EXTRACT(EPOCH FROM
           upper(l.period * tstzrange(%(start)s, %(stop)s, '[)'))
         - lower(l.period * tstzrange(%(start)s, %(stop)s, '[)')))
  FROM billing_ledgerentry l
 WHERE l.period && tstzrange(%(start)s, %(stop)s, '[)') AND l.id = ANY(%(ids)s)
"""

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
    idle_cost: dict | None = None


def utilization(
    ledger_ids: list[int],
    *,
    group_by: str,
    start: datetime,
    end: datetime,
    now: datetime,
    idle_threshold_pct: float = 5.0,
    idle_min_hours: int = 1,
) -> dict:
    """GPU-hour-weighted utilization, memory headroom and idle GPUs of the given ledger rows.

    Per UTC hour and allocation: the mean of its samples taken while allocated (utilization
    %, memory used / total): a whole GPU's, or a MIG GPU instance's own (:mod:`billing.samples`; a
    shared GPU's whole-GPU samples carry the co-tenants' memory). Weighted by the
    allocation's billable GPU-seconds in that hour. An hour is idle when its mean
    utilization is below ``idle_threshold_pct``; an idle GPU is an allocation with at least
    ``idle_min_hours`` idle hours in the window. Idle cost = idle GPU-hours at the unit price
    in force (the tenant's currency). MIG GPU instances report no utilization (NVML: N/A) and are
    counted as allocated but not measured.
    Returns ``{"groups": [...], "idle_gpus": [...]}`` (Decimals; percentages 0-100).
    """
    # a window that has not begun yet is empty (an inverted range is a PostgreSQL error)
    stop = max(start, min(end, now))
    params = {"start": start, "stop": stop, "ids": ledger_ids}
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
    idle_by_row: dict = defaultdict(list)
    for lid, tenant, cluster, pool, gpu, model, profile, h, util, mem, peak, w in hours:
        row = {"tenant_id": tenant, "cluster_id": cluster, "nodepool_id": pool}
        acc = groups[row[key]]
        w = Decimal(w)
        if util is not None:
            acc.measured += w
            acc.util_w += w * Decimal(util)
            if Decimal(util) < threshold:
                acc.idle += w
                idle_by_row[lid].append((tenant, cluster, pool, gpu, model, profile, h, w))
        if mem is not None:
            acc.mem_measured += w
            acc.mem_w += w * mem
            acc.mem_peak = peak if acc.mem_peak is None else max(acc.mem_peak, peak)
    idle_cost = _idle_cost(idle_by_row, start, stop)
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
                "idle_cost": idle_cost["groups"].get((key, group), {}),
            }
        )
    idle_gpus = []
    # tenants see a ledger row's public id, never its serial (nvke/public_ids.py)
    public_ids = dict(
        LedgerEntry.objects.filter(id__in=list(idle_by_row)).values_list("id", "public_id")
    )
    for lid, hrs in sorted(idle_by_row.items()):
        if len(hrs) < idle_min_hours:
            continue
        tenant, cluster, pool, gpu, model, profile, _, _ = hrs[0]
        idle_gpus.append(
            {
                "ledger_entry_id": str(public_ids[lid]),
                "tenant_id": tenant,
                "cluster_id": cluster,
                "nodepool_id": pool,
                "gpu_uuid": gpu,
                "gpu_model": model,
                "idle_hours": len(hrs),
                "idle_gpu_hours": gpu_hours(sum((x[-1] for x in hrs), Decimal(0))),
                "idle_cost": idle_cost["rows"].get(lid, {}),
            }
        )
    return {"groups": out_groups, "idle_gpus": idle_gpus}


def _pct(weighted: Decimal, weight: Decimal) -> Decimal | None:
    return None if not weight else _round2(weighted / weight)


def _round2(value: Decimal) -> Decimal:
    return Decimal(value).quantize(Decimal("0.01"))


def _idle_cost(idle_by_row: dict, start: datetime, stop: datetime) -> dict:
    """``{"groups": {(key, id): {currency: amount}}, "rows": {ledger id: {currency: amount}}}``."""
    out: dict = {"groups": defaultdict(dict), "rows": defaultdict(dict)}
    by_tenant: dict = defaultdict(list)
    for lid, hrs in idle_by_row.items():
        for item in hrs:
            by_tenant[item[0]].append((lid, *item))
    for tenant, items in by_tenant.items():
        account = BillingAccount.objects.filter(tenant_id=tenant).first()
        currency = account.currency if account else "USD"
        pairs = {(i[5], i[6]) for i in items}
        segments = rate_segments(
            tenant_id=tenant, currency=currency, pairs=pairs, start=start, end=stop
        )
        for lid, _t, cluster, pool, _gpu, model, profile, h, w in items:
            at = max(h, start)
            price = next(
                (
                    seg.unit_price
                    for seg in segments
                    if (seg.gpu_model, seg.mig_profile) == (model, profile)
                    and seg.start <= at < seg.end
                ),
                None,
            )
            if price is None:
                continue
            cost = w * price / SECONDS_PER_HOUR
            for bucket in (
                out["rows"][lid],
                out["groups"][("tenant_id", tenant)],
                out["groups"][("cluster_id", cluster)],
                out["groups"][("nodepool_id", pool)],
            ):
                bucket[currency] = bucket.get(currency, Decimal(0)) + cost
    for table in (out["rows"], out["groups"]):
        for costs in table.values():
            for currency, amount in costs.items():
                costs[currency] = round_money(amount, currency)
    return out


def scoped_ledger_ids(ledger_qs, start: datetime, end: datetime) -> list[int]:
    """Ids of the (scoped) ledger rows overlapping ``[start, end)``."""
    return list(ledger_qs.filter(period__overlap=(start, end)).values_list("id", flat=True))
