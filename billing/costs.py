"""What usage costs, for every view of it: the usage API, the portal's usage page and
``nvkectl usage`` read these figures, and the monthly invoice writes the same ones.

:func:`usage_costs` rates a tenant's stored usage records (``billing.UsageRecord``) whose bucket
starts in a window with the invoice's own rating (:func:`billing.invoices.rate_usage`): the unit
price in force at each bucket's start, on-demand usage a capacity reservation covers left out,
SLA credit as its own negative line) and adds the reservations' charges
(:func:`billing.reservations.reservation_charges`). Every line is rounded like an invoice line
(:func:`billing.money.line_amount`), so for a calendar month in the tenant's time zone the
lines equal the invoice's USAGE, SLA_CREDIT and RESERVATION lines one for one, and the total
equals the invoice's (adjustments to earlier invoices aside).

Example (issue 33): a pool drawing from a reservation used 0.493 GPU-h inside it; its usage
costs 0 (the reservation covers it: ``covered``, named) and the reservation line costs
0.93 USD — not 1.23 USD at the on-demand rate.

A cost is never shown as a guess: usage (or a reservation stretch) with no price in the
tenant's currency is listed in ``Costs.unpriced`` with the invoice build's reason
(``missing_price`` …) and no amount; the lines that have a price keep theirs, and the total is
None (it would not be the invoice's). Reservations are charged up to the time the stored usage
is complete (:func:`billing.aggregation.usage_complete_through`), so both halves of the total
cover the same window ``[start, through)``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from nvke.errors import Conflict
from reservations.models import Reservation

from .aggregation import get_account, usage_complete_through
from .invoices import RECORDS, RatedKey, missing_price, rate_usage
from .models import LineKind
from .money import gpu_hours, line_amount, round_money
from .periods import Period
from .reservations import (
    ReservationCharge,
    covered_usage,
    missing_reservation_rate,
    per_reservation,
    reservation_charges,
)


@dataclass(frozen=True)
class CostLine:
    """One rated line: ``kind`` USAGE / SLA_CREDIT (negative) / RESERVATION.

    USAGE and SLA_CREDIT lines name the cluster, node pool, GPU model, MIG profile and unit
    price (per GPU-hour) of the usage; with ``by_day`` also its local ``day``. RESERVATION lines
    name the reservation and its model; their ``gpu_seconds`` are reserved GPU-seconds.
    ``amount`` is rounded to the currency's minor unit like an invoice line.
    """

    kind: str
    tenant_id: uuid.UUID
    cluster_id: uuid.UUID | None
    nodepool_id: uuid.UUID | None
    gpu_model: str
    mig_profile: str
    unit_price: Decimal
    gpu_seconds: Decimal
    amount: Decimal
    day: date | None = None
    reservation_id: uuid.UUID | None = None
    reservation_name: str = ""

    @property
    def gpu_hours(self) -> Decimal:
        return gpu_hours(self.gpu_seconds)


@dataclass(frozen=True)
class Unpriced:
    """Usage (``kind`` USAGE: its GPU-seconds, SLA credit not taken off) or a reservation's
    stretch (RESERVATION: reserved GPU-seconds) with no price in the tenant's currency: shown
    with no cost and ``reason``, the invoice build's 409 body ``{"code", "detail",
    "gpu_model", "mig_profile" (usage) / "reservation" (reservation), "currency", "at"}``."""

    kind: str
    tenant_id: uuid.UUID
    cluster_id: uuid.UUID | None
    nodepool_id: uuid.UUID | None
    gpu_model: str
    mig_profile: str
    gpu_seconds: Decimal
    reason: dict
    day: date | None = None
    reservation_id: uuid.UUID | None = None
    reservation_name: str = ""

    @property
    def gpu_hours(self) -> Decimal:
        return gpu_hours(self.gpu_seconds)


@dataclass(frozen=True)
class Covered:
    """Billable GPU-seconds of one cluster / pool / model / profile (/ day) that a capacity
    reservation covers: no usage line bills them, the reservation's own line does."""

    tenant_id: uuid.UUID
    cluster_id: uuid.UUID
    nodepool_id: uuid.UUID
    gpu_model: str
    mig_profile: str
    day: date | None
    reservation_id: uuid.UUID
    reservation_name: str
    gpu_seconds: Decimal


