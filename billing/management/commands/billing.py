"""``manage.py billing``: set prices and accounts, aggregate usage, build/finalize invoices.

manage.py billing price --model h100-sxm5-80gb --rate 2.50 --from 2026-11-01T00:00:00Z
manage.py billing price --model h100-sxm5-80gb --tenant ID --discount 15 --from ...
manage.py billing account --tenant ID --time-zone Europe/Berlin --currency EUR
manage.py billing aggregate [--tenant ID] --start ... --end ...
manage.py billing invoice --tenant ID --period 2026-11 [--finalize]

``--tenant`` takes the tenant's id or its name (``--tenant demo``); an unknown one, or a
failure such as a missing price, is one line on stderr and exit status 1 (no traceback).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from nvke.errors import ApiError


def _time(value: str | None):
    if value is None:
        return None
    parsed = parse_datetime(value)
    if parsed is None or parsed.tzinfo is None:
        raise CommandError(f"{value!r} is not an RFC 3339 time with an offset")
    return parsed


def _tenant_id(value: str | None):
    """A tenant's id from ``--tenant``: its UUID or its name (``demo``); CommandError (one
    line, no traceback) when no tenant has it. None stays None."""
    import uuid

    from tenants.models import Tenant

    if value is None:
        return None
    try:
        by_id = Tenant.objects.filter(pk=uuid.UUID(value))
    except ValueError:
        by_id = Tenant.objects.none()
    tenant = by_id.first() or Tenant.objects.filter(name=value).first()
    if tenant is None:
        raise CommandError(f"no tenant with id or name {value!r}")
    return tenant.id


class Command(BaseCommand):
    help = "Billing: prices, accounts, usage aggregation, invoices."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        price = sub.add_parser("price", help="publish a price version")
        price.add_argument("--model", required=True)
        price.add_argument("--profile", default="")
        price.add_argument("--rate", type=Decimal)
        price.add_argument("--discount", type=Decimal, help="percent off list (tenant only)")
        price.add_argument("--currency", default="USD")
        price.add_argument("--tenant")
        price.add_argument("--fraction", type=Decimal, help="billable fraction of a MIG profile")
        price.add_argument(
            "--reservation-rate", type=Decimal, help="per reserved GPU-hour (reservations)"
        )
        price.add_argument("--from", dest="start", required=True)
        price.add_argument("--to", dest="end")
        price.add_argument("--label", default="")
        price.add_argument(
            "--new-currency",
            action="store_true",
            help="publish in a currency the price sheet does not use yet",
        )
        account = sub.add_parser("account", help="set a tenant's time zone / currency")
        account.add_argument("--tenant", required=True)
        account.add_argument("--time-zone")
        account.add_argument("--currency")
        agg = sub.add_parser("aggregate", help="recompute usage records")
        agg.add_argument("--tenant")
        agg.add_argument("--start")
        agg.add_argument("--end")
        inv = sub.add_parser("invoice", help="build (and finalize) a monthly invoice")
        inv.add_argument("--tenant", required=True)
        inv.add_argument("--period", required=True, help="YYYY-MM in the tenant's time zone")
        inv.add_argument("--finalize", action="store_true")

    def handle(self, *args, **opts):
        opts["tenant"] = _tenant_id(opts.get("tenant"))
        try:
            getattr(self, f"_{opts['action']}")(opts)
        except (ApiError, ValueError) as exc:
            raise CommandError(str(getattr(exc, "detail", exc))) from exc

    def _price(self, o):
        from billing.prices import set_price
        from tenants.models import Tenant

        tenant = Tenant.objects.get(pk=o["tenant"]) if o["tenant"] else None  # resolved
        p = set_price(
            gpu_model=o["model"],
            mig_profile=o["profile"],
            hourly_rate=o["rate"],
            discount_pct=o["discount"],
            currency=o["currency"],
            tenant=tenant,
            billable_fraction=o["fraction"],
            reservation_hourly_rate=o.get("reservation_rate"),
            effective_from=_time(o["start"]),
            effective_to=_time(o["end"]),
            label=o["label"],
            new_currency=o["new_currency"],
        )
        self.stdout.write(f"price {p.id}: {p}")

    def _account(self, o):
        from billing.aggregation import get_account

        account = get_account(o["tenant"])
        if o["time_zone"]:
            account.time_zone = o["time_zone"]
        if o["currency"]:
            account.currency = o["currency"]
        account.full_clean(exclude=["tenant"])
        account.save()
        self.stdout.write(f"account {account}")

    def _aggregate(self, o):
        from billing.aggregation import aggregate_usage, tenants_with_usage

        now = timezone.now()
        end = _time(o["end"]) or now
        start = _time(o["start"]) or end - timedelta(days=35)
        tenants = [o["tenant"]] if o["tenant"] else tenants_with_usage(start, end)
        for tid in tenants:
            r = aggregate_usage(tid, start, end, now)
            self.stdout.write(f"{tid}: {r.records} records, {r.gpu_seconds} GPU-s")

    def _invoice(self, o):
        from billing.invoices import build_invoice, finalize_invoice

        invoice = build_invoice(o["tenant"], o["period"])
        if o["finalize"]:
            invoice = finalize_invoice(invoice.id)
        from billing.money import round_money

        # amounts in the currency's minor unit, as the API shows them (stored with 4 places)
        currency = invoice.currency
        total = round_money(invoice.total, currency)
        self.stdout.write(f"{invoice.number} {invoice.status} {total} {currency}")
        for line in invoice.lines.all():
            amount = round_money(line.amount, currency)
            self.stdout.write(f"  {line.position:3d} {amount:>14} {line.description}")
