"""Tenant portal: usage and cost, utilization and idle GPUs, invoices (CSV from the API)."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.models import Invoice, LedgerEntry, UsageRecord
from billing.reports import scoped_ledger_ids, utilization
from billing.tasks import aggregate_tenant_usage
from nvke.queueing import enqueue_once
from nvke.scoping import get_scoped_or_404, scope_queryset
from portal.access import tenant_page
from portal.forms import WindowForm
from portal.queries import usage_report

DEFAULT_DAYS = 14
MAX_DAYS = 400


def _window(form: WindowForm) -> tuple[datetime, datetime, date, date]:
    """``[start, end)`` in UTC from whole days (default: the last 14 days, today included)."""
    today = timezone.now().date()
    first, last = today - timedelta(days=DEFAULT_DAYS - 1), today
    if form.is_valid():
        first = form.cleaned_data.get("start") or first
        last = form.cleaned_data.get("end") or last
    if last < first:
        form.add_error("end", "must not be before From")
        first, last = last, first
    if (last - first).days > MAX_DAYS:
        form.add_error("start", f"at most {MAX_DAYS} days")
        first = last - timedelta(days=MAX_DAYS)
    start = datetime.combine(first, time(), UTC)
    end = datetime.combine(last + timedelta(days=1), time(), UTC)
    return start, end, first, last


@tenant_page
def usage_page(request: HttpRequest) -> HttpResponse:
    """GPU-hours and cost per day (chart + table), by cluster, node pool and GPU model; GPU
    utilization beside cost and the idle GPUs (telemetry, never billed)."""
    form = WindowForm(request.GET or None)
    start, end, first, last = _window(form)
    if not form.is_bound:
        form.initial = {"start": first, "end": last}
    principal = request.principal
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
