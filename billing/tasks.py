"""Billing Celery tasks (queue ``billing``): thin, take ids, idempotent.

Beat (``nvke/beat_schedule.py``): ``refresh_usage`` every
``NVKE_BILLING_AGGREGATE_INTERVAL_S`` enqueues ``aggregate_tenant_usage`` per tenant with
ledger rows in the open window; ``build_monthly_invoices`` every
``NVKE_BILLING_INVOICE_INTERVAL_S`` builds each tenant's DRAFT invoice for its previous and
current month (finalizing stays an operator's decision: API or command).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from celery import shared_task
from django.utils import timezone

from nvke.errors import Conflict
from nvke.queueing import clear_pending, enqueue_once

from .aggregation import aggregate_usage, get_account, tenants_with_usage
from .invoices import UNPRICEABLE, build_invoice, tenant_existed_in, tenant_since
from .metrics import INVOICE_BUILD_FAILURES
from .periods import period_of

log = logging.getLogger(__name__)

#: How far back the periodic refresh recomputes (late ledger changes, late Xids).
REFRESH_WINDOW = timedelta(days=35)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def aggregate_tenant_usage(tenant_id: str) -> int:
    """Recompute the tenant's open usage (closed_through or 35 days back, to now)."""
    clear_pending(aggregate_tenant_usage.name, tenant_id)
    now = timezone.now()
    return aggregate_usage(uuid.UUID(tenant_id), now - REFRESH_WINDOW, now, now).records


@shared_task(acks_late=True, ignore_result=True)
def refresh_usage() -> int:
    """Beat: enqueue an aggregation for every tenant with allocations in the window."""
    now = timezone.now()
    ids = tenants_with_usage(now - REFRESH_WINDOW, now)
    return sum(enqueue_once(aggregate_tenant_usage, tid) for tid in ids)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def build_tenant_invoices(tenant_id: str) -> list[str]:
    """Build (rebuild) the tenant's DRAFT invoices of its previous and current month; a month
    that ended before the tenant was created is skipped (:func:`tenant_existed_in`).

    A month that cannot be priced (``missing_price``: usage of a GPU model with no price in
    the tenant's currency; ``missing_reservation_price``: a reservation in force without a
    reservation rate) is not retried — nothing changes until an operator adds the price
    — but reported for an operator: one ERROR line ``invoice_build_failed`` naming the tenant,
    month, model and currency, and ``nvke_invoice_build_failures_total`` (billing/metrics.py);
    the month's DRAFT, if any, is marked stale (``Invoice.build_error``: the console shows why
    and offers no Finalize); the other month is still built. Returns the codes of the months
    that failed."""
    clear_pending(build_tenant_invoices.name, tenant_id)
    now = timezone.now()
    failed = []
    for label in invoice_labels(uuid.UUID(str(tenant_id)), now):
        try:
            build_invoice(uuid.UUID(str(tenant_id)), label, now)
        except Conflict as exc:
            if exc.code not in UNPRICEABLE:
                raise
            report_build_failure(tenant_id, label, exc)
            failed.append(exc.code)
    return failed


def report_build_failure(tenant_id: str, label: str, exc: Conflict) -> None:
    """The operator's alert for an invoice that cannot be built: a log line and a counter."""
    model = str(exc.extra.get("gpu_model", ""))
    currency = str(exc.extra.get("currency", ""))
    INVOICE_BUILD_FAILURES.labels(exc.code, model, currency).inc()
    log.error(
        "invoice_build_failed tenant=%s period=%s code=%s gpu_model=%s currency=%s: %s",
        tenant_id,
        label,
        exc.code,
        model,
        currency,
        exc.detail,
    )


def invoice_labels(tenant_id: uuid.UUID, now: datetime) -> list[str]:
    """The months (``YYYY-MM`` in the tenant's zone) an invoice run builds for the tenant: its
    previous and current month, less those that ended before the tenant existed; ``[]`` when
    the tenant is gone."""
    since = tenant_since(tenant_id)
    if since is None:
        return []
    tz = get_account(tenant_id).time_zone
    current = period_of(tz, now)
    previous = period_of(tz, current.start - timedelta(seconds=1))
    return [p.label for p in (previous, current) if tenant_existed_in(p, since)]


@shared_task(acks_late=True, ignore_result=True)
def build_monthly_invoices() -> int:
    """Beat: enqueue invoice builds for every tenant with allocations in the last 2 months."""
    now = timezone.now()
    ids = tenants_with_usage(now - timedelta(days=62), now)
    return sum(enqueue_once(build_tenant_invoices, tid) for tid in ids)
