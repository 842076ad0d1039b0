"""Who is looking at a portal page, and the guards every portal view goes through.

A logged-in Django user becomes a :class:`~tenants.principal.Principal` by the same rules as
the API's :class:`tenants.authentication.SessionPrincipalAuthentication`: staff users are
operators (every tenant); anyone else acts in one tenant, the one stored in the session key
``nvke_tenant_id`` by the tenant switcher, else their only membership. The API reads the same
session key, so the portal and ``/api/v1/`` (kubeconfig and CSV downloads) always agree on the
tenant.

Views never filter tenant-owned rows by hand: they pass ``request.principal`` to
:func:`nvke.scoping.scope_queryset` / :func:`nvke.scoping.get_scoped_or_404`, whose
``NotFound`` (missing, or another tenant's object) the guards below turn into the same HTML 404
page for both cases.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse

from nvke.errors import NotFound
from tenants.choices import Role
from tenants.models import Membership
from tenants.principal import Principal

#: the session key the tenant switcher writes (read by the API's session authentication too)
TENANT_SESSION_KEY = "nvke_tenant_id"


class TenantChoiceRequired(Exception):
    """The user belongs to several tenants and has not chosen one (or chose a foreign one)."""


def memberships_of(user) -> list[Membership]:
    """The user's memberships, tenant names in order (for the tenant switcher)."""
    return list(
        Membership.objects.filter(user=user).select_related("tenant").order_by("tenant__name")
    )


def session_principal(request: HttpRequest) -> Principal | None:
    """The principal of a logged-in user, or None when the user is in no tenant.

    Raises :class:`TenantChoiceRequired` when the user is in several tenants and the session
    names none of them.
    """
    user = request.user
    if user.is_staff:
        return Principal(None, Role.ADMIN, True, f"user:{user.username}")
    memberships = Membership.objects.filter(user=user).select_related("tenant")
    wanted = request.session.get(TENANT_SESSION_KEY)
    if wanted:
        memberships = memberships.filter(tenant_id=wanted)
    rows = list(memberships[:2])
    if not rows and not wanted:
        return None
    if len(rows) != 1:
        raise TenantChoiceRequired()
    m = rows[0]
    return Principal(m.tenant, Role(m.role), False, f"user:{user.username}")


def forbidden(request: HttpRequest, message: str) -> HttpResponse:
    """403 page saying what the role does not allow."""
    return TemplateResponse(request, "portal/forbidden.html", {"message": message}, status=403)


def not_found(request: HttpRequest) -> HttpResponse:
    """The one 404 page: a missing object and another tenant's look the same."""
    return TemplateResponse(request, "portal/not_found.html", {}, status=404)


View = Callable[..., HttpResponse]


def _guard(view: View, *, console: bool) -> View:
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), login_url=reverse("portal:login"))
        try:
            principal = session_principal(request)
        except TenantChoiceRequired:
            query = urlencode({"next": request.get_full_path()})
            return redirect(reverse("portal:tenant-choose") + "?" + query)
        if principal is None:
            return TemplateResponse(request, "portal/no_tenant.html", {}, status=403)
        if console and not principal.is_operator:
            # the console's existence is not a secret, but its objects (hosts, tenants) are:
            # answer like a missing page
            return not_found(request)
        request.principal = principal  # type: ignore[attr-defined]
        try:
            return view(request, *args, **kwargs)
        except NotFound:
            return not_found(request)

    return wrapper


def tenant_page(view: View) -> View:
    """A tenant portal page: login required, ``request.principal`` set, scoped 404s."""
    return _guard(view, console=False)


def console_page(view: View) -> View:
    """An operator console page: staff only (others get the 404 page)."""
    return _guard(view, console=True)


def require_write(request: HttpRequest) -> HttpResponse | None:
    """403 page unless the principal's role may change clusters and node pools."""
    if not request.principal.can_write:  # type: ignore[attr-defined]
        return forbidden(request, "Your role (viewer) can read but not change resources.")
    return None


def require_admin(request: HttpRequest) -> HttpResponse | None:
    """403 page unless the principal is a tenant owner/admin (or an operator)."""
    if not request.principal.can_admin:  # type: ignore[attr-defined]
        return forbidden(request, "Only tenant owners and admins may do this.")
    return None


def require_owner(request: HttpRequest) -> HttpResponse | None:
    """403 page unless the principal is a tenant owner (or an operator)."""
    p = request.principal  # type: ignore[attr-defined]
    if not (p.is_operator or p.role == Role.OWNER):
        return forbidden(request, "Only tenant owners manage members.")
    return None