@dataclass
class Costs:
    """The cost lines of one tenant's usage in ``[start, end)``, in its invoice ``currency``;
    ``through``: the end of what they cover (stored usage and reservation charges alike);
    ``unpriced``: what has no price (no line); ``covered``: usage reservations cover."""

    tenant_id: uuid.UUID
    currency: str
    start: datetime
    end: datetime
    lines: list[CostLine]
    unpriced: list[Unpriced] = field(default_factory=list)
    covered: list[Covered] = field(default_factory=list)
    through: datetime | None = None

    @property
    def total(self) -> Decimal | None:
        """Sum of the rounded line amounts (the invoice's total for a whole month); None when
        something has no price (the sum would not be the invoice's)."""
        if self.unpriced:
            return None
        return sum((ln.amount for ln in self.lines), Decimal(0))

    def usage_lines(self) -> list[CostLine]:
        """The USAGE and SLA_CREDIT lines (those attributable to a cluster and pool)."""
        return [ln for ln in self.lines if ln.kind != LineKind.RESERVATION]

    def reservation_lines(self) -> list[CostLine]:
        return [ln for ln in self.lines if ln.kind == LineKind.RESERVATION]


def reason(exc: Conflict) -> dict:
    """A Conflict as the body of its 409: ``{"code", "detail", **extra}``."""
    return {"code": exc.code, "detail": str(exc.detail), **exc.extra}


def usage_through(tenant_id, start: datetime, end: datetime, now: datetime) -> datetime:
    """Where one tenant's cost window of ``[start, end)`` ends: the end of its stored usage
    (:func:`billing.aggregation.usage_complete_through`) clipped into ``[start, end]``. Its
    usage records, its reservations' charges (:func:`usage_costs`) and its utilization and idle
    time (:func:`billing.reports.utilization`) all stop there."""
    return max(start, min(end, usage_complete_through(tenant_id, now)))


def cost_window(
    throughs: Iterable[datetime], start: datetime, end: datetime
) -> dict[str, datetime]:
    """The window a view of several tenants states (``totals.cost_window`` of the usage API,
    ``cost_window`` of the utilization API): ``{"start": start, "end": the earliest of the
    tenants' ends (:func:`usage_through`), or end without a tenant}``."""
    ends = list(throughs)
    return {"start": start, "end": min(ends) if ends else end}


