"""Every successful mutating API request leaves an audit event.

Services record rich events (before/after of the changed fields) with
:func:`tenants.audit.record`; for any POST/PUT/PATCH/DELETE under ``/api/v1/`` that succeeded
without one (a new endpoint, an operator action), this middleware records
``"<METHOD> <route name>"`` with the target from the URL and the redacted response fields.
Agent telemetry reports are not mutations of tenant or fleet configuration and are skipped.
"""

from __future__ import annotations

import json

from django.urls import resolve

from tenants.audit import record, recorded_var

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
SKIP_ROUTES = {"agent-reports"}


class AuditFallbackMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = recorded_var.set(False)
        try:
            response = self.get_response(request)
            if (
                request.method in MUTATING
                and request.path.startswith("/api/v1/")
                and response.status_code < 400
                and not recorded_var.get()
            ):
                self._record(request, response)
            return response
        finally:
            recorded_var.reset(token)

    def _record(self, request, response) -> None:
        match = resolve(request.path_info)
        if match.url_name in SKIP_ROUTES:
            return
        user = getattr(request, "user", None)
        actor = getattr(user, "label", None) or (
            f"host:{user.host.hostname}" if hasattr(user, "host") else "anonymous"
        )
        tenant = getattr(user, "tenant", None)
        body = {}
        if response.get("Content-Type", "").startswith("application/json"):
            try:
                data = json.loads(response.content or b"{}")
            except ValueError:
                data = {}
            if isinstance(data, dict):
                body = {k: v for k, v in data.items() if not isinstance(v, dict | list)}
        target = match.kwargs.get("pk") or body.get("target_id") or body.get("id") or ""
        record(
            actor=actor,
            action=f"{request.method} {match.url_name}",
            target_type=(match.url_name or "").rsplit("-", 1)[0],
            target_id=target,
            tenant=tenant,
            after=body,
        )
