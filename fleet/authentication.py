"""Agent authentication: ``Authorization: Bearer <host credential>`` -> the Host."""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework import authentication, exceptions, permissions

from .models import Host
from .secrets import digest


@dataclass(frozen=True)
class HostPrincipal:
    """The agent of one host."""

    host: Host
    is_authenticated = True
    is_anonymous = False
    is_operator = False


class HostCredentialAuthentication(authentication.BaseAuthentication):
    """Resolves a host credential (issued by agent registration) to a :class:`HostPrincipal`."""

    keyword = "Bearer"

    def authenticate(self, request):  # type: ignore[override]
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise exceptions.AuthenticationFailed(
                "Use 'Authorization: Bearer <host credential>'.", code="invalid_host_credential"
            )
        host = (
            Host.objects.filter(credential_hash=digest(token)).exclude(credential_hash="").first()
        )
        if host is None:
            raise exceptions.AuthenticationFailed(
                "The host credential is unknown or was revoked.", code="invalid_host_credential"
            )
        return HostPrincipal(host=host), token

    def authenticate_header(self, request) -> str:  # type: ignore[override]
        return self.keyword


class IsAgent(permissions.BasePermission):
    """Only an authenticated host agent."""

    def has_permission(self, request, view) -> bool:
        return isinstance(getattr(request, "user", None), HostPrincipal)