def usage_costs(
    tenant_id,
    start: datetime,
    end: datetime,
    now: datetime | None = None,
    *,
    by_day: bool = False,
) -> Costs:
    """Rate the tenant's stored usage records whose bucket starts in ``[start, end)``.

    ``by_day``: usage lines (and ``covered``, ``unpriced``) are also split by the local day
    (the tenant's billing time zone) of their buckets, each rounded on its own (the day
    chart); without it, the lines are the invoice's. Reservations are charged over
    ``[start, through)``, ``through`` = ``min(end, usage_complete_through(tenant, now))`` (at
    least ``start``): the window the stored usage covers. Usage or a reservation with no price
    in the tenant's currency is listed in ``unpriced`` with the reason the invoice build
    raises (``missing_price`` / ``missing_reservation_price``), never priced by a guess.
    """
    now = now or timezone.now()
    account = get_account(tenant_id)
    currency = account.currency
    through = usage_through(tenant_id, start, end, now)
    params = {"tenant": tenant_id, "ps": start, "pe": end}
    day_tz = account.time_zone if by_day else None
    no_price: list[RatedKey] = []
    no_rate: list[ReservationCharge] = []
    with transaction.atomic():  # the rating's temporary tables live until the commit
        rated = rate_usage(
            tenant_id,
            currency,
            Period("", start, end),
            RECORDS,
            params,
            now,
            day_tz=day_tz,
            unpriced=no_price,
        )
        covered = covered_usage(RECORDS, params, day_tz=day_tz)
        charges = reservation_charges(
            tenant_id, currency, start, end, through, per_reservation(covered), unpriced=no_rate
        )
    lines: list[CostLine] = []
    for r in rated:
        assert r.unit_price is not None  # rate_usage lists the unpriced keys apart
        common = dict(
            tenant_id=tenant_id,
            cluster_id=r.cluster_id,
            nodepool_id=r.nodepool_id,
            gpu_model=r.gpu_model,
            mig_profile=r.mig_profile,
            unit_price=r.unit_price,
            day=r.day,
        )
        lines.append(
            CostLine(
                kind=LineKind.USAGE,
                gpu_seconds=r.gpu_seconds,
                amount=line_amount(r.gpu_seconds, r.unit_price, currency),
                **common,
            )
        )
        if r.credit_gpu_seconds:
            lines.append(
                CostLine(
                    kind=LineKind.SLA_CREDIT,
                    gpu_seconds=-r.credit_gpu_seconds,
                    amount=-line_amount(r.credit_gpu_seconds, r.unit_price, currency),
                    **common,
                )
            )
    for c in charges:
        assert c.unit_price is not None
        lines.append(
            CostLine(
                kind=LineKind.RESERVATION,
                tenant_id=tenant_id,
                cluster_id=None,
                nodepool_id=None,
                gpu_model=c.reservation.gpu_model_id,
                mig_profile="",
                unit_price=c.unit_price,
                gpu_seconds=c.gpu_seconds,
                amount=line_amount(c.gpu_seconds, c.unit_price, currency),
                reservation_id=c.reservation.id,
                reservation_name=_name(c.reservation),
            )
        )
    unpriced = [
        Unpriced(
            kind=LineKind.USAGE,
            tenant_id=tenant_id,
            cluster_id=r.cluster_id,
            nodepool_id=r.nodepool_id,
            gpu_model=r.gpu_model,
            mig_profile=r.mig_profile,
            gpu_seconds=r.gpu_seconds,
            reason=reason(missing_price(r.gpu_model, r.mig_profile, currency, r.first_start)),
            day=r.day,
        )
        for r in no_price
    ]
    unpriced += [
        Unpriced(
            kind=LineKind.RESERVATION,
            tenant_id=tenant_id,
            cluster_id=None,
            nodepool_id=None,
            gpu_model=c.reservation.gpu_model_id,
            mig_profile="",
            gpu_seconds=c.gpu_seconds,
            reason=reason(missing_reservation_rate(c.reservation, currency, c.start)),
            reservation_id=c.reservation.id,
            reservation_name=_name(c.reservation),
        )
        for c in no_rate
    ]
    names = {
        r.id: _name(r)
        for r in Reservation.objects.filter(id__in={c.reservation_id for c in covered})
    }
    covers = [
        Covered(
            tenant_id=tenant_id,
            cluster_id=c.cluster_id,
            nodepool_id=c.nodepool_id,
            gpu_model=c.gpu_model,
            mig_profile=c.mig_profile,
            day=c.day,
            reservation_id=c.reservation_id,
            reservation_name=names.get(c.reservation_id, str(c.reservation_id)),
            gpu_seconds=c.gpu_seconds,
        )
        for c in covered
    ]
    return Costs(tenant_id, currency, start, end, lines, unpriced, covers, through)


def _name(r: Reservation) -> str:
    return r.name or str(r.id)


def costs_of_tenants(
    tenant_ids: Iterable, start: datetime, end: datetime, *, by_day: bool = False
) -> list[Costs]:
    """:func:`usage_costs` of each tenant (sorted by id), with one ``now``."""
    now = timezone.now()
    tenants = sorted(set(tenant_ids), key=str)
    return [usage_costs(t, start, end, now, by_day=by_day) for t in tenants]


