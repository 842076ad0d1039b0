"""Kubernetes-style status conditions stored as JSON lists.

A condition is ``{"type", "status": "True"|"False"|"Unknown", "reason", "message",
"last_transition_time"}`` (RFC 3339). ``last_transition_time`` changes only when ``status``
changes, as in Kubernetes' ``metav1.Condition``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool | None,
    reason: str,
    message: str = "",
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Return a new list with condition ``type_`` set (status None means ``Unknown``)."""
    now = now or timezone.now()
    text = "Unknown" if status is None else ("True" if status else "False")
    out: list[dict[str, Any]] = []
    found = False
    for cond in conditions:
        if cond.get("type") == type_:
            found = True
            changed = cond.get("status") != text
            out.append(
                {
                    "type": type_,
                    "status": text,
                    "reason": reason,
                    "message": message,
                    "last_transition_time": now.isoformat()
                    if changed
                    else cond.get("last_transition_time"),
                }
            )
        else:
            out.append(cond)
    if not found:
        out.append(
            {
                "type": type_,
                "status": text,
                "reason": reason,
                "message": message,
                "last_transition_time": now.isoformat(),
            }
        )
    return out


def get_condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    """The condition of that type, or None."""
    return next((c for c in conditions if c.get("type") == type_), None)
