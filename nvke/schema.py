"""drf-spectacular extensions: document the Bearer API key and the portal session."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "Tenant or operator API key: `Authorization: Bearer <prefix>.<secret>`",
        }


class HostCredentialScheme(OpenApiAuthenticationExtension):
    target_class = "fleet.authentication.HostCredentialAuthentication"
    name = "hostCredential"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "Per-host agent credential issued by /api/v1/agent/register",
        }


class SessionScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.SessionPrincipalAuthentication"
    name = "session"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}
