"""Throttles per API key (principal) and per tenant, counted in the Redis cache (DRF's
SimpleRateThrottle). Rates come from ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` (env
``NVKE_THROTTLE_PRINCIPAL`` / ``NVKE_THROTTLE_TENANT``). Over the rate: 429 problem+json with
``Retry-After``."""

from __future__ import annotations

from rest_framework.throttling import SimpleRateThrottle


class PrincipalRateThrottle(SimpleRateThrottle):
    scope = "principal"

    def get_cache_key(self, request, view):  # type: ignore[override]
        label = getattr(request.user, "label", None)
        return self.cache_format % {"scope": self.scope, "ident": label} if label else None


class TenantRateThrottle(SimpleRateThrottle):
    scope = "tenant"

    def get_cache_key(self, request, view):  # type: ignore[override]
        tenant = getattr(request.user, "tenant", None)
        if tenant is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": tenant.pk}
