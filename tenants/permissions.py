"""DRF permission classes built on :class:`~tenants.principal.Principal`."""

from __future__ import annotations

from rest_framework import permissions

from .principal import Principal


def _principal(request) -> Principal | None:
    user = getattr(request, "user", None)
    return user if isinstance(user, Principal) else None


class IsAuthenticatedPrincipal(permissions.BasePermission):
    """Any principal may read; writes (POST/PUT/PATCH/DELETE) need a role that can write."""

    message = "Your role does not allow changing this resource."

    def has_permission(self, request, view) -> bool:
        principal = _principal(request)
        if principal is None:
            return False
        if request.method in permissions.SAFE_METHODS:
            return True
        return principal.can_write


class IsOperator(permissions.BasePermission):
    """Platform operators only (operator API keys)."""

    message = "This endpoint is for platform operators."

    def has_permission(self, request, view) -> bool:
        principal = _principal(request)
        return principal is not None and principal.is_operator


class IsTenantAdminOrOperator(permissions.BasePermission):
    """Tenant owners/admins (for their own tenant) or operators."""

    message = "Only tenant owners and admins may do this."

    def has_permission(self, request, view) -> bool:
        principal = _principal(request)
        return principal is not None and principal.can_admin
