"""Operator console: fleet overview, hosts (GPUs, MIG layout, health history, actions),
tenants with quotas and usage, price sheets, invoices. Staff users only.

Host actions call the fleet services the API's host actions call
(:func:`fleet.services.cordon_host` …) and are audited like the API's (``host.cordon`` …).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django import forms
from django.contrib import messages
from django.db import transaction
from django.db.models import Count, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.aggregation import tenants_with_usage
from billing.costs import missing_prices
from billing.invoices import finalize_invoice
from billing.models import Invoice, InvoiceStatus, Price, UsageRecord
from billing.prices import set_price
from billing.reports import usage_rows
from billing.tasks import build_tenant_invoices
from catalog.models import GpuModel
from clusters.choices import Phase
from clusters.models import Cluster, HostedControlPlane
from fleet import health as fleet_health
from fleet import services as fleet_services
from fleet import shared_hosts
from fleet.choices import HostTenancy
from fleet.fragmentation import fragmentation_report
from fleet.models import Gpu, GpuHealthInterval, Host, HostEvent, XidEvent
from nvke.errors import ApiError, InvalidInput, NotFound
from nvke.queueing import enqueue_once
from portal import xid_events
from portal.access import console_page
from portal.forms import (
    ConfirmNameForm,
    CordonForm,
    DrainForm,
    HostFilterForm,
    PriceForm,
    QuotaForm,
    TenantCreateForm,
    XidFilterForm,
    validate_with,
)
from portal.host_drain import DISRUPTIVE, disruption, drain_view
from portal.queries import (
    driver_versions,
    gpus_by_model_and_health,
    hosts_by_state_and_zone,
    recent_xids,
    utilization_heatmap,
)
from tenants import audit, members, quotas
from tenants import services as tenant_services
from tenants.api.serializers import MemberCreateSerializer, QuotaLimitsSerializer, TenantSerializer
from tenants.api.views import quota_body
from tenants.choices import Role
from tenants.models import Membership, Tenant

from .common import call_service, is_htmx

#: seconds between htmx polls of a host's drain progress
POLL_S = 2


@console_page
def overview(request: HttpRequest) -> HttpResponse:
    """Hosts by state and zone, GPUs by model and health, utilization heatmap, recent Xids
    with their actions, NOT_READY hosts, driver versions, fragmentation."""
    report = fragmentation_report()
    return render(
        request,
        "portal/console/overview.html",
        {
            "hosts": hosts_by_state_and_zone(),
            "gpus": gpus_by_model_and_health(),
            "heatmap": utilization_heatmap(),
            "xids": recent_xids(),
            "not_ready": Host.objects.filter(state="NOT_READY").order_by("last_seen_at"),
            "drivers": driver_versions(),
            "fragmentation": report["groups"],
            "moves": report.get("moves", []),
        },
    )


@console_page
def host_list(request: HttpRequest) -> HttpResponse:
    """Hosts, filtered by state, zone and GPU model."""
    form = HostFilterForm(request.GET or None)
    # a shared host's GPU carrying tenants' GPU instances is neither held whole nor free: the
    # row says so (a fresh-user trial read a shared host ALLOCATED with "GPUs held 0 / 8")
    carrying = (
        Gpu.objects.filter(
            host=OuterRef("pk"), holder_id__isnull=True, instances__holder_id__isnull=False
        )
        .values("host")
        .annotate(n=Count("id", distinct=True))
        .values("n")
    )
    hosts = Host.objects.select_related("gpu_model").annotate(
        held=Count("gpus", filter=Q(gpus__holder_id__isnull=False)),
        unhealthy=Count("gpus", filter=Q(gpus__health="UNHEALTHY")),
        in_instances=Coalesce(Subquery(carrying), 0),
    )
    if form.is_valid():
        data = form.cleaned_data
        if data.get("state"):
            hosts = hosts.filter(state=data["state"])
        if data.get("zone"):
            hosts = hosts.filter(zone=data["zone"])
        if data.get("gpu_model"):
            hosts = hosts.filter(gpu_model_id=data["gpu_model"])
    return render(
        request, "portal/console/hosts.html", {"form": form, "hosts": hosts.order_by("hostname")}
    )


def _host_context(host: Host) -> dict:
    gpus = list(Gpu.objects.filter(host=host).select_related("holder_tenant").order_by("index"))
    from nodepools.models import Node

    holders = {
        n.id: n
        for n in Node.objects.filter(id__in=[g.holder_id for g in gpus if g.holder_id])
        .select_related("cluster", "nodepool")
        .only(
            "id",
            "name",
            "gpu_layout",
            "kubernetes_version",
            "cluster__name",
            "nodepool__name",
            "nodepool__isolation",
        )
    }
    rows = []
    for gpu in gpus:
        node = holders.get(gpu.holder_id)
        planned = next(
            (g for g in (node.gpu_layout if node else []) or [] if g.get("gpu_uuid") == gpu.uuid),
            None,
        )
        rows.append({"gpu": gpu, "node": node, "planned": planned})
    return {
        "host": host,
        "gpus": rows,
        "slice_map": _slice_map(host) if host.tenancy == "shared" else None,
        "intervals": GpuHealthInterval.objects.filter(host=host).order_by("-started_at")[:50],
        "events": HostEvent.objects.filter(host=host).order_by("-ts", "-id")[:50],
        "cordon_form": CordonForm(),
        "drain_form": DrainForm(),
        "drain": drain_view(host),
        "poll_s": POLL_S,
    }


def _slice_map(host: Host) -> list[dict]:
    """A shared host's slice map for the page: per GPU its memory slices in order as segments
    ``{"start", "size", "instance" (None = free), "node"}`` covering every slice once."""
    from nodepools.models import Node

    gpus = shared_hosts.slice_map(host)
    holder_ids = [i["holder_id"] for g in gpus for i in g["instances"] if i["holder_id"]]
    nodes = {
        str(n.id): n
        for n in Node.objects.filter(id__in=holder_ids).select_related("cluster", "nodepool")
    }
    out = []
    for gpu in gpus:
        by_start = {i["start"]: i for i in gpu["instances"]}
        segments, slice_no = [], 0
        while slice_no < gpu["memory_slices"]:
            instance = by_start.get(slice_no)
            if instance is None:
                segments.append({"start": slice_no, "size": 1, "instance": None, "node": None})
                slice_no += 1
                continue
            node = nodes.get(instance["holder_id"])
            segments.append(
                {"start": slice_no, "size": instance["size"], "instance": instance, "node": node}
            )
            slice_no += instance["size"]
        out.append({**gpu, "segments": segments})
    return out


@console_page
def host_detail(request: HttpRequest, host_id) -> HttpResponse:
    """A host: GPUs (health, holder, MIG mode and devices as reported, the layout its node
    runs), health history (unhealthy intervals, host events) and actions."""
    try:
        host = Host.objects.select_related("gpu_model").get(pk=host_id)
    except (Host.DoesNotExist, ValueError) as exc:
        raise NotFound() from exc
    context = _host_context(host)
    if is_htmx(request) and request.GET.get("fragment") == "live":
        return render(request, "portal/console/partials/host_live.html", context)
    return render(request, "portal/console/host_detail.html", context)


#: the verbs of the console's host action form (not Xid actions: those are catalog.xid_actions)
CONSOLE_HOST_VERBS = (
    "cordon",
    "uncordon",
    "drain",
    "maintenance",
    "retire",
    "mark-healthy",
    "tenancy",
)


@console_page
def host_confirm(request: HttpRequest, host_id, action: str) -> HttpResponse:
    """The typed-name confirmation of a drain, maintenance or retirement: what it will
    disrupt (the nodes on the host, per tenant), then a form posting to the action."""
    try:
        host = Host.objects.select_related("gpu_model").get(pk=host_id)
    except (Host.DoesNotExist, ValueError) as exc:
        raise NotFound() from exc
    if action not in DISRUPTIVE:
        raise NotFound()
    return _confirm_page(request, host, action, ConfirmNameForm(expected=host.hostname))


def _confirm_page(request, host: Host, action: str, form, status: int = 200) -> HttpResponse:
    drain_form = DrainForm(request.POST or None, initial={"target": request.GET.get("target")})
    return render(
        request,
        "portal/console/host_confirm.html",
        {
            "host": host,
            "action": action,
            "form": form,
            "drain_form": drain_form,
            "impact": disruption(host, action),
        },
        status=status,
    )


@require_POST
@console_page
def host_action(request: HttpRequest, host_id, action: str) -> HttpResponse:
    """Cordon, uncordon, drain (to CORDONED / MAINTENANCE / RETIRED), maintenance, mark the
    host's unhealthy GPUs healthy. A refusal (``invalid_host_state``) is shown on the page."""
    host = get_object_or_404(Host, pk=host_id)
    if action not in CONSOLE_HOST_VERBS:
        raise NotFound()
    actor = request.principal.label
    before = host.state
    cordon, drain = CordonForm(request.POST), DrainForm(request.POST)
    if action in DISRUPTIVE:  # moves tenants' nodes: the host's name typed, checked here
        confirm = ConfirmNameForm(request.POST, expected=host.hostname)
        if not confirm.is_valid():
            return _confirm_page(request, host, action, confirm, status=400)
    try:
        if action == "cordon":
            cordon.is_valid()
            host = fleet_services.cordon_host(
                host, actor=actor, reason=cordon.cleaned_data.get("reason", "")
            )
        elif action == "uncordon":
            host = fleet_services.uncordon_host(host, actor=actor)
        elif action == "drain":
            if not drain.is_valid():
                raise InvalidInput("choose the state to enter", code="invalid_drain_target")
            host = fleet_services.drain_host(
                host,
                actor=actor,
                target=drain.cleaned_data["target"],
                force=drain.cleaned_data.get("force", False),
            )
        elif action in ("maintenance", "retire"):  # drains into MAINTENANCE / RETIRED
            host = fleet_services.drain_host(
                host,
                actor=actor,
                target=DISRUPTIVE[action],
                force=forms.BooleanField(required=False).clean(request.POST.get("force")),
            )
        elif action == "tenancy":
            tenancy = request.POST.get("tenancy", "")
            if tenancy not in HostTenancy.values:
                raise InvalidInput("choose dedicated or shared", code="invalid", field="tenancy")
            before_tenancy = host.tenancy
            host = shared_hosts.set_host_tenancy(host, tenancy=tenancy, actor=actor)
            audit.record(
                actor=actor,
                action="host.tenancy",
                target_type="host",
                target_id=host.pk,
                before={"tenancy": before_tenancy},
                after={"tenancy": host.tenancy},
            )
            messages.success(request, f"{host.hostname}: tenancy now {host.tenancy}.")
            return redirect("console:host", host.pk)
        else:  # one GPU (its open interval's row) or every unhealthy GPU of the host
            gpu = request.POST.get("gpu_uuid") or None
            if gpu is not None and not host.gpus.filter(uuid=gpu).exists():
                raise InvalidInput(f"{gpu} is not a GPU of {host.hostname}", code="unknown_gpu")
            closed = fleet_health.mark_healthy(host, [gpu] if gpu else None, actor=actor)
            messages.success(request, f"Marked healthy: {', '.join(closed) or 'no GPU'}.")
            return redirect("console:host", host.pk)  # audited by mark_healthy itself
    except ApiError as exc:
        messages.error(request, f"{exc.detail} ({exc.code})")
        return redirect("console:host", host.pk)
    audit.record(
        actor=actor,
        action=f"host.{action.replace('-', '_')}",
        target_type="host",
        target_id=host.pk,
        before={"state": before},
        after={"state": host.state},
    )
    messages.success(request, host_action_message(host, action))
    return redirect("console:host", host.pk)


