"""Template filters of the portal: status colours, percentages, units, money."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django import template
from django.utils.html import format_html

register = template.Library()

_GOOD = {
    "RUNNING",
    "READY",
    "DONE",
    "AVAILABLE",
    "HEALTHY",
    "ALLOCATED",
    "PASSED",
    "FINALIZED",
    "TRUE",
}
_BUSY = {
    "PROVISIONING",
    "RECONCILING",
    "DELETING",
    "PENDING",
    "DRAINING",
    "REPAIRING",
    "CORDONED",
    "MAINTENANCE",
    "DRAFT",
    "WARNING",
}
_BAD = {"ERROR", "DELETE_FAILED", "FAILED", "NOT_READY", "UNHEALTHY", "DEGRADED"}


@register.filter
def status_class(value: Any) -> str:
    """CSS class of a phase / state / status word: ``ok``, ``busy``, ``bad`` or ``muted``."""
    text = str(value).upper()
    if text in _GOOD:
        return "ok"
    if text in _BUSY:
        return "busy"
    if text in _BAD:
        return "bad"
    return "muted"


@register.simple_tag
def badge(value: Any) -> str:
    """``<span class="badge ok">RUNNING</span>``."""
    return format_html('<span class="badge {}">{}</span>', status_class(value), value)


@register.filter
def percent_of(part: Any, whole: Any) -> int:
    """``part / whole`` as a whole percentage clamped to 0..100 (0 when ``whole`` is 0)."""
    try:
        whole_f = float(whole)
        if whole_f <= 0:
            return 0
        return max(0, min(100, round(float(part) * 100 / whole_f)))
    except (TypeError, ValueError):
        return 0


@register.filter
def get(mapping: Any, key: Any) -> Any:
    """``mapping[key]`` (None when missing); also tries ``str(key)``."""
    if not hasattr(mapping, "get"):
        return None
    value = mapping.get(key)
    return mapping.get(str(key)) if value is None else value


@register.filter
def gib(value: Any) -> str:
    """Bytes as GiB with one decimal (``85899345920`` -> ``80.0 GiB``)."""
    if value in (None, ""):
        return "—"
    return f"{int(value) / 2**30:.1f} GiB"


@register.filter
def hours(value: Any) -> str:
    """GPU-hours with 3 decimals (exact values are in the CSV and the API)."""
    if value in (None, ""):
        return "—"
    return f"{Decimal(value):,.3f}"


@register.filter
def money(costs: Any) -> str:
    """``{"USD": Decimal("12.50")}`` -> ``12.50 USD`` (several currencies joined; — for none)."""
    if not costs:
        return "—"
    return " + ".join(f"{amount:,f} {currency}" for currency, amount in sorted(costs.items()))


@register.filter
def as_json(value: Any) -> str:
    """A JSON value as compact JSON text (audit before/after)."""
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), default=str)


@register.filter
def pct(value: Any) -> str:
    """A percentage with one decimal, ``—`` for None (e.g. MIG devices report none)."""
    if value in (None, ""):
        return "—"
    return f"{float(value):.1f} %"


@register.filter
def heat(value: Any) -> str:
    """Inline style of a heatmap cell: blue (idle) to red (busy); grey without data."""
    if value is None:
        return "background:#eef0f3;color:#8a94a3"
    v = max(0.0, min(100.0, float(value)))
    hue = 220 - 220 * v / 100  # 220 = blue, 0 = red
    return f"background:hsl({hue:.0f},70%,{85 - v * 0.3:.0f}%)"


@register.filter
def progress_pct(progress: Any) -> int:
    """An operation's ``{"done", "total"}`` as a percentage."""
    if not isinstance(progress, dict):
        return 0
    return percent_of(progress.get("done", 0), progress.get("total", 0) or 1)


@register.inclusion_tag("portal/partials/nav.html", takes_context=True)
def portal_nav(context: template.Context, console: bool = False) -> dict[str, Any]:
    """The top bar: sections, the tenant switcher (users in several tenants), logout."""
    from portal.access import memberships_of

    request = context["request"]
    user = request.user
    principal = getattr(request, "principal", None)
    memberships = memberships_of(user) if user.is_authenticated and not user.is_staff else []
    return {
        "request": request,
        "user": user,
        "principal": principal,
        "memberships": memberships,
        "current_tenant": str(principal.tenant.pk) if principal and principal.tenant else "",
        "console": console,
        "csrf_token": context.get("csrf_token"),
    }