def cost_error(reasons: list[dict]) -> dict:
    """What a figure that cannot be shown says instead: the earliest reason (the invoice
    build's 409 body, as :func:`reason`) and ``missing``: each distinct unpriced (code, GPU
    model, MIG profile, currency[, reservation]) once, with its earliest ``detail`` and
    ``at``, sorted."""

    def when(r: dict) -> tuple:
        return (str(r.get("at", "")), r["code"], r["gpu_model"])

    keys = ("code", "gpu_model", "mig_profile", "currency", "reservation")
    first: dict[tuple, dict] = {}
    for r in sorted(reasons, key=when):
        key = tuple((k, str(r[k])) for k in keys if k in r)
        first.setdefault(key, {**dict(key), "detail": str(r["detail"]), "at": r.get("at")})
    return {**min(reasons, key=when), "missing": [first[k] for k in sorted(first)]}


#: the usage API's ``group_by`` fields (:data:`billing.reports.USAGE_GROUPS` values) that a
#: cost line carries
_LINE_FIELDS = ("tenant_id", "cluster_id", "nodepool_id", "gpu_model", "mig_profile", "day")


@dataclass
class _Group:
    cost: dict[str, Decimal] = field(default_factory=dict)
    reasons: list[dict] = field(default_factory=list)
    covered: Decimal = Decimal(0)
    covered_by: set[str] = field(default_factory=set)

    def add_covered(self, c: Covered, currency: str) -> None:
        """Usage a reservation covers: it costs nothing more, so the group's cost is at least
        ``{currency: 0.00}`` (never ``{}``, which means no usage at all)."""
        self.covered += c.gpu_seconds
        self.covered_by.add(c.reservation_name)
        self.cost.setdefault(currency, round_money(Decimal(0), currency))

    def put(self, row: dict) -> None:
        """``cost`` (None with ``cost_error`` when part of it has no price), ``covered_gpu_hours``
        (billable GPU-hours a reservation covers: (billable - covered) x price = cost) and
        ``covered_by`` (the reservations' names)."""
        row["cost"] = None if self.reasons else self.cost
        if self.reasons:
            row["cost_error"] = cost_error(self.reasons)
        row["covered_gpu_hours"] = gpu_hours(self.covered)
        row["covered_by"] = sorted(self.covered_by)


def add_costs(
    rows: list[dict],
    totals: dict,
    fields: list[str],
    tenant_ids: Iterable,
    start: datetime,
    end: datetime,
    *,
    cluster_id=None,
    nodepool_id=None,
) -> list[dict]:
    """Put ``cost`` (``{currency: amount}``), ``covered_gpu_hours`` and ``covered_by`` on the
    usage API's ``rows`` (grouped by ``fields``) and ``totals``, from :func:`usage_costs`;
    returns the reservations (their lines) as dicts.

    A row's cost is the sum of the lines in its group (lines split by day when ``day`` is a
    field, each rounded like an invoice line), so ``(billable_gpu_hours - covered_gpu_hours) x
    unit price = cost`` (to the rounding of its lines). The totals are the invoice's lines plus
    the reservations (when no cluster or pool filter is given: a reservation belongs to
    neither), over ``totals["cost_window"]`` (``{"start", "end"}``: the reservations are
    charged up to where the stored usage ends; with several tenants, the earliest such end).
    A row whose usage, in part, has no price: ``cost`` None and ``cost_error`` (the invoice's
    409 body and ``missing``, :func:`cost_error`); the other rows keep their cost; the total
    is then None too, with ``totals["cost_error"]``.
    """
    plain = costs_of_tenants(tenant_ids, start, end)
    split = costs_of_tenants(tenant_ids, start, end, by_day=True) if "day" in fields else plain

    def wanted(x) -> bool:
        return (cluster_id is None or x.cluster_id == cluster_id) and (
            nodepool_id is None or x.nodepool_id == nodepool_id
        )

    groups: dict[tuple, _Group] = {}

    def group(x) -> _Group:
        return groups.setdefault(tuple(getattr(x, f) for f in fields), _Group())

    for costs in split:
        for ln in costs.usage_lines():
            if wanted(ln):
                cost = group(ln).cost
                cost[costs.currency] = cost.get(costs.currency, Decimal(0)) + ln.amount
        for u in costs.unpriced:
            if u.kind == LineKind.USAGE and wanted(u):
                group(u).reasons.append(u.reason)
        for c in costs.covered:
            if wanted(c):
                group(c).add_covered(c, costs.currency)
    for row in rows:
        groups.get(tuple(row.get(f) for f in fields), _Group()).put(row)
    total = _Group()
    reservations = []
    both = cluster_id is None and nodepool_id is None
    for costs in plain:
        for ln in costs.usage_lines():
            if wanted(ln):
                total.cost[costs.currency] = total.cost.get(costs.currency, Decimal(0)) + ln.amount
        for c in costs.covered:
            if wanted(c):
                total.add_covered(c, costs.currency)
        for u in costs.unpriced:
            if u.kind == LineKind.USAGE and wanted(u):
                total.reasons.append(u.reason)
        if not both:
            continue
        for ln in costs.reservation_lines():
            total.cost[costs.currency] = total.cost.get(costs.currency, Decimal(0)) + ln.amount
            reservations.append(
                {
                    "tenant_id": ln.tenant_id,
                    "reservation_id": ln.reservation_id,
                    "reservation_name": ln.reservation_name,
                    "gpu_model": ln.gpu_model,
                    "reserved_gpu_hours": ln.gpu_hours,
                    "unit_price": ln.unit_price,
                    "cost": {costs.currency: ln.amount},
                    "charged_through": costs.through,
                }
            )
        for u in costs.unpriced:
            if u.kind == LineKind.RESERVATION:
                total.reasons.append(u.reason)
                reservations.append(
                    {
                        "tenant_id": u.tenant_id,
                        "reservation_id": u.reservation_id,
                        "reservation_name": u.reservation_name,
                        "gpu_model": u.gpu_model,
                        "reserved_gpu_hours": gpu_hours(u.gpu_seconds),
                        "unit_price": None,
                        "cost": None,
                        "cost_error": cost_error([u.reason]),
                        "charged_through": costs.through,
                    }
                )
    total.put(totals)
    totals["cost_window"] = cost_window(
        (c.through for c in plain if c.through is not None), start, end
    )
    return reservations