def host_action_message(host: Host, action: str) -> str:
    """The flash message of a host action. A drain still moving nodes says only that it
    started: the count of nodes moved is the live part's (polled every 2 s), and a count in the
    flash went stale above it ("0 of 2 moved" next to a host already in MAINTENANCE)."""
    if host.drain_target:
        return (
            f"{host.hostname}: {action} started, draining into {host.drain_target}; "
            "the nodes' moves are shown live below."
        )
    return f"{host.hostname}: {action} done, now {host.state}."


@console_page
def xid_list(request: HttpRequest) -> HttpResponse:
    """Xid events with filters (host, GPU, code, the catalog's action and severity, a time
    range), newest first, :data:`portal.xid_events.PAGE_SIZE` a page. A bad filter value, an
    unknown parameter or a page past the end answers 400 with the reason beside the filter."""
    choices = xid_events.filter_choices()
    form = XidFilterForm(request.GET or None, **choices)
    events = xid_events.filtered_events({})
    if form.is_bound and form.is_valid():
        events = xid_events.filtered_events(form.cleaned_data)
        form.refuse_page(xid_events.page_count(events))
    if form.errors:  # refused: say why next to the filter (400), show no events
        events = XidEvent.objects.none()
    number = (form.cleaned_data.get("page") if form.is_bound and not form.errors else None) or 1
    page, rows = xid_events.events_page(events, number)
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "portal/console/xids.html",
        {"form": form, "page": page, "rows": rows, "query": query.urlencode()},
        status=400 if form.errors else 200,
    )


