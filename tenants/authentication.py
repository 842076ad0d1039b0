"""``Authorization: Bearer <key>`` authentication for tenant and operator API keys."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions

from . import key_cache
from .choices import Role
from .models import ApiKey
from .principal import Principal

#: last_used_at is written at most this often per key, to keep reads free of writes.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """Resolve a bearer API key to a :class:`~tenants.principal.Principal`.

    Raises ``AuthenticationFailed`` (401, code ``invalid_api_key``) for an unknown, revoked or
    expired key; a request without ``Authorization`` stays anonymous (the permission class then
    answers 401 ``not_authenticated``).
    """

    keyword = "Bearer"

    def authenticate(self, request):  # type: ignore[override]
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, key = header.partition(" ")
        if scheme.lower() != self.keyword.lower() or not key.strip():
            raise exceptions.AuthenticationFailed(
                "Use 'Authorization: Bearer <api key>'.", code="invalid_api_key"
            )
        principal = principal_for_key(key.strip())
        if principal is None:
            raise exceptions.AuthenticationFailed(
                "The API key is unknown, revoked or expired.", code="invalid_api_key"
            )
        return principal, key

    def authenticate_header(self, request) -> str:  # type: ignore[override]
        return self.keyword


def principal_for_key(key: str) -> Principal | None:
    """Return the principal of a valid key, or None (unknown, revoked, expired, malformed).

    A key that authenticated in the last minute is read from the key cache
    (:mod:`tenants.key_cache`: one cache read, its secret checked against the cached hash,
    revocation honoured at once); otherwise from the database, and then cached."""
    entry = key_cache.lookup(key)
    if entry is None:
        try:
            api_key = ApiKey.objects.get_from_key(key)
        except ApiKey.DoesNotExist:
            return None
        entry = key_cache.CachedKey.of(api_key)
        if not api_key.has_expired:
            key_cache.store(entry)
    if entry.expiry_date is not None and entry.expiry_date < timezone.now():
        return None  # as ApiKey.has_expired
    now = timezone.now()
    if entry.last_used_at is None or now - entry.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=entry.pk).update(last_used_at=now)
        key_cache.store(dataclasses.replace(entry, last_used_at=now))
    return Principal(
        tenant=entry.tenant,
        role=Role(entry.role),
        is_operator=entry.is_operator,
        label=f"apikey:{entry.prefix}",
    )


def _tenant_id(value: str, request) -> uuid.UUID:
    """The tenant id a session request names; 400 ``invalid_tenant_header`` when the
    ``X-NVKE-Tenant`` header is not a UUID (a stale session value counts as no choice)."""
    from nvke.errors import InvalidInput  # not at import: nvke.errors imports DRF's views

    try:
        return uuid.UUID(str(value))
    except ValueError:
        if request.headers.get("X-NVKE-Tenant"):
            raise InvalidInput(
                "X-NVKE-Tenant must be a tenant id (a UUID)",
                code="invalid_tenant_header",
                field="X-NVKE-Tenant",
            ) from None
        raise exceptions.AuthenticationFailed(
            "choose a tenant (X-NVKE-Tenant header or the portal's tenant switcher)",
            code="tenant_required",
        ) from None


class SessionPrincipalAuthentication(authentication.SessionAuthentication):
    """A logged-in Django user (portal session, CSRF enforced) as a :class:`Principal`.

    Staff users are operators. Otherwise the tenant is the one named by the ``X-NVKE-Tenant``
    header (tenant id), else the one stored in the session (``nvke_tenant_id``, set by the
    portal's tenant switcher), else the user's only membership; the role is the membership's.
    """

    def authenticate(self, request):  # type: ignore[override]
        result = super().authenticate(request)
        if result is None:
            return None
        user, _ = result
        if user.is_staff:
            return Principal(None, Role.ADMIN, True, f"user:{user.username}"), None
        from .models import Membership

        memberships = Membership.objects.filter(user=user).select_related("tenant")
        wanted = request.headers.get("X-NVKE-Tenant") or request._request.session.get(
            "nvke_tenant_id"
        )
        if wanted:
            memberships = memberships.filter(tenant_id=_tenant_id(wanted, request))
        rows = list(memberships[:2])
        if len(rows) != 1:
            raise exceptions.AuthenticationFailed(
                "choose a tenant (X-NVKE-Tenant header or the portal's tenant switcher)",
                code="tenant_required",
            )
        m = rows[0]
        return Principal(m.tenant, Role(m.role), False, f"user:{user.username}"), None
