"""Price sheets: versioned hourly rates, tenant overrides, and the rate in force at any time.

Resolution of the unit price (per billable GPU-hour) of a tenant's (model, profile) at ``t``,
in the tenant's currency, from the versions in force at ``t``:

1. the tenant's override for (model, profile), else for (model, whole GPU): its
   ``hourly_rate`` (committed-use rate), or ``discount_pct`` off the list rate below;
2. else the list price for (model, profile), else for (model, whole GPU).

A version applies from ``lower(effective)`` (inclusive) to ``upper(effective)`` (exclusive):
a change applies from its effective time only. :func:`set_price` ends the version in force at
the new one's start, so versions of one key never overlap (also an exclusion constraint).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import Q
from psycopg.types.range import Range

from catalog.services import CatalogError, get_gpu_model, resolve_mig_profile
from nvke.errors import Conflict, InvalidInput
from nvke.validation import BadValue, to_utc

from .models import Price
from .money import minor_unit

HUNDRED = Decimal(100)


def set_price(
    *,
    gpu_model: str,
    effective_from: datetime,
    hourly_rate: Decimal | None = None,
    discount_pct: Decimal | None = None,
    currency: str = "USD",
    mig_profile: str = "",
    tenant=None,
    effective_to: datetime | None = None,
    billable_fraction: Decimal | None = None,
    label: str = "",
    new_currency: bool = False,
    reservation_hourly_rate: Decimal | None = None,
) -> Price:
    """Publish a new price version from ``effective_from`` (to ``effective_to`` or open).

    The version in force at ``effective_from`` (same tenant, model, profile, currency) is ended
    there. Raises InvalidInput (``unknown_gpu_model``, ``unknown_mig_profile``,
    ``unknown_currency``, ``invalid_price``, ``price_out_of_range``, ``currency_not_of_sheet``)
    or Conflict ``price_version_exists_later`` when a version already starts after
    ``effective_from`` (end or remove it first).

    One currency per price sheet (:func:`sheet_currencies`): a currency the sheet does not use
    yet is refused unless ``new_currency`` says it is meant.
    """
    try:
        model = get_gpu_model(gpu_model)
        if mig_profile:
            mig_profile = resolve_mig_profile(model, mig_profile).name
    except CatalogError as exc:
        raise InvalidInput(str(exc), code=exc.code, field="gpu_model") from exc
    try:
        minor_unit(currency)
    except ValueError as exc:
        raise InvalidInput(str(exc), code="unknown_currency", field="currency") from exc
    used = sheet_currencies(tenant)
    if used and currency not in used and not new_currency:
        sheet = f"the price sheet of {tenant.name}" if tenant else "the list price sheet"
        raise InvalidInput(
            f"{sheet} is in {', '.join(used)}; publish in {currency} only as an explicitly "
            "chosen new currency",
            code="currency_not_of_sheet",
            field="currency",
        )
    if (hourly_rate is None) == (discount_pct is None) or (discount_pct is not None and not tenant):
        raise InvalidInput(
            "give hourly_rate, or discount_pct for a tenant override (not both)",
            code="invalid_price",
            field="hourly_rate",
        )
    # the table's CHECK constraints, checked first so a bad value is a 400 naming the field,
    # not an IntegrityError
    for name, value, low, high, low_open in (
        ("hourly_rate", hourly_rate, Decimal(0), Decimal("99999999"), False),
        ("discount_pct", discount_pct, Decimal(0), Decimal(100), False),
        ("billable_fraction", billable_fraction, Decimal(0), Decimal(1), True),
        (
            "reservation_hourly_rate",
            reservation_hourly_rate,
            Decimal(0),
            Decimal("99999999"),
            False,
        ),
    ):
        if value is None:
            continue
        if not isinstance(value, Decimal) or not value.is_finite():
            raise InvalidInput(f"{name} must be a finite number", code="invalid_price", field=name)
        if value > high or value < low or (low_open and value == low):
            interval = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
            raise InvalidInput(
                f"{name} must lie in {interval}", code="price_out_of_range", field=name
            )
    for name, value in (("effective_from", effective_from), ("effective_to", effective_to)):
        if value is not None:
            try:
                to_utc(value)
            except BadValue as exc:
                raise InvalidInput(str(exc), code=exc.code, field=name) from exc
    if effective_to is not None and effective_to <= effective_from:
        raise InvalidInput(
            "effective_to must be after effective_from", code="invalid_price", field="effective_to"
        )
    with transaction.atomic():
        versions = Price.objects.select_for_update().filter(
            tenant=tenant, gpu_model=model, mig_profile=mig_profile, currency=currency
        )
        if versions.filter(effective__startswith__gt=effective_from).exists():
            raise Conflict(
                "a later price version exists; end or remove it first",
                code="price_version_exists_later",
                field="effective_from",
            )
        current = versions.filter(effective__contains=effective_from).first()
        if current is not None:
            if current.effective.lower == effective_from:
                raise Conflict(
                    "a price version already starts at this time",
                    code="price_version_exists_later",
                    field="effective_from",
                )
            current.effective = Range(current.effective.lower, effective_from, "[)")
            current.save(update_fields=["effective"])
        return Price.objects.create(
            tenant=tenant,
            gpu_model=model,
            mig_profile=mig_profile,
            currency=currency,
            effective=Range(effective_from, effective_to, "[)"),
            hourly_rate=hourly_rate,
            discount_pct=discount_pct,
            billable_fraction=billable_fraction,
            reservation_hourly_rate=reservation_hourly_rate,
            label=label,
        )


def sheet_currencies(tenant) -> list[str]:
    """The currencies (ISO 4217, sorted) of a price sheet: the list prices (``tenant`` None) or
    a tenant's overrides, whose sheet is also in its billing account's currency (the currency
    its invoices are in). ``[]`` for a sheet with no price and no account yet."""
    from .models import BillingAccount

    used = set(
        Price.objects.filter(tenant=tenant).order_by().values_list("currency", flat=True).distinct()
    )
    if tenant is not None:
        used.update(BillingAccount.objects.filter(tenant=tenant).values_list("currency", flat=True))
    return sorted(used)


def price_cuts(tenant_id, start: datetime, end: datetime) -> list[datetime]:
    """Instants in ``(start, end)`` at which a list price or the tenant's override changes."""
    cuts: set[datetime] = set()
    rows = Price.objects.filter(
        Q(tenant_id=tenant_id) | Q(tenant__isnull=True), effective__overlap=(start, end)
    )
    for effective in rows.values_list("effective", flat=True):
        for bound in (effective.lower, effective.upper):
            if bound is not None and start < bound < end:
                cuts.add(bound)
    return sorted(cuts)