# ------------------------------------------------------------------------------ control planes


@console_page
def control_plane_list(request: HttpRequest) -> HttpResponse:
    """Every hosted control plane: cluster, tenant, version (wanted / running), endpoint,
    state, whether kube-apiserver's /readyz answers, restarts, resident memory of its three
    processes and the manager's last word, as the control-plane manager observed them."""
    rows = HostedControlPlane.objects.select_related("cluster", "cluster__tenant").order_by(
        "cluster__tenant__name", "cluster__name"
    )
    return render(request, "portal/console/control_planes.html", {"rows": rows})


# ------------------------------------------------------------------------------ tenants


@console_page
def tenant_list(request: HttpRequest) -> HttpResponse:
    """Tenants with quota use; create a tenant with its first owner (a portal login)."""
    form = TenantCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        tenant = call_service(form, _create_tenant, request.principal, form.cleaned_data)
        if tenant is not None:
            messages.success(
                request,
                f"Tenant {tenant.name} created; {form.cleaned_data['owner_username']} can log "
                "in with the initial password.",
            )
            return redirect("console:tenant", tenant.pk)
    tenants = Tenant.objects.order_by("name").annotate(people=Count("memberships", distinct=True))
    now = timezone.now()
    usage, _ = usage_rows(UsageRecord.objects.all(), ["tenant"], now - timedelta(days=30), now)
    hours = {r["tenant_id"]: r["gpu_hours"] for r in usage}
    rows = [
        (t, quota_body(quotas.quota_for(t.pk, lock=False)), hours.get(t.pk, Decimal(0)))
        for t in tenants
    ]
    return render(request, "portal/console/tenants.html", {"form": form, "rows": rows})


