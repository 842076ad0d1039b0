"""Tenant portal: tenant switcher, API keys, members and roles, quotas, audit log."""

from __future__ import annotations

import uuid
from contextlib import suppress
from datetime import UTC, datetime, time

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from nvke import public_url
from nvke.errors import ApiError
from nvke.scoping import scope_queryset
from portal.access import (
    TENANT_SESSION_KEY,
    memberships_of,
    require_admin,
    require_owner,
    tenant_page,
)
from portal.forms import (
    ApiKeyForm,
    AuditFilterForm,
    RoleForm,
    TenantChoiceForm,
    validate_with,
)
from portal.invite_forms import InviteForm
from portal.list_filters import MemberFilter
from portal.listing import paginate
from tenants import invitations, members, quotas, services
from tenants.api.serializers import (
    ApiKeyCreateSerializer,
    MemberRoleSerializer,
)
from tenants.api.views import quota_body
from tenants.choices import Role
from tenants.models import ApiKey, AuditEvent, Invitation, Membership

from .common import call_service

AUDIT_PAGE = 50


def _safe_next(request: HttpRequest, default: str) -> str:
    target = request.POST.get("next") or request.GET.get("next") or default
    if url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        return target
    return default


def tenant_choose(request: HttpRequest) -> HttpResponse:
    """The tenant switcher: a user in several tenants picks the one to act in.

    Only a tenant the user is a member of can be chosen; the choice is stored in the session
    (``nvke_tenant_id``), where the API's session authentication reads it too.
    """
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path(), login_url=reverse("portal:login"))
    rows = memberships_of(request.user)
    if not rows:
        return render(request, "portal/no_tenant.html", status=403)
    form = TenantChoiceForm(request.POST or None, memberships=rows)
    if request.method == "POST" and form.is_valid():
        request.session[TENANT_SESSION_KEY] = form.cleaned_data["tenant"]
        chosen = next(m for m in rows if str(m.tenant_id) == form.cleaned_data["tenant"])
        messages.success(request, f"Now working in {chosen.tenant.name}.")
        return redirect(_safe_next(request, reverse("portal:cluster-list")))
    return render(
        request,
        "portal/tenant_choose.html",
        {"form": form, "next": _safe_next(request, reverse("portal:cluster-list"))},
    )


# ------------------------------------------------------------------------------ API keys


def _tenant_or_404(request: HttpRequest):
    """Keys and members belong to one tenant: operators manage them from the console."""
    from nvke.errors import NotFound

    if request.principal.tenant is None:
        raise NotFound()
    return request.principal.tenant


@never_cache
@tenant_page
def api_keys(request: HttpRequest) -> HttpResponse:
    """List the tenant's keys; create one (the key is shown once, on the answer page)."""
    if (deny := require_admin(request)) is not None:
        return deny
    tenant = _tenant_or_404(request)
    form = ApiKeyForm(request.POST or None)
    created = None
    if request.method == "POST" and form.is_valid():
        body = {
            "name": form.cleaned_data["name"],
            "role": form.cleaned_data["role"],
            "expiry_date": form.cleaned_data["expiry_date"],
        }
        data = call_service(form, validate_with, ApiKeyCreateSerializer, body)
        if data is not None:
            created = call_service(
                form, services.issue_api_key, principal=request.principal, tenant=tenant, **data
            )
            if created is not None:
                form = ApiKeyForm()
    keys = ApiKey.objects.filter(tenant=tenant).order_by("-created")
    # roles a key may have: no stronger than the caller's own
    rank = services.ROLE_RANK
    allowed = [r for r in Role if rank[r] <= rank[request.principal.role]]
    form.fields["role"].choices = [(r.value, r.label) for r in allowed]
    return render(
        request,
        "portal/api_keys.html",
        {
            "form": form,
            "keys": keys,
            "created": created,
            "now": timezone.now(),
        },
    )


@tenant_page
def api_key_revoke(request: HttpRequest, prefix: str) -> HttpResponse:
    """Confirm, then revoke (irreversible)."""
    if (deny := require_admin(request)) is not None:
        return deny
    tenant = _tenant_or_404(request)
    key = ApiKey.objects.filter(tenant=tenant, prefix=prefix).first()
    if key is None:
        return _not_found(request)
    if request.method == "POST":
        try:
            services.revoke_api_key(principal=request.principal, tenant=tenant, prefix=prefix)
        except ApiError as exc:  # e.g. role_too_high: an admin revoking an owner's key
            messages.error(request, f"{exc.detail} ({exc.code})")
        else:
            messages.success(request, f"API key {key.name} ({prefix}) revoked.")
        return redirect("portal:api-keys")
    return render(
        request,
        "portal/confirm.html",
        {
            "title": f"Revoke API key {key.name}?",
            "message": f"Programs using {prefix}.… get 401 from now on. This cannot be undone.",
            "button": "Revoke key",
            "cancel": reverse("portal:api-keys"),
        },
    )


def _not_found(request: HttpRequest) -> HttpResponse:
    from portal.access import not_found

    return not_found(request)


# ------------------------------------------------------------------------------ members


