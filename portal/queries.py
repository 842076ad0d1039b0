"""Read-side helpers that shape data for portal pages; nothing here writes.

Every tenant-owned queryset passed in is already scoped (:func:`nvke.scoping.scope_queryset`);
fleet rows (hosts, GPUs) are read only by the operator console, or through a tenant's own,
scoped node.

Cost (:func:`usage_report`) is the sum of the cost lines of :func:`billing.costs.usage_costs`
— the monthly invoice's own lines, rounded like them — so a month's usage page and its invoice
show the same total.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Sum
from django.utils import timezone

from billing.costs import CostLine, Unpriced, cost_error, costs_of_tenants
from billing.models import BillingAccount, LineKind, UsageRecord
from billing.money import gpu_hours, round_money
from billing.periods import local_date
from catalog.models import GpuModel, XidCode
from clusters.models import Cluster
from fleet.choices import GpuHealth, HostState, HostTenancy
from fleet.models import Gpu, GpuInstance, GpuRollup1h, Host, XidEvent
from fleet.placeable import placeable_gpus_q
from fleet.placement import max_host_gpus
from nodepools.models import NodePool

ZERO = Decimal(0)


# ------------------------------------------------------------------------- node pool form


def region_gpu_models(region: str) -> list[tuple[GpuModel, str]]:
    """GPU models with hosts in ``region`` (retired hosts aside), labelled with free GPUs.

    Label: ``"H100-SXM5-80GB (h100-sxm5-80gb): 6 of 8 GPUs free, up to 8 per node"``; free =
    placeable for a dedicated pool (:func:`fleet.placeable.placeable_gpus_q`) of the GPUs of
    dedicated hosts; shared hosts' GPUs (MIG instances of shared pools only) are named apart:
    ``"… 3 of 16 GPUs free, up to 8 per node; + 8 GPUs on 1 shared host(s)"`` (a fresh-user
    trial read "3 of 24" with the shared host's 8 in the 24, which a dedicated pool never
    gets). Models with free GPUs come first (the form's default is the first).
    """
    hosts = Host.objects.filter(Host.in_region_q(region)).exclude(state=HostState.RETIRED)
    totals: dict[str, int] = {}  # dedicated hosts' GPUs per model
    shared: dict[str, tuple[int, int]] = {}  # (GPUs, hosts) of shared hosts per model
    for model, tenancy, gpus, count in (
        hosts.values_list("gpu_model_id", "tenancy")
        .annotate(n=Sum("gpu_count"), c=Count("id"))
        .order_by("gpu_model_id", "tenancy")
    ):  # one query for both tenancies
        if tenancy == HostTenancy.SHARED:
            shared[model] = (gpus, count)
        else:
            totals[model] = gpus
    free = dict(
        Gpu.objects.filter(placeable_gpus_q(), host__in=hosts)
        .values_list("gpu_model_id")
        .annotate(n=Count("id"))
        .order_by("gpu_model_id")
    )
    out = []
    for model in GpuModel.objects.filter(slug__in=[*totals, *shared]).order_by("slug"):
        label = (
            f"{model.name} ({model.slug}): {free.get(model.slug, 0)} of "
            f"{totals.get(model.slug, 0)} GPUs free, up to {max_host_gpus(model.slug)} per node"
        )
        if model.slug in shared:
            gpus, count = shared[model.slug]
            label += f"; + {gpus} GPUs on {count} shared host(s)"
        out.append((model, label))
    # a model with GPUs free first: the form's default must be one a pool can be placed on
    out.sort(key=lambda item: (free.get(item[0].slug, 0) == 0, item[0].slug))
    return out


# ------------------------------------------------------------------------- usage and cost


@dataclass
class Sums:
    """GPU-seconds, SLA credit and cost of one group; cost per currency is the sum of the
    group's cost lines (:mod:`billing.costs`, each rounded like an invoice line). ``missing``:
    why part of the group has no price (then no cost is shown: never a guess);
    ``covered_seconds``: billable GPU-seconds capacity reservations cover (``covered_by``),
    which cost nothing more: (billable - covered) GPU-hours x price = cost."""

    gpu_seconds: Decimal = ZERO
    credit_seconds: Decimal = ZERO
    cost: dict[str, Decimal] = field(default_factory=dict)
    #: the unit prices (per GPU-hour) the group's usage was rated at: {(currency, price)}
    prices: set[tuple[str, Decimal]] = field(default_factory=set)
    missing: list[dict] = field(default_factory=list)
    covered_seconds: Decimal = ZERO
    covered_by: set[str] = field(default_factory=set)

    def add_usage(self, seconds: Decimal, credit: Decimal) -> None:
        self.gpu_seconds += seconds
        self.credit_seconds += credit

    def add_cost(self, currency: str, amount: Decimal, price: Decimal | None = None) -> None:
        self.cost[currency] = self.cost.get(currency, ZERO) + amount
        if price is not None:
            self.prices.add((currency, price))

    def add_covered(self, seconds: Decimal, reservation: str, currency: str) -> None:
        """Usage ``reservation`` covers: it costs nothing more, so the group's cost is at least
        0 in ``currency`` (shown 0.00, as the usage API; — only for no usage at all)."""
        self.covered_seconds += seconds
        self.covered_by.add(reservation)
        self.cost.setdefault(currency, ZERO)

    @property
    def gpu_hours(self) -> Decimal:
        return gpu_hours(self.gpu_seconds)

    @property
    def billable_gpu_hours(self) -> Decimal:
        return gpu_hours(self.gpu_seconds - self.credit_seconds)

    @property
    def sla_credit_gpu_hours(self) -> Decimal:
        return gpu_hours(self.credit_seconds)

    @property
    def covered_gpu_hours(self) -> Decimal:
        return gpu_hours(self.covered_seconds)

    @property
    def covered_note(self) -> str:
        """``"0.493 GPU-h covered by reservation short-block"``; "" when none is covered."""
        if not self.covered_seconds:
            return ""
        names = ", ".join(sorted(self.covered_by))
        word = "reservation" if len(self.covered_by) == 1 else "reservations"
        return f"{self.covered_gpu_hours.normalize():f} GPU-h covered by {word} {names}"

    @property
    def price_list(self) -> str:
        """``"2.5, 3 USD"``: the unit prices used, ascending."""
        by_currency: dict[str, list[Decimal]] = defaultdict(list)
        for currency, price in sorted(self.prices):
            by_currency[currency].append(price)
        return "; ".join(
            ", ".join(f"{p.normalize():f}" for p in prices) + f" {currency}"
            for currency, prices in by_currency.items()
        )

    @property
    def price_text(self) -> str:
        """The price column: :attr:`price_list`; for usage a reservation covers whole (no unit
        price rated it) ``"covered by reservation r-1f2dfd37"``; "no price" only where a price
        is missing; "—" for no usage. (A trial read "no price" for GB200 usage all covered by
        its reservation, whose price the price sheet has.)"""
        if self.price_list:
            return self.price_list
        if self.missing:
            return "no price"
        if self.covered_by:
            word = "reservation" if len(self.covered_by) == 1 else "reservations"
            return f"covered by {word} {', '.join(sorted(self.covered_by))}"
        return "—"

    @property
    def rounded_cost(self) -> dict[str, Decimal] | None:
        """The cost per currency; None when part of the group has no price (``no_price``)."""
        if self.missing:
            return None
        return {cur: round_money(v, cur) for cur, v in sorted(self.cost.items())}

    @property
    def no_price(self) -> str:
        """Why no cost is shown: ``"no USD price for a100-sxm4-80gb (whole GPU) at …"`` (each
        unpriced model, profile and currency once); "" when every line has a price."""
        if not self.missing:
            return ""
        return "; ".join(m["detail"] for m in cost_error(self.missing)["missing"])


@dataclass
class UsageReport:
    """Usage of ``[start, end)`` by local day, cluster, node pool and (model, MIG profile),
    the reservations' charges, and the total (usage and reservations) over ``[start,
    through)``; a group (or the total) with usage that has no price shows no cost and says
    why (``Sums.no_price``), the others keep theirs; ``unpriced_reservations``: reservations
    with no reservation rate (no cost shown)."""

    start: datetime
    end: datetime
    days: dict[date, Sums]
    clusters: dict[Any, Sums]
    pools: dict[Any, Sums]
    models: dict[tuple[str, str], Sums]
    total: Sums
    names: dict[Any, str]
    aggregated_at: datetime | None
    reservations: list[CostLine] = field(default_factory=list)
    currency: str = "USD"
    through: datetime | None = None
    unpriced_reservations: list[Unpriced] = field(default_factory=list)

    @property
    def currencies(self) -> list[str]:
        return sorted(self.total.cost)

    @property
    def price_error(self) -> str:
        """Why the total cannot be shown ("" when it can)."""
        return self.total.no_price

    def chart(self) -> dict[str, Any]:
        """Chart.js-ready series: labels (days), GPU-hours and cost in the first currency
        (a day with unpriced usage: no cost point)."""
        currency = (self.currencies or ["USD"])[0]
        labels = [d.isoformat() for d in sorted(self.days)]
        costs = []
        for d in sorted(self.days):
            cost = self.days[d].rounded_cost
            costs.append(None if cost is None else float(cost.get(currency, ZERO)))
        return {
            "labels": labels,
            "gpu_hours": [float(self.days[d].gpu_hours) for d in sorted(self.days)],
            "cost": costs,
            "currency": currency,
        }


def _day_range(start: datetime, end: datetime) -> list[date]:
    days, d = [], start.date()
    while datetime.combine(d, datetime.min.time(), tzinfo=start.tzinfo) < end:
        days.append(d)
        d += timedelta(days=1)
    return days


def usage_report(
    records: QuerySet[UsageRecord], start: datetime, end: datetime, tenant_ids: Iterable = ()
) -> UsageReport:
    """GPU-hours of the (scoped) usage records whose bucket starts in ``[start, end)``, and
    their cost from :func:`billing.costs.usage_costs` — the invoice's own lines: usage a
    reservation covers costs 0 (counted as covered, by the reservation's name) and the
    reservation is charged on its own line, up to where the stored usage ends (``through``).

    Days are the tenant's billing-time-zone days (a day with no usage shows as zero when the
    zone is UTC); a day's cost is its usage rated by day (reservations are not split by day).
    ``tenant_ids``: tenants whose reservations count even without usage in the window.
    """
    rows = list(
        records.filter(start__gte=start, start__lt=end).values_list(
            "tenant_id",
            "cluster_id",
            "nodepool_id",
            "gpu_model",
            "mig_profile",
            "start",
            "gpu_seconds",
            "sla_credit_gpu_seconds",
            "computed_at",
        )
    )
    tenants = {r[0] for r in rows} | set(tenant_ids)
    accounts = {
        a.tenant_id: (a.time_zone, a.currency)
        for a in BillingAccount.objects.filter(tenant_id__in=tenants)
    }
    utc = all(accounts.get(t, ("UTC",))[0] == "UTC" for t in tenants)
    days: dict[date, Sums] = {d: Sums() for d in _day_range(start, end)} if utc else {}
    clusters: dict[Any, Sums] = defaultdict(Sums)
    pools: dict[Any, Sums] = defaultdict(Sums)
    models: dict[tuple[str, str], Sums] = defaultdict(Sums)
    total = Sums()
    aggregated_at = None
    for tenant, cluster, pool, model, profile, t, seconds, credit, computed in rows:
        tz, _currency = accounts.get(tenant, ("UTC", "USD"))
        for sums in (
            days.setdefault(local_date(tz, t), Sums()),
            clusters[cluster],
            pools[pool],
            models[(model, profile)],
            total,
        ):
            sums.add_usage(seconds, credit)
        aggregated_at = computed if aggregated_at is None else max(aggregated_at, computed)
    reservations: list[CostLine] = []
    unpriced_reservations: list[Unpriced] = []
    currency, through = "USD", None
    for costs in costs_of_tenants(tenants, start, end):
        currency = costs.currency
        through = costs.through if through is None else min(through, costs.through)
        for ln in costs.usage_lines():
            for sums in (clusters[ln.cluster_id], pools[ln.nodepool_id], total):
                sums.add_cost(costs.currency, ln.amount, ln.unit_price)
            models[(ln.gpu_model, ln.mig_profile)].add_cost(
                costs.currency, ln.amount, ln.unit_price
            )
        for ln in costs.reservation_lines():
            total.add_cost(costs.currency, ln.amount)
            reservations.append(ln)
        for u in costs.unpriced:
            total.missing.append(u.reason)
            if u.kind == LineKind.RESERVATION:
                unpriced_reservations.append(u)
                continue
            for sums in (
                clusters[u.cluster_id],
                pools[u.nodepool_id],
                models[(u.gpu_model, u.mig_profile)],
            ):
                sums.missing.append(u.reason)
        for c in costs.covered:
            for sums in (
                clusters[c.cluster_id],
                pools[c.nodepool_id],
                models[(c.gpu_model, c.mig_profile)],
                total,
            ):
                sums.add_covered(c.gpu_seconds, c.reservation_name, costs.currency)
    for costs in costs_of_tenants(tenants, start, end, by_day=True):
        for ln in costs.usage_lines():
            days.setdefault(ln.day, Sums()).add_cost(costs.currency, ln.amount)
        for u in costs.unpriced:
            if u.kind == LineKind.USAGE:
                days.setdefault(u.day, Sums()).missing.append(u.reason)
        for c in costs.covered:
            days.setdefault(c.day, Sums()).add_covered(
                c.gpu_seconds, c.reservation_name, costs.currency
            )
    names = dict(Cluster.objects.filter(id__in=list(clusters)).values_list("id", "name"))
    names.update(NodePool.objects.filter(id__in=list(pools)).values_list("id", "name"))
    return UsageReport(
        start,
        end,
        dict(sorted(days.items())),
        dict(clusters),
        dict(pools),
        dict(sorted(models.items())),
        total,
        names,
        aggregated_at,
        reservations,
        currency,
        through,
        unpriced_reservations,
    )


# ------------------------------------------------------------------------- fleet overview


def hosts_by_state_and_zone() -> dict[str, Any]:
    """``{"states": [...], "rows": [(zone, [(state, count)], total)], "totals": [...]}``."""
    counts = defaultdict(int)
    for zone, state, n in (
        Host.objects.values_list("zone", "state").annotate(n=Count("id")).order_by()
    ):
        counts[(zone, state)] += n
    states = list(HostState.values)
    zones = sorted({z for z, _ in counts})
    rows = [
        (z, [(s, counts[(z, s)]) for s in states], sum(counts[(z, s)] for s in states))
        for z in zones
    ]
    totals = [sum(counts[(z, s)] for z in zones) for s in states]
    return {"states": states, "rows": rows, "totals": totals, "total": sum(totals)}


def gpus_by_model_and_health() -> list[dict[str, Any]]:
    """Per GPU model: total, healthy, unhealthy, held (whole, by a tenant's node), in_instances
    (a shared host's GPU carrying tenants' GPU instances: its free slices serve shared pools
    only), free (placeable, :mod:`fleet.placeable`, shared hosts' untouched GPUs included)
    and unavailable (none of those: unhealthy, being scrubbed, missing, or on a host not
    schedulable). held + in_instances + free + unavailable = total."""
    rows = (
        Gpu.objects.annotate(
            carries=Exists(GpuInstance.objects.filter(gpu=OuterRef("pk"), holder_id__isnull=False))
        )
        .values("gpu_model_id")
        .annotate(
            total=Count("id"),
            healthy=Count("id", filter=Q(health=GpuHealth.HEALTHY)),
            unhealthy=Count("id", filter=Q(health=GpuHealth.UNHEALTHY)),
            held=Count("id", filter=Q(holder_id__isnull=False)),
            in_instances=Count("id", filter=Q(holder_id__isnull=True, carries=True)),
            free=Count("id", filter=placeable_gpus_q(shared_hosts=True) & Q(carries=False)),
        )
        .order_by("gpu_model_id")
    )
    return [
        dict(r, unavailable=r["total"] - r["held"] - r["in_instances"] - r["free"]) for r in rows
    ]


def utilization_heatmap(hours: int = 24, max_hosts: int = 40, now: datetime | None = None):
    """Mean GPU utilization % per host and UTC hour over the last ``hours`` (1 h rollups).

    ``{"hours": [datetime], "rows": [(host, [pct or None])]}``; the mean over the hour's samples
    that had a utilization (MIG devices report none). Hosts with the most samples first.
    """
    now = now or timezone.now()
    end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    start = end - timedelta(hours=hours)
    buckets = [start + timedelta(hours=i) for i in range(hours)]
    sums = (
        GpuRollup1h.objects.filter(bucket__gte=start, bucket__lt=end)
        .values("host_id", "bucket")
        .annotate(s=Sum("utilization_gpu_pct_sum"), n=Sum("utilization_samples"))
        .order_by()
    )
    cells: dict[Any, dict[datetime, float | None]] = defaultdict(dict)
    weight: dict[Any, int] = defaultdict(int)
    for row in sums:
        cells[row["host_id"]][row["bucket"]] = row["s"] / row["n"] if row["n"] else None
        weight[row["host_id"]] += row["n"] or 0
    order = sorted(cells, key=lambda h: -weight[h])[:max_hosts]
    hosts = Host.objects.in_bulk(order)
    rows = [(hosts[h], [cells[h].get(b) for b in buckets]) for h in order if h in hosts]
    return {"hours": buckets, "rows": rows}


def recent_xids(limit: int = 20) -> list[dict[str, Any]]:
    """The latest Xid events with the catalog's mnemonic, severity and operator action."""
    events = list(XidEvent.objects.select_related("host").order_by("-ts")[:limit])
    codes = XidCode.objects.in_bulk({e.xid for e in events})
    return [{"event": e, "code": codes.get(e.xid)} for e in events]


def driver_versions() -> list[dict[str, Any]]:
    """Driver versions in use: hosts and GPUs per version (retired hosts aside)."""
    return list(
        Host.objects.exclude(state=HostState.RETIRED)
        .values("driver_version")
        .annotate(hosts=Count("id"), gpus=Sum("gpu_count"))
        .order_by("-gpus", "driver_version")
    )
