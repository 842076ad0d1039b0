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
costs 0 (the reservation covers it) and the reservation line costs 0.93 USD — not 1.23 USD at
the on-demand rate.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from .aggregation import get_account
from .invoices import RECORDS, rate_usage
from .models import LineKind
from .money import gpu_hours, line_amount
from .periods import Period
from .reservations import covered_seconds, reservation_charges


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


@dataclass
class Costs:
    """The cost lines of one tenant's usage in ``[start, end)``, in its invoice ``currency``."""

    tenant_id: uuid.UUID
    currency: str
    start: datetime
    end: datetime
    lines: list[CostLine]

    @property
    def total(self) -> Decimal:
        """Sum of the rounded line amounts (the invoice's total for a whole month)."""
        return sum((ln.amount for ln in self.lines), Decimal(0))

    def usage_lines(self) -> list[CostLine]:
        """The USAGE and SLA_CREDIT lines (those attributable to a cluster and pool)."""
        return [ln for ln in self.lines if ln.kind != LineKind.RESERVATION]

    def reservation_lines(self) -> list[CostLine]:
        return [ln for ln in self.lines if ln.kind == LineKind.RESERVATION]


def usage_costs(
    tenant_id,
    start: datetime,
    end: datetime,
    now: datetime | None = None,
    *,
    by_day: bool = False,
) -> Costs:
    """Rate the tenant's stored usage records whose bucket starts in ``[start, end)``.

    ``by_day``: usage lines are also split by the local day (the tenant's billing time zone)
    of their buckets, each rounded on its own (the day chart); without it, the lines are the
    invoice's. Reservations are charged over ``[start, min(end, now))``. Raises Conflict
    ``missing_price`` / ``missing_reservation_price`` (409) like the invoice when usage or a
    reservation has no price in the tenant's currency: a cost is never shown as a guess.
    """
    now = now or timezone.now()
    account = get_account(tenant_id)
    currency = account.currency
    params = {"tenant": tenant_id, "ps": start, "pe": end}
    window = Period("", start, end)
    with transaction.atomic():  # the rating's temporary tables live until the commit
        rated = rate_usage(
            tenant_id,
            currency,
            window,
            RECORDS,
            params,
            now,
            day_tz=account.time_zone if by_day else None,
        )
        charges = reservation_charges(
            tenant_id, currency, start, end, now, covered_seconds(RECORDS, params)
        )
    lines: list[CostLine] = []
    for r in rated:
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
                reservation_name=c.reservation.name or str(c.reservation.id),
            )
        )
    return Costs(tenant_id, currency, start, end, lines)


def costs_of_tenants(
    tenant_ids: Iterable, start: datetime, end: datetime, *, by_day: bool = False
) -> list[Costs]:
    """:func:`usage_costs` of each tenant (sorted by id), with one ``now``."""
    now = timezone.now()
    tenants = sorted(set(tenant_ids), key=str)
    return [usage_costs(t, start, end, now, by_day=by_day) for t in tenants]


#: the usage API's ``group_by`` fields (:data:`billing.reports.USAGE_GROUPS` values) that a
#: cost line carries
_LINE_FIELDS = ("tenant_id", "cluster_id", "nodepool_id", "gpu_model", "mig_profile", "day")


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
    """Put ``cost`` (``{currency: amount}``) on the usage API's ``rows`` (grouped by
    ``fields``) and ``totals``, from the cost lines of :func:`usage_costs`; returns the
    reservation lines as dicts. A row's cost is the sum of the lines in its group (lines split
    by day when ``day`` is a field, each rounded like an invoice line); the totals are the
    invoice's lines plus the reservations (when no cluster or pool filter is given: a
    reservation belongs to neither). On a missing price every cost is None and
    ``totals["cost_error"]`` names the model, profile and currency (the invoice's 409 body).
    """
    from nvke.errors import Conflict

    try:
        plain = costs_of_tenants(tenant_ids, start, end)
        split = costs_of_tenants(tenant_ids, start, end, by_day=True) if "day" in fields else plain
    except Conflict as exc:
        for row in rows:
            row["cost"] = None
        totals["cost"] = None
        totals["cost_error"] = {"code": exc.code, "detail": str(exc.detail), **exc.extra}
        return []

    def wanted(ln: CostLine) -> bool:
        return (cluster_id is None or ln.cluster_id == cluster_id) and (
            nodepool_id is None or ln.nodepool_id == nodepool_id
        )

    by_key: dict[tuple, dict[str, Decimal]] = {}
    for costs in split:
        for ln in costs.usage_lines():
            if wanted(ln):
                key = tuple(getattr(ln, f) for f in fields)
                bucket = by_key.setdefault(key, {})
                bucket[costs.currency] = bucket.get(costs.currency, Decimal(0)) + ln.amount
    for row in rows:
        row["cost"] = by_key.get(tuple(row.get(f) for f in fields), {})
    total: dict[str, Decimal] = {}
    reservations = []
    for costs in plain:
        for ln in costs.usage_lines():
            if wanted(ln):
                total[costs.currency] = total.get(costs.currency, Decimal(0)) + ln.amount
        if cluster_id is None and nodepool_id is None:
            for ln in costs.reservation_lines():
                total[costs.currency] = total.get(costs.currency, Decimal(0)) + ln.amount
                reservations.append(
                    {
                        "tenant_id": ln.tenant_id,
                        "reservation_id": ln.reservation_id,
                        "reservation_name": ln.reservation_name,
                        "gpu_model": ln.gpu_model,
                        "reserved_gpu_hours": ln.gpu_hours,
                        "unit_price": ln.unit_price,
                        "cost": {costs.currency: ln.amount},
                    }
                )
    totals["cost"] = total
    return reservations


def missing_prices(tenant_ids: Iterable, start: datetime, end: datetime) -> list[dict]:
    """What an invoice build of ``[start, end)`` would fail on: per tenant, each (GPU model,
    MIG profile) whose ledger rows overlap a stretch with no price in the tenant's currency.

    ``[{"tenant_id", "code", "gpu_model", "mig_profile", "currency", "at"}]`` (``at``: the
    start of the first unpriced stretch the usage overlaps), sorted; ``[]`` when every line can
    be priced. ``code`` is ``missing_price`` for usage, ``missing_reservation_price`` for a
    reservation in force without a reservation rate (its entry also names
    ``reservation_name``; ``mig_profile`` ""), as :func:`billing.invoices.build_invoice`
    raises them.
    """
    from django.db.models import Q

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
            used = rows.filter(
                Q(gpu_model=seg.gpu_model, mig_profile=seg.mig_profile),
                period__overlap=(seg.start, seg.end),
            ).exists()
            if used:
                out.append(
                    {
                        "tenant_id": tenant,
                        "code": "missing_price",
                        "gpu_model": seg.gpu_model,
                        "mig_profile": seg.mig_profile,
                        "currency": currency,
                        "at": seg.start,
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
