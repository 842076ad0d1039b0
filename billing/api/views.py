"""Billing endpoints: cluster usage, usage by group, ledger, invoices, utilization (+ CSV).

Tenant principals see their own tenant's rows, operators every tenant's (all through
:func:`nvke.scoping.scope_queryset`). Decimal quantities and money are JSON strings (exact);
money carries the currency's minor unit (``"60.00"`` USD, ``"6000"`` JPY).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.aggregation import time_zone_of
from billing.costs import add_costs
from billing.invoices import finalize_invoice
from billing.models import Invoice, LedgerEntry, UsageRecord
from billing.money import round_money
from billing.periods import month_to_date, usage_window
from billing.reports import USAGE_GROUPS, scoped_ledger_ids, usage_rows, utilization
from billing.usage import cluster_usage
from clusters.models import Cluster
from nvke.errors import InvalidInput
from nvke.scoping import get_scoped_or_404, scope_queryset
from nvke.validation import BadValue, parse_aware_datetime, parse_float, parse_int
from nvke.viewsets import TenantScopedMixin
from tenants.permissions import IsOperator

from .csvutil import csv_response
from .serializers import (
    INVOICE_CSV_FIELDS,
    LEDGER_CSV_FIELDS,
    LINE_CSV_FIELDS,
    InvoiceDetailSerializer,
    InvoiceSerializer,
    LedgerEntrySerializer,
    invoice_csv_row,
    ledger_csv_row,
    line_csv_row,
)


def _parse_time(value: str | None, name: str):
    """An RFC 3339 query parameter (offset required, 1970..2200) or None when absent."""
    if value is None or value == "":
        return None
    try:
        return parse_aware_datetime(value)
    except BadValue as exc:
        raise InvalidInput(
            f"{name} must be an RFC 3339 timestamp with a UTC offset, e.g. "
            f"2026-11-29T10:00:00Z ({exc})",
            code="invalid_time" if exc.code == "invalid_datetime" else exc.code,
            field=name,
        ) from exc


def _window(request, default_days: int = 31) -> tuple[datetime, datetime]:
    """``start``/``end`` query parameters; default: the last ``default_days`` days to now."""
    end = _parse_time(request.query_params.get("end"), "end") or timezone.now()
    start = _parse_time(request.query_params.get("start"), "start") or end - timedelta(
        days=default_days
    )
    if end <= start:
        raise InvalidInput("end must be after start", code="invalid_time_range", field="end")
    return start, end


def _own_tenant(request) -> list:
    """The caller's tenant id (``[]`` for an operator): its cost window counts in a view even
    with nothing in it (:func:`billing.costs.cost_window`)."""
    tenant = getattr(request.user, "tenant", None)
    return [tenant.pk] if tenant is not None else []


def _report_window(request, tenant_id=None) -> tuple[datetime, datetime]:
    """``start``/``end`` of a usage or utilization view; default: this billing month so far
    (:func:`billing.periods.month_to_date`: ``end`` now, ``start`` the start of the month of
    ``end`` in the billing time zone of ``tenant_id``, else of the caller's tenant; UTC for an
    operator's view of every tenant).

    Both views cut the window the same way (:func:`billing.periods.usage_window`): a ``start``
    or a past ``end`` inside a usage bucket moves to a whole UTC hour (the usage is stored by
    the hour), and the response's ``start``, ``end`` and cost window state the window used. A
    window that holds no whole hour then is a 400 naming ``end``."""
    now = timezone.now()
    end = _parse_time(request.query_params.get("end"), "end") or now
    start = _parse_time(request.query_params.get("start"), "start")
    if tenant_id is None:
        tenant_id = next(iter(_own_tenant(request)), None)
    tz = time_zone_of(tenant_id)
    if start is None:
        start = month_to_date(tz, end)[0]
    if end <= start:
        raise InvalidInput("end must be after start", code="invalid_time_range", field="end")
    start, end = usage_window(tz, start, end, now)
    if end <= start:
        raise InvalidInput(
            f"the window holds no whole hour of usage: usage is stored by the hour, so a start "
            f"or an end inside an hour moves to a whole hour ({start.isoformat()} .. "
            f"{end.isoformat()}); give an end at least one whole hour after start",
            code="invalid_time_range",
            field="end",
        )
    return start, end


def _jsonable(row: dict) -> dict:
    out = {}
    for key, value in row.items():
        if isinstance(value, Decimal):
            out[key] = f"{value:f}"
        elif isinstance(value, dict):
            out[key] = _jsonable(value)
        elif hasattr(value, "isoformat"):
            out[key] = value.isoformat()
        elif value is not None and key.endswith("_id"):
            out[key] = str(value)
        else:
            out[key] = value
    return out


class ClusterUsageView(APIView):
    """GPU-hours (exact, from the allocation ledger) and mean GPU utilization of a cluster.

    ``start`` defaults to the cluster's creation, ``end`` to now; the window is ``[start, end)``.
    """

    @extend_schema(
        parameters=[
            OpenApiParameter("start", str, description="RFC 3339, inclusive"),
            OpenApiParameter("end", str, description="RFC 3339, exclusive"),
        ],
        responses={200: dict},
    )
    def get(self, request, cluster_pk):
        cluster = get_scoped_or_404(Cluster.objects.all(), request.user, pk=cluster_pk)
        now = timezone.now()
        start = _parse_time(request.query_params.get("start"), "start") or cluster.created_at
        end = _parse_time(request.query_params.get("end"), "end") or now
        if end <= start:
            raise InvalidInput("end must be after start", code="invalid_time_range", field="end")
        body = cluster_usage(cluster.id, start, end, now).as_dict()
        body["cluster_id"] = str(cluster.id)
        return Response(body)


#: the window parameters of the usage and utilization views (:func:`_report_window`)
_WINDOW_PARAMS = [
    OpenApiParameter(
        "start",
        str,
        description="RFC 3339, inclusive (default: the start of the billing month of end, in "
        "the tenant's billing time zone; UTC for operators without tenant)",
    ),
    OpenApiParameter("end", str, description="RFC 3339, exclusive (default: now)"),
]

_USAGE_PARAMS = [
    *_WINDOW_PARAMS,
    OpenApiParameter(
        "group_by",
        str,
        description="comma-separated: cluster, pool, model, profile, day, tenant (operators)",
    ),
    OpenApiParameter("cluster", str, description="only this cluster id"),
    OpenApiParameter("nodepool", str, description="only this node pool id"),
    OpenApiParameter("tenant", str, description="operators: only this tenant id"),
]


class UsageView(APIView):
    """Billable GPU-hours from the hourly usage records, grouped and summed.

    Each row (and ``totals``): ``gpu_hours`` (GPU-hours: each GPU or MIG GPU instance held one
    hour x its billable fraction, so a shared 1g.10gb instance-hour is 0.142857; the figure the
    invoice bills and the utilization API's ``allocated_gpu_hours``), ``sla_credit_gpu_hours``,
    ``billable_gpu_hours`` (``gpu_hours`` - SLA credit), ``covered_gpu_hours``, ``cost``,
    ``device_hours`` (not GPU-hours: each GPU or MIG GPU instance held one hour counts 1,
    whatever its fraction), ``gpu_seconds`` (exact) and ``aggregated_at``.

    The window defaults to this billing month so far (``end`` now, ``start`` the start of its
    month in the tenant's billing time zone), as the utilization API and the portal.
    A record counts when its bucket (an hour or less) starts in ``[start, end)``; a ``start``
    or past ``end`` inside an hour first moves to a whole UTC hour (as in the utilization
    API; the response's ``start``/``end`` and ``totals.cost_window`` give the window used);
    ``day`` is the
    day in the tenant's billing time zone. Records are refreshed by the ``billing`` beat task
    (``aggregated_at`` says when); ``billable_gpu_hours`` = ``gpu_hours`` - SLA credit.
    ``cost`` (``{currency: amount}``) is rated as the invoice rates it (:mod:`billing.costs`):
    usage inside a capacity reservation costs 0 and is counted in ``covered_gpu_hours``
    (``covered_by`` names the reservations), so ``(billable_gpu_hours - covered_gpu_hours) x
    unit price = cost``; each reservation's charge is listed under ``reservations`` and counted
    in ``totals.cost``, charged up to where the stored usage ends (``totals.cost_window``).
    A row whose usage has no price gives ``cost: null`` and ``cost_error`` naming the model,
    profile and currency (the other rows keep their cost); ``totals.cost`` is then null, with
    ``totals.cost_error`` (``missing``: every unpriced model, profile and currency).
    """

    csv = False

    def _rows(self, request):
        tenant_param = None
        if request.user.is_operator and request.query_params.get("tenant"):
            tenant_param = _uuid(request.query_params["tenant"], "tenant")
        start, end = _report_window(request, tenant_param)
        raw = request.query_params.get("group_by", "")
        group_by = [g.strip() for g in raw.split(",") if g.strip()]
        allowed = [g for g in USAGE_GROUPS if g != "tenant" or request.user.is_operator]
        bad = [g for g in group_by if g not in allowed]
        if bad:
            raise InvalidInput(
                f"cannot group by {', '.join(bad)}; choose from {', '.join(allowed)}",
                code="invalid_group_by",
                field="group_by",
                extra={"valid_group_by": allowed},
            )
        records = scope_queryset(UsageRecord.objects.all(), request.user)
        only = {}
        for param, lookup in (("cluster", "cluster_id"), ("nodepool", "nodepool_id")):
            if request.query_params.get(param):
                only[lookup] = _uuid(request.query_params[param], param)
                records = records.filter(**{lookup: only[lookup]})
        if tenant_param is not None:
            records = records.filter(tenant_id=tenant_param)
        rows, totals = usage_rows(records, group_by, start, end)
        tenants = set(
            records.filter(start__gte=start, start__lt=end)
            .values_list("tenant_id", flat=True)
            .distinct()
        )
        tenants.update(_own_tenant(request))
        reservations = add_costs(
            rows,
            totals,
            [USAGE_GROUPS[g] for g in group_by],
            tenants,
            start,
            end,
            cluster_id=only.get("cluster_id"),
            nodepool_id=only.get("nodepool_id"),
        )
        return start, end, group_by, rows, totals, reservations

    @extend_schema(parameters=_USAGE_PARAMS, responses={200: dict})
    def get(self, request):
        start, end, group_by, rows, totals, reservations = self._rows(request)
        if self.csv:
            cols = [USAGE_GROUPS[g] for g in group_by]
            cols += [c for c in ("cluster_name", "nodepool_name") if rows and c in rows[0]]
            cols += [
                "gpu_hours",
                "sla_credit_gpu_hours",
                "billable_gpu_hours",
                "covered_gpu_hours",
                "covered_by",
                "cost",
                "currency",
                "cost_error",
                "device_hours",
                "gpu_seconds",
            ]
            for row in rows:
                costs = row["cost"] or {}
                row["currency"] = " + ".join(costs)
                row["cost"] = " + ".join(f"{v:f}" for v in costs.values())
                row["cost_error"] = (row.get("cost_error") or {}).get("detail", "")
                row["covered_by"] = " + ".join(row["covered_by"])
            return csv_response("usage.csv", cols, ([r.get(c) for c in cols] for r in rows))
        return Response(
            {
                "start": start.isoformat(),
                "end": end.isoformat(),
                "group_by": group_by,
                "results": [_jsonable(r) for r in rows],
                "totals": _jsonable(totals),
                "reservations": [_jsonable(r) for r in reservations],
                "aggregated_every_s": settings.NVKE_BILLING_AGGREGATE_INTERVAL_S,
            }
        )


def _uuid(value: str, field: str):
    import uuid

    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidInput(f"{field} must be a UUID", code="invalid_field", field=field) from None


class LedgerViewSet(TenantScopedMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """The allocation ledger: one row per GPU (or MIG instance) and allocation, ``[start, end)``.

    Filters: ``start``/``end`` (rows overlapping the window), ``cluster``, ``nodepool``,
    ``gpu_uuid``. What every usage record and invoice line is recomputed from.
    """

    queryset = LedgerEntry.objects.order_by("id")
    serializer_class = LedgerEntrySerializer
    csv = False

    def get_queryset(self):
        qs = super().get_queryset()
        params = self.request.query_params
        if params.get("start") or params.get("end"):
            start, end = _window(self.request, default_days=36500)
            qs = qs.filter(period__overlap=(start, end))
        for param, lookup in (("cluster", "cluster_id"), ("nodepool", "nodepool_id")):
            if params.get(param):
                qs = qs.filter(**{lookup: _uuid(params[param], param)})
        if params.get("gpu_uuid"):
            qs = qs.filter(gpu_uuid=params["gpu_uuid"])
        return qs

    @extend_schema(
        parameters=[
            OpenApiParameter("start", str),
            OpenApiParameter("end", str),
            OpenApiParameter("cluster", str),
            OpenApiParameter("nodepool", str),
            OpenApiParameter("gpu_uuid", str),
        ]
    )
    def list(self, request, *args, **kwargs):
        if self.csv:
            rows = (ledger_csv_row(e) for e in self.get_queryset().iterator())
            return csv_response("ledger.csv", LEDGER_CSV_FIELDS, rows)
        return super().list(request, *args, **kwargs)


class InvoiceViewSet(TenantScopedMixin, viewsets.ReadOnlyModelViewSet):
    """Invoices (newest period first); detail with lines; ``.csv`` variants; operators may
    finalize a DRAFT (``POST /invoices/{id}/finalize``)."""

    queryset = Invoice.objects.all()
    csv = False
    filterset_fields = ["status", "period_label"]

    def get_queryset(self):
        qs = super().get_queryset()
        if self.action == "retrieve":
            qs = qs.prefetch_related("lines")
        if self.request.user.is_operator and self.request.query_params.get("tenant"):
            qs = qs.filter(tenant_id=_uuid(self.request.query_params["tenant"], "tenant"))
        return qs

    def get_serializer_class(self):
        return InvoiceDetailSerializer if self.action == "retrieve" else InvoiceSerializer

    def list(self, request, *args, **kwargs):
        if self.csv:
            rows = (invoice_csv_row(i) for i in self.filter_queryset(self.get_queryset()))
            return csv_response("invoices.csv", INVOICE_CSV_FIELDS, rows)
        return super().list(request, *args, **kwargs)

    def retrieve(self, request, *args, **kwargs):
        if self.csv:
            invoice = self.get_object()
            rows = (line_csv_row(invoice, ln) for ln in invoice.lines.all())
            return csv_response(f"{invoice.number}.csv", LINE_CSV_FIELDS, rows)
        return super().retrieve(request, *args, **kwargs)


class InvoiceFinalizeView(APIView):
    """``POST /invoices/{id}/finalize`` (operators): rebuild the DRAFT, then freeze it."""

    permission_classes = [IsOperator]

    @extend_schema(request=None, responses={200: InvoiceDetailSerializer})
    def post(self, request, pk):
        invoice = get_scoped_or_404(Invoice.objects.all(), request.user, pk=pk)
        invoice = finalize_invoice(invoice.id)
        return Response(InvoiceDetailSerializer(invoice).data)


class UtilizationView(APIView):
    """Utilization beside cost (never used for the bill): GPU-hour-weighted utilization,
    memory headroom, idle GPUs and the cost of their idle time, per tenant / cluster / pool.

    Per group: ``allocated_gpu_hours`` (GPU-hours, weighted by the billable fraction as the
    usage API's ``gpu_hours``), ``measured_gpu_hours`` (the part with utilization samples),
    ``gpu_utilization_pct``, ``memory_headroom_pct``, ``min_memory_headroom_pct``,
    ``idle_gpu_hours``, ``idle_cost``; per idle GPU: ``idle_hours`` (wall-clock time held in
    its idle hours) and ``idle_gpu_hours`` (the same x its fraction).

    The window defaults to this billing month so far, as the usage API's. Counted over the
    usage API's cost window (``cost_window``, as its ``totals.cost_window``):
    each tenant's allocations up to where its aggregated usage ends, so a group's
    ``allocated_gpu_hours`` are the GPU-hours the usage API bills it, and its
    ``idle_gpu_hours`` (and ``idle_cost``) never exceed them."""

    @extend_schema(
        parameters=[
            *_WINDOW_PARAMS,
            OpenApiParameter("group_by", str, description="tenant, cluster (default) or pool"),
            OpenApiParameter("idle_threshold_pct", float, description="default 5"),
            OpenApiParameter("idle_min_hours", int, description="default 1"),
        ],
        responses={200: dict},
    )
    def get(self, request):
        start, end = _report_window(request)
        group_by = request.query_params.get("group_by", "cluster")
        allowed = ["cluster", "pool"] + (["tenant"] if request.user.is_operator else [])
        if group_by not in allowed:
            raise InvalidInput(
                f"group_by must be one of {', '.join(allowed)}",
                code="invalid_group_by",
                field="group_by",
            )
        params = request.query_params
        try:
            threshold = parse_float(params.get("idle_threshold_pct", "5"), low=0, high=100)
        except BadValue as exc:
            raise InvalidInput(
                f"idle_threshold_pct: {exc}", code=exc.code, field="idle_threshold_pct"
            ) from exc
        try:
            min_hours = parse_int(params.get("idle_min_hours", "1"), low=0, high=24 * 366)
        except BadValue as exc:
            raise InvalidInput(
                f"idle_min_hours: {exc}", code=exc.code, field="idle_min_hours"
            ) from exc
        ledger = scope_queryset(LedgerEntry.objects.all(), request.user)
        report = utilization(
            scoped_ledger_ids(ledger, start, end),
            group_by=group_by,
            start=start,
            end=end,
            now=timezone.now(),
            idle_threshold_pct=threshold,
            idle_min_hours=min_hours,
            tenant_ids=_own_tenant(request),
        )
        return Response(
            {
                "start": start.isoformat(),
                "end": end.isoformat(),
                "cost_window": _jsonable(report["cost_window"]),
                "group_by": group_by,
                "idle_threshold_pct": threshold,
                "idle_min_hours": min_hours,
                "groups": [_money(_jsonable(g)) for g in report["groups"]],
                "idle_gpus": [_money(_jsonable(g)) for g in report["idle_gpus"]],
            }
        )


def _money(row: dict) -> dict:
    if isinstance(row.get("idle_cost"), dict):
        row["idle_cost"] = {
            cur: f"{round_money(Decimal(v), cur):f}" for cur, v in row["idle_cost"].items()
        }
    return row


_CSV = {(200, "text/csv"): str}


class UsageCsvView(UsageView):
    """``usage.csv``: the same rows as ``usage`` (one line per group), as CSV."""

    csv = True

    @extend_schema(parameters=_USAGE_PARAMS, responses=_CSV)
    def get(self, request):
        return super().get(request)


class LedgerCsvViewSet(LedgerViewSet):
    """``ledger.csv``: every ledger row the filters select (not paginated), as CSV."""

    csv = True

    @extend_schema(
        parameters=[
            OpenApiParameter("start", str),
            OpenApiParameter("end", str),
            OpenApiParameter("cluster", str),
            OpenApiParameter("nodepool", str),
            OpenApiParameter("gpu_uuid", str),
        ],
        responses=_CSV,
    )
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)


class InvoiceCsvViewSet(InvoiceViewSet):
    """``invoices.csv`` (one line per invoice) and ``invoices/{id}.csv`` (its lines)."""

    csv = True

    @extend_schema(responses=_CSV)
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(responses=_CSV)
    def retrieve(self, request, *args, **kwargs):
        return super().retrieve(request, *args, **kwargs)