def _create_tenant(principal, data: dict) -> Tenant:
    """A tenant and its owner in one transaction (the API's checks of both bodies first)."""
    validate_with(TenantSerializer, {"name": data["name"]})
    member = validate_with(
        MemberCreateSerializer,
        {"username": data["owner_username"], "email": data.get("owner_email") or ""},
    )
    with transaction.atomic():
        tenant = tenant_services.create_tenant(name=data["name"], principal=principal)
        row = members.add_member(
            principal=principal,
            tenant=tenant,
            username=member["username"],
            email=member["email"],
            role=Role.OWNER,
        )
        row.user.set_password(data["owner_password"])
        row.user.save(update_fields=["password"])
    return tenant


@console_page
def tenant_detail(request: HttpRequest, tenant_id) -> HttpResponse:
    """A tenant: quota limits (editable), members, clusters."""
    try:
        tenant = Tenant.objects.get(pk=tenant_id)
    except (Tenant.DoesNotExist, ValueError) as exc:
        raise NotFound() from exc
    quota = quotas.quota_for(tenant.pk, lock=False)
    initial = {
        "max_clusters": quota.max_clusters,
        "max_nodes": quota.max_nodes,
        "max_gpus": "\n".join(f"{k}={v}" for k, v in sorted(quota.max_gpus.items())),
    }
    form = QuotaForm(request.POST or None, initial=initial)
    body = quota_body(quota)
    below: list[str] = []
    if request.method == "POST" and form.is_valid():
        # a limit below current use is allowed (it stops growth only) but must be meant
        below = quotas.limits_below_use(body, form.cleaned_data)
        if below and not form.cleaned_data.get("confirm_below_use"):
            form.add_error(
                None, "A limit is below current use: tick the confirmation below to set it."
            )
        elif call_service(form, _set_quota, request.principal, tenant, form.cleaned_data):
            done = f"Quota of {tenant.name} updated."
            messages.success(request, done + (f" Below use: {'; '.join(below)}." if below else ""))
            return redirect("console:tenant", tenant.pk)
    return render(
        request,
        "portal/console/tenant_detail.html",
        {
            "tenant": tenant,
            "form": form,
            "quota": body,
            "below_use": below,
            "members": Membership.objects.filter(tenant=tenant).select_related("user"),
            "clusters": Cluster.objects.filter(tenant=tenant).exclude(phase=Phase.DELETED),
        },
    )


