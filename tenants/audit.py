"""Audit events: one immutable row per mutation (who, what, target, before/after).

Services call :func:`record`; the request id and source IP come from the request context
(:mod:`nvke.middleware`). Secrets are redacted from before/after (keys named like
``key``, ``token``, ``credential``, ``password``, ``secret``, ``kubeconfig``, ``xml``).
Mutations that no service recorded are still audited by
:class:`tenants.audit_middleware.AuditFallbackMiddleware`.
"""

from __future__ import annotations

import contextvars
from typing import Any

from nvke.middleware import client_ip_var, request_id_var
from nvke.redaction import REDACTED, redact_keys

from .models import AuditEvent, Tenant

__all__ = ["REDACTED", "changed", "record", "redact"]

#: the one key-based redaction (:func:`nvke.redaction.redact_keys`), under its audit name
redact = redact_keys

#: set when a service recorded an event for the current request (the fallback skips it)
recorded_var: contextvars.ContextVar[bool] = contextvars.ContextVar("audit_recorded", default=False)


def changed(before: dict[str, Any] | None, after: dict[str, Any] | None) -> tuple[dict, dict]:
    """Only the fields whose values differ, as ``(before, after)``."""
    before, after = before or {}, after or {}
    keys = [k for k in {**before, **after} if before.get(k) != after.get(k)]
    return (
        {k: before.get(k) for k in keys if k in before},
        {k: after.get(k) for k in keys if k in after},
    )


def record(
    *,
    actor: str,
    action: str,
    target_type: str,
    target_id: Any = "",
    tenant: Tenant | None = None,
    tenant_id: Any = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> AuditEvent:
    """Write one audit event (inside the caller's transaction, so it commits with the change)."""
    b, a = changed(redact(before), redact(after))
    event = AuditEvent.objects.create(
        tenant_id=tenant.pk if tenant is not None else tenant_id,
        actor=actor[:100],
        action=action[:64],
        target_type=target_type[:32],
        target_id=str(target_id)[:64],
        request_id=request_id_var.get() or "",
        source_ip=client_ip_var.get(),
        before=b or None,
        after=a or None,
    )
    recorded_var.set(True)
    return event
