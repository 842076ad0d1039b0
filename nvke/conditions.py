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


def save_conditions(
    obj: Any,
    now: datetime,
    *conds: tuple[str, bool | None, str, str],
) -> bool:
    """Set each ``(type, status, reason, message)`` of ``conds`` on ``obj.conditions`` (a
    model with ``conditions`` and ``updated_at``) and save those two fields when anything
    changed. The one way a reconciler writes conditions; returns True when it saved."""
    conditions = obj.conditions
    for type_, status, reason, message in conds:
        conditions = set_condition(conditions, type_, status, reason, message, now)
    if conditions == obj.conditions:
        return False
    obj.conditions = conditions
    obj.save(update_fields=["conditions", "updated_at"])
    return True