def _set_quota(principal, tenant: Tenant, data: dict) -> bool:
    """``PUT /api/v1/quotas/{tenant}`` as the API does it: check, set, audit."""
    limits = validate_with(QuotaLimitsSerializer, data)
    unknown = sorted(
        set(limits.get("max_gpus", {})) - set(GpuModel.objects.values_list("slug", flat=True))
    )
    if unknown:
        raise InvalidInput(
            f"unknown GPU model(s): {', '.join(unknown)}",
            code="unknown_gpu_model",
            field="max_gpus",
        )
    with transaction.atomic():
        before = quotas.quota_for(tenant.pk, lock=True)
        was = {
            "clusters": before.max_clusters,
            "nodes": before.max_nodes,
            "max_gpus": before.max_gpus,
        }
        quota = quotas.set_limits(tenant, **limits)
        audit.record(
            actor=principal.label,
            action="quota.set",
            target_type="quota",
            target_id=tenant.pk,
            tenant=tenant,
            before=was,
            after={
                "clusters": quota.max_clusters,
                "nodes": quota.max_nodes,
                "max_gpus": quota.max_gpus,
            },
        )
    return True


# ------------------------------------------------------------------------------ billing


@console_page
def price_list(request: HttpRequest) -> HttpResponse:
    """Price sheets (list prices and tenant overrides, every version); publish a version."""
    tenants = list(Tenant.objects.order_by("name"))
    form = PriceForm(
        request.POST or None,
        tenants=tenants,
        initial={"effective_from": timezone.now().replace(second=0, microsecond=0)},
    )
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        tenant = Tenant.objects.filter(pk=data["tenant"]).first() if data["tenant"] else None
        price = call_service(form, set_price, **form.payload(tenant))
        if price is not None:
            audit.record(
                actor=request.principal.label,
                action="price.set",
                target_type="price",
                target_id=price.pk,
                tenant_id=price.tenant_id,
                after={
                    "gpu_model": price.gpu_model_id,
                    "mig_profile": price.mig_profile,
                    "hourly_rate": str(price.hourly_rate),
                    "discount_pct": str(price.discount_pct),
                    "currency": price.currency,
                    "effective_from": data["effective_from"].isoformat(),
                },
            )
            messages.success(request, f"Price version published for {price.gpu_model_id}.")
            return redirect("console:prices")
    prices = Price.objects.select_related("tenant").order_by(
        "tenant__name", "gpu_model", "mig_profile", "currency", "-effective"
    )
    return render(request, "portal/console/prices.html", {"form": form, "prices": prices})


