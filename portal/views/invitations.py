"""Tenant portal: invite members by a one-time link; the invitee joins through it."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from nvke.errors import ApiError, NotFound
from portal.access import TENANT_SESSION_KEY, require_owner, tenant_page
from portal.invite_forms import AcceptForm
from tenants import invitations

from .common import call_service


@require_POST
@tenant_page
def invitation_revoke(request: HttpRequest, invitation_id) -> HttpResponse:
    """Revoke an open invitation (owners): its link stops working at once."""
    if (deny := require_owner(request)) is not None:
        return deny
    tenant = request.principal.tenant
    if tenant is None:
        raise NotFound()
    try:
        row = invitations.revoke(
            principal=request.principal, tenant=tenant, invitation_id=invitation_id
        )
    except NotFound:
        raise
    except ApiError as exc:
        messages.error(request, f"{exc.detail} ({exc.code})")
    else:
        messages.success(request, f"Invitation of {row.email} revoked.")
    return redirect("portal:members")


@never_cache
def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    """``/invite/<token>``: who invites you where; join with a new account, or (logged in)
    with yours. A used, expired, revoked or unknown link answers 410/404 with the reason."""
    try:
        invitation = invitations.usable(token)
    except NotFound:
        return render(
            request, "portal/invite_invalid.html", {"reason": "This link is not valid."}, status=404
        )
    except ApiError as exc:
        return render(request, "portal/invite_invalid.html", {"reason": exc.detail}, status=410)
    user = request.user if request.user.is_authenticated else None
    form = AcceptForm(request.POST or None) if user is None else None
    if request.method == "POST":
        membership = None
        if user is not None:
            try:
                membership = invitations.accept(token=token, user=user)
            except ApiError as exc:
                messages.error(request, f"{exc.detail} ({exc.code})")
        elif form.is_valid():
            membership = call_service(
                form,
                invitations.accept,
                token=token,
                username=form.cleaned_data["username"],
                password=form.cleaned_data["new_password1"],
            )
            if membership is not None:
                login(request, membership.user, backend="tenants.login.CaseInsensitiveModelBackend")
        if membership is not None:
            request.session[TENANT_SESSION_KEY] = str(membership.tenant_id)
            messages.success(
                request, f"Welcome to {membership.tenant.name}: you are {membership.role}."
            )
            return redirect("portal:cluster-list")
    return render(
        request,
        "portal/invite_accept.html",
        {"invitation": invitation, "form": form, "existing_user": user},
        status=400 if request.method == "POST" else 200,
    )