@dataclass(frozen=True)
class RateSegment:
    """The unit price of (model, profile) over ``[start, end)``; ``unit_price`` None = no price.

    ``source`` names the versions used (for the invoice line), e.g. ``list 2.50`` or
    ``tenant -15% of list 2.50``.
    """

    gpu_model: str
    mig_profile: str
    start: datetime
    end: datetime
    unit_price: Decimal | None
    source: str


def _pick(rows: list[Price], profile: str, t: datetime) -> Price | None:
    live = [p for p in rows if _contains(p.effective, t)]
    exact = [p for p in live if p.mig_profile == profile]
    fallback = [p for p in live if p.mig_profile == ""]
    return (exact or fallback or [None])[0]


def _contains(effective: Range, t: datetime) -> bool:
    return (effective.lower is None or effective.lower <= t) and (
        effective.upper is None or t < effective.upper
    )


def rate_segments(
    *,
    tenant_id,
    currency: str,
    pairs: set[tuple[str, str]],
    start: datetime,
    end: datetime,
) -> list[RateSegment]:
    """Piecewise-constant unit prices of each (model, profile) in ``pairs`` over the window."""
    models = {m for m, _ in pairs}
    rows = list(
        Price.objects.filter(
            Q(tenant_id=tenant_id) | Q(tenant__isnull=True),
            gpu_model_id__in=models,
            currency=currency,
            effective__overlap=(start, end),
        )
    )
    out = []
    for model, profile in sorted(pairs):
        mine = [p for p in rows if p.gpu_model_id == model and p.mig_profile in ("", profile)]
        bounds = {start, end}
        for p in mine:
            for b in (p.effective.lower, p.effective.upper):
                if b is not None and start < b < end:
                    bounds.add(b)
        ordered = sorted(bounds)
        for s, e in itertools.pairwise(ordered):
            tenant_row = _pick([p for p in mine if p.tenant_id is not None], profile, s)
            list_row = _pick([p for p in mine if p.tenant_id is None], profile, s)
            price, source = _resolve(tenant_row, list_row)
            out.append(RateSegment(model, profile, s, e, price, source))
    return out


def _resolve(tenant_row: Price | None, list_row: Price | None) -> tuple[Decimal | None, str]:
    if tenant_row is not None and tenant_row.hourly_rate is not None:
        return tenant_row.hourly_rate, tenant_row.label or "tenant rate"
    if list_row is None:
        return None, "no price"
    if tenant_row is not None:
        pct = tenant_row.discount_pct
        price = list_row.hourly_rate * (HUNDRED - pct) / HUNDRED
        return price, f"{tenant_row.label or 'discount'} -{pct}% of list {list_row.hourly_rate}"
    return list_row.hourly_rate, list_row.label or "list price"


def reservation_rate_segments(
    *, tenant_id, currency: str, gpu_model: str, start: datetime, end: datetime
) -> list[RateSegment]:
    """Piecewise-constant reservation rates (per reserved GPU-hour) of ``gpu_model`` over
    ``[start, end)``: the tenant's ``reservation_hourly_rate``, else the list's (less the
    tenant's ``discount_pct`` when its override is a discount); ``unit_price`` None = none."""
    rows = list(
        Price.objects.filter(
            Q(tenant_id=tenant_id) | Q(tenant__isnull=True),
            gpu_model_id=gpu_model,
            mig_profile="",
            currency=currency,
            effective__overlap=(start, end),
        )
    )
    bounds = {start, end}
    for p in rows:
        for b in (p.effective.lower, p.effective.upper):
            if b is not None and start < b < end:
                bounds.add(b)
    out = []
    for s, e in itertools.pairwise(sorted(bounds)):
        tenant_row = _pick([p for p in rows if p.tenant_id is not None], "", s)
        list_row = _pick([p for p in rows if p.tenant_id is None], "", s)
        if tenant_row is not None and tenant_row.reservation_hourly_rate is not None:
            price, source = tenant_row.reservation_hourly_rate, "tenant reservation rate"
        elif list_row is not None and list_row.reservation_hourly_rate is not None:
            price, source = list_row.reservation_hourly_rate, "list reservation rate"
            if tenant_row is not None and tenant_row.discount_pct is not None:
                pct = tenant_row.discount_pct
                price = price * (HUNDRED - pct) / HUNDRED
                source = f"-{pct}% of list reservation rate {list_row.reservation_hourly_rate}"
        else:
            price, source = None, "no reservation rate"
        out.append(RateSegment(gpu_model, "", s, e, price, source))
    return out