def missing_prices(tenant_ids: Iterable, start: datetime, end: datetime) -> list[dict]:
    """What an invoice build of ``[start, end)`` would fail on: per tenant, each (GPU model,
    MIG profile) whose ledger rows overlap a stretch with no price in the tenant's currency.

    ``[{"tenant_id", "code", "gpu_model", "mig_profile", "currency", "at"}]`` (``at``: the
    first usage in the unpriced stretch, :func:`billing.ledger.first_use`, as the usage API
    and the invoice's 409 name it), sorted; ``[]`` when every line can
    be priced. ``code`` is ``missing_price`` for usage, ``missing_reservation_price`` for a
    reservation in force without a reservation rate (its entry also names
    ``reservation_name``; ``mig_profile`` ""), as :func:`billing.invoices.build_invoice`
    raises them.
    """
    from .ledger import first_use
    from .models import BillingAccount, LedgerEntry
    from .prices import rate_segments
    from .reservations import unpriced_reservations

    out = []
    for tenant in sorted(set(tenant_ids), key=str):
        account = BillingAccount.objects.filter(tenant_id=tenant).first()
        currency = account.currency if account else "USD"
        rows = LedgerEntry.objects.filter(tenant_id=tenant, period__overlap=(start, end))
        pairs = set(rows.values_list("gpu_model", "mig_profile").distinct())
        for seg in rate_segments(
            tenant_id=tenant, currency=currency, pairs=pairs, start=start, end=end
        ):
            if seg.unit_price is not None:
                continue
            at = first_use(tenant, seg.gpu_model, seg.mig_profile, seg.start, seg.end)
            if at is not None:
                out.append(
                    {
                        "tenant_id": tenant,
                        "code": "missing_price",
                        "gpu_model": seg.gpu_model,
                        "mig_profile": seg.mig_profile,
                        "currency": currency,
                        "at": at,
                    }
                )
        for item in unpriced_reservations(tenant, currency, start, end):
            out.append(
                {
                    "tenant_id": tenant,
                    "code": "missing_reservation_price",
                    "gpu_model": item["gpu_model"],
                    "mig_profile": "",
                    "currency": currency,
                    "at": item["at"],
                    "reservation_name": item["reservation_name"],
                }
            )
    return out
