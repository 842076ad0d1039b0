"""Tenant portal: usage and cost, utilization and idle GPUs, invoices (CSV from the API)."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.aggregation import time_zone_of
from billing.models import Invoice, LedgerEntry, UsageRecord
from billing.periods import local_date, local_midnight
from billing.reports import scoped_ledger_ids, utilization
from billing.tasks import aggregate_tenant_usage
from nvke.queueing import enqueue_once
from nvke.scoping import get_scoped_or_404, scope_queryset
from portal.access import tenant_page
from portal.forms import WindowForm
from portal.queries import usage_report

MAX_DAYS = 400


def _window(form: WindowForm, tz: str) -> tuple[datetime, datetime, date, date, bool]:
    """``[start, end)`` in UTC from whole days of the billing time zone ``tz``, both
    inclusive; default: this billing month so far (from its 1st to today), the window of the
    usage and utilization APIs (:func:`billing.periods.month_to_date`). Only ``To`` given:
    from the 1st of its month. Returns ``(start, end, first, last, defaulted)``."""
    today = local_date(tz, timezone.now())
    first = last = None
    if form.is_valid():
        first = form.cleaned_data.get("start")
        last = form.cleaned_data.get("end")
    defaulted = first is None and last is None
    last = last or today
    first = first or last.replace(day=1)
    if last < first:
        form.add_error("end", "must not be before From")
        first, last = last, first
    if (last - first).days > MAX_DAYS:
        form.add_error("start", f"at most {MAX_DAYS} days")
        first = last - timedelta(days=MAX_DAYS)
    start = local_midnight(tz, first)
    end = local_midnight(tz, last + timedelta(days=1))
    return start, end, first, last, defaulted


@tenant_page
def usage_page(request: HttpRequest) -> HttpResponse:
    """GPU-hours and cost per day (chart + table), by cluster, node pool and GPU model; GPU
    utilization beside cost and the idle GPUs (telemetry, never billed)."""
    principal = request.principal
    tz = time_zone_of(principal.tenant.pk if principal.tenant is not None else None)
    form = WindowForm(request.GET or None, time_zone=tz)
    start, end, first, last, defaulted = _window(form, tz)
    if not form.is_bound:
        form.initial = {"start": first, "end": last}
    report = usage_report(
        scope_queryset(UsageRecord.objects.all(), principal),
        start,
        end,
        tenant_ids=[principal.tenant.pk] if principal.tenant is not None else [],
    )
    ledger = scope_queryset(LedgerEntry.objects.all(), principal)
    util = utilization(
        scoped_ledger_ids(ledger, start, end),
        group_by="cluster",
        start=start,
        end=end,
        now=timezone.now(),
        tenant_ids=[principal.tenant.pk] if principal.tenant is not None else [],
    )
    names = dict(report.names)
    from clusters.models import Cluster

    names.update(
        scope_queryset(Cluster.objects.all(), principal)
        .filter(id__in=[g["cluster_id"] for g in util["groups"]])
        .values_list("id", "name")
    )
    api_query = urlencode(
        {
            "start": start.isoformat().replace("+00:00", "Z"),
            "end": end.isoformat().replace("+00:00", "Z"),
            "group_by": "day,cluster,pool,model,profile",
        }
    )
    return render(
        request,
        "portal/usage.html",
        {
            "form": form,
            "report": report,
            "chart": report.chart(),
            "first": first,
            "last": last,
            "time_zone": tz,
            "default_window": defaulted,
            "utilization": util,
            "names": names,
            "csv_url": reverse("billing:usage-csv") + "?" + api_query,
            "can_refresh": principal.tenant is not None and principal.can_write,
        },
    )


@require_POST
@tenant_page
def usage_refresh(request: HttpRequest) -> HttpResponse:
    """Ask the billing worker to recompute the tenant's open usage now (the beat does it every
    few minutes anyway); the same task, enqueued at most once at a time."""
    tenant = request.principal.tenant
    if tenant is None or not request.principal.can_write:
        messages.error(request, "Only a tenant's members can ask for a recomputation.")
    elif enqueue_once(aggregate_tenant_usage, tenant.pk):
        messages.success(request, "Usage is being recomputed; reload in a few seconds.")
    else:
        messages.info(request, "A recomputation is already queued.")
    query = request.GET.urlencode()
    return redirect(reverse("portal:usage") + (f"?{query}" if query else ""))


@tenant_page
def invoice_list(request: HttpRequest) -> HttpResponse:
    """Invoices, newest period first, with CSV downloads (served by the API)."""
    invoices = scope_queryset(Invoice.objects.select_related("tenant"), request.principal)
    return render(request, "portal/invoices.html", {"invoices": invoices})


@tenant_page
def invoice_detail(request: HttpRequest, invoice_id) -> HttpResponse:
    """One invoice with its lines (usage, SLA credits, adjustments)."""
    invoice = get_scoped_or_404(
        Invoice.objects.select_related("tenant"), request.principal, pk=invoice_id
    )
    lines = invoice.lines.select_related("cluster", "nodepool", "adjusts").order_by("position")
    return render(request, "portal/invoice_detail.html", {"invoice": invoice, "lines": lines})