@console_page
def invoice_list(request: HttpRequest) -> HttpResponse:
    """Every tenant's invoices; build drafts now; finalize a draft."""
    invoices = Invoice.objects.select_related("tenant").order_by("-period_start", "tenant__name")
    status = request.GET.get("status")
    if status in InvoiceStatus.values:
        invoices = invoices.filter(status=status)
    return render(
        request,
        "portal/console/invoices.html",
        {
            "invoices": invoices[:200],
            "status": status,
            "statuses": InvoiceStatus.values,
            "missing_prices": _missing_prices(),
            # Finalize is offered only once a draft's period has ended (finalize_invoice
            # answers 409 period_not_ended before)
            "now": timezone.now(),
        },
    )


def _missing_prices() -> list[dict]:
    """The unpriced usage an invoice run of the last 2 months would fail on, with tenant
    names (the invoices page's standing alert and the build button's answer)."""
    now = timezone.now()
    start = now - timedelta(days=62)
    missing = missing_prices(tenants_with_usage(start, now), start, now)
    names = dict(
        Tenant.objects.filter(id__in={m["tenant_id"] for m in missing}).values_list("id", "name")
    )
    for m in missing:
        m["tenant"] = names.get(m["tenant_id"], m["tenant_id"])
    return missing


@require_POST
@console_page
def invoices_build(request: HttpRequest) -> HttpResponse:
    """Enqueue the billing worker's draft build for every tenant with recent allocations; the
    message counts those that can be priced (one that cannot is named, and its build marks its
    drafts stale)."""
    now = timezone.now()
    ids = tenants_with_usage(now - timedelta(days=62), now)
    missing = _missing_prices()
    for m in missing:
        if m["code"] == "missing_reservation_price":
            what = (
                f"reservation rate for {m['gpu_model']} (reservation {m['reservation_name']} "
                f"from {m['at']:%Y-%m-%d %H:%M} UTC)"
            )
        else:
            what = (
                f"price for {m['gpu_model']} {m['mig_profile'] or '(whole GPU)'} (usage from "
                f"{m['at']:%Y-%m-%d %H:%M} UTC)"
            )
        messages.error(
            request,
            f"Cannot build {m['tenant']}'s invoice: no {m['currency']} {what}. Add it on the "
            f"Prices page ({m['code']}).",
        )
    blocked = {m["tenant_id"] for m in missing}
    sent = sum(enqueue_once(build_tenant_invoices, tid) for tid in ids if tid not in blocked)
    # a blocked tenant's build is still attempted: it fails and marks its drafts stale
    # (Invoice.build_error: no Finalize offered on stale lines), and builds a month it can price
    for tid in blocked & set(ids):
        enqueue_once(build_tenant_invoices, tid)
    if ids:
        messages.success(request, f"Draft invoices of {sent} tenant(s) are being built.")
    else:
        messages.info(request, "No tenant had allocations in the last 2 months: nothing to bill.")
    return redirect("console:invoices")


@require_POST
@console_page
def invoice_finalize(request: HttpRequest, invoice_id) -> HttpResponse:
    """Rebuild the DRAFT, then freeze it (``billing.invoices.finalize_invoice``)."""
    invoice = get_object_or_404(Invoice, pk=invoice_id)
    try:
        invoice = finalize_invoice(invoice.id)
    except ApiError as exc:
        messages.error(request, f"{exc.detail} ({exc.code})")
    else:
        audit.record(
            actor=request.principal.label,
            action="invoice.finalize",
            target_type="invoice",
            target_id=invoice.pk,
            tenant_id=invoice.tenant_id,
            after={"status": invoice.status, "total": str(invoice.total)},
        )
        messages.success(request, f"Invoice {invoice.number} finalized.")
    return redirect(reverse("console:invoices"))