@never_cache
@tenant_page
def member_list(request: HttpRequest) -> HttpResponse:
    """Every role sees the members (search, role filter, sort, pages); owners invite people by
    a one-time link (shown once, here), change roles, remove members, revoke invitations."""
    tenant = _tenant_or_404(request)
    form = InviteForm(request.POST or None, auto_id="invite_%s")
    issued = None
    if request.method == "POST":
        if (deny := require_owner(request)) is not None:
            return deny
        if form.is_valid():
            issued = call_service(
                form,
                invitations.invite,
                principal=request.principal,
                tenant=tenant,
                email=form.cleaned_data["email"],
                role=Role(form.cleaned_data["role"]),
                ttl_hours=form.cleaned_data["ttl_hours"],
            )
            if issued is not None:
                form = InviteForm(auto_id="invite_%s")
    rows = (
        Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username")
    )
    listing = paginate(request, MemberFilter(request.GET, queryset=rows))
    can_manage = request.principal.is_operator or request.principal.role == Role.OWNER
    pending = (
        Invitation.objects.filter(
            tenant=tenant, accepted_at__isnull=True, revoked_at__isnull=True
        ).order_by("-created_at")[:50]
        if can_manage
        else []
    )
    return render(
        request,
        "portal/members.html",
        {
            "form": form,
            "listing": listing,
            "rows": [
                (m, RoleForm(initial={"role": m.role}, prefix=m.user.username))
                for m in listing.page.object_list
            ],
            "can_manage": can_manage,
            "issued": issued,
            "invite_url": (
                public_url.absolute_url(reverse("portal:invite", args=[issued.token]))
                if issued
                else None
            ),
            "pending": pending,
            "now": timezone.now(),
        },
        status=listing.status,
    )


@require_POST
@tenant_page
def member_role(request: HttpRequest, username: str) -> HttpResponse:
    """Change a member's role (owners). The last owner stays an owner."""
    if (deny := require_owner(request)) is not None:
        return deny
    tenant = _tenant_or_404(request)
    form = RoleForm(request.POST, prefix=username)
    if form.is_valid():
        role = validate_with(MemberRoleSerializer, {"role": form.cleaned_data["role"]})["role"]
        result = _run(
            request,
            members.change_role,
            principal=request.principal,
            tenant=tenant,
            username=username,
            role=role,
        )
        if result is not None:
            messages.success(request, f"{username} is now {role}.")
    return redirect("portal:members")


@tenant_page
def member_remove(request: HttpRequest, username: str) -> HttpResponse:
    """Confirm, then remove a member (owners). The last owner cannot be removed."""
    if (deny := require_owner(request)) is not None:
        return deny
    tenant = _tenant_or_404(request)
    if request.method == "POST":
        done = _run(
            request,
            members.remove_member,
            principal=request.principal,
            tenant=tenant,
            username=username,
        )
        if done is not False:
            messages.success(request, f"{username} removed.")
        return redirect("portal:members")
    return render(
        request,
        "portal/confirm.html",
        {
            "title": f"Remove {username} from {tenant.name}?",
            "message": "They lose access to this tenant's clusters at once.",
            "button": "Remove member",
            "cancel": reverse("portal:members"),
        },
    )


def _run(request: HttpRequest, fn, **kwargs):
    """Call a service; a Conflict (e.g. ``last_owner``) becomes a message on the next page."""
    from nvke.errors import Conflict

    try:
        return fn(**kwargs) or True
    except Conflict as exc:
        messages.error(request, f"{exc.detail} ({exc.code})")
        return False


# ------------------------------------------------------------------------------ quotas


@tenant_page
def quota_page(request: HttpRequest) -> HttpResponse:
    """Limits, reservations and what is held now (the API's ``GET /quotas`` body)."""
    tenant = _tenant_or_404(request)
    return render(
        request,
        "portal/quotas.html",
        {"quota": quota_body(quotas.quota_for(tenant.pk, lock=False)), "tenant": tenant},
    )


# ------------------------------------------------------------------------------ audit


@tenant_page
def audit_log(request: HttpRequest) -> HttpResponse:
    """Audit events of the tenant (owners/admins; operators: all), newest first, filtered by
    actor, action, target type and a UTC date range; 50 a page ("older" follows public ids)."""
    if (deny := require_admin(request)) is not None:
        return deny
    form = AuditFilterForm(request.GET or None)
    events = scope_queryset(AuditEvent.objects.all(), request.principal)
    if form.is_valid():
        data = form.cleaned_data
        for key in ("actor", "action", "target_type"):
            if data.get(key):
                events = events.filter(**{key: data[key]})
        if data.get("since"):
            events = events.filter(ts__gte=datetime.combine(data["since"], time(), UTC))
        if data.get("until"):
            events = events.filter(ts__lt=datetime.combine(data["until"], time(), UTC))
    # "older" names the last event shown by its public id (never the serial, which would tell
    # a tenant how many events everyone else made: nvke/public_ids.py); the page after it is
    # the events before it in (ts, id) order, the anchor looked up in this tenant's events only
    anchor = None
    before = request.GET.get("before")
    if before:
        with suppress(ValueError):
            anchor = events.filter(public_id=uuid.UUID(before)).values("ts", "id").first()
    if anchor is not None:
        events = events.filter(Q(ts__lt=anchor["ts"]) | Q(ts=anchor["ts"], id__lt=anchor["id"]))
    page = list(events.order_by("-ts", "-id")[: AUDIT_PAGE + 1])
    older = page[AUDIT_PAGE - 1].public_id if len(page) > AUDIT_PAGE else None
    query = request.GET.copy()
    query.pop("before", None)
    return render(
        request,
        "portal/audit.html",
        {
            "form": form,
            "events": page[:AUDIT_PAGE],
            "older": older,
            "query": query.urlencode(),
            "actions": sorted(
                scope_queryset(AuditEvent.objects.all(), request.principal)
                .values_list("action", flat=True)
                .distinct()
            ),
        },
    )
