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
    """An operation's ``{"done", "total"}`` as a percentage: 100 when ``total`` is 0 (nothing
    to do: a pool scaled to 0 that had no node left), 0 without a progress yet."""
    if not isinstance(progress, dict):
        return 0
    if progress.get("total") == 0:
        return 100
    return percent_of(progress.get("done", 0), progress.get("total", 0) or 1)


@register.filter
def progress_steps(progress: Any) -> dict[str, Any]:
    """An operation's progress for its bar and label: ``{"value", "max", "label"}`` —
    ``label`` ``done/total`` as reported (``0/0``: nothing to do, the bar full), ``0/?``
    before the first report (the bar empty); empty when the stage already starts with the
    count (``1 of 1 node(s) ready`` read ``1/1 1 of 1 node(s) ready``)."""
    if not isinstance(progress, dict):
        progress = {}
    done, total = progress.get("done") or 0, progress.get("total")
    if total is None:
        return {"value": 0, "max": 1, "label": f"{done}/?"}
    stage = str(progress.get("stage") or "")
    label = "" if stage.startswith(f"{done} of {total} ") else f"{done}/{total}"
    if total == 0:
        return {"value": 1, "max": 1, "label": label}
    return {"value": done, "max": total, "label": label}


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
        "sections": nav_sections(principal) if not console else [],
        "current_path": request.path,
        "csrf_token": context.get("csrf_token"),
    }


#: the portal's one time format: ISO-like date and time, seconds, the zone named
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def _as_datetime(value: Any):
    """A datetime, an aware ISO 8601 string (conditions' ``last_transition_time``) or None."""
    from datetime import datetime

    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


@register.filter
def when(value: Any) -> str:
    """The one way the portal shows a point in time: ``<time datetime="…">2026-12-02 03:23:47
    UTC</time>`` in the server's zone (``settings.TIME_ZONE``, named), ``—`` for none.

    Accepts an aware datetime or an ISO 8601 string; naive datetimes are taken as UTC.
    """
    from datetime import UTC

    from django.utils import timezone

    moment = _as_datetime(value)
    if moment is None:
        return "—" if value in (None, "") else str(value)
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=UTC)
    local = timezone.localtime(moment)
    zone = local.tzname() or str(timezone.get_current_timezone())
    return format_html(
        '<time datetime="{}">{} {}</time>',
        moment.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        local.strftime(TIME_FORMAT),
        zone,
    )


#: the portal's sections: (url name, label, what the principal needs to open it)
NAV_SECTIONS: tuple[tuple[str, str, str], ...] = (
    ("portal:cluster-list", "Clusters", "read"),
    ("portal:activity", "Activity", "read"),
    ("portal:usage", "Usage & cost", "read"),
    ("portal:invoices", "Invoices", "read"),
    ("portal:api-keys", "API keys", "admin"),
    ("portal:members", "Members", "tenant"),
    ("portal:quotas", "Quotas", "tenant"),
    ("portal:audit", "Audit log", "admin"),
)


def allowed(principal: Any, need: str) -> bool:
    """Whether ``principal`` (a :class:`tenants.principal.Principal`) may open a page that
    needs ``need``: ``read`` (any role), ``tenant`` (a tenant member, not an operator acting
    across tenants), ``write`` (member and up), ``admin`` (admin and up), ``owner``."""
    if principal is None:
        return False
    if need == "read":
        return True
    if need == "tenant":
        return principal.tenant is not None
    if need == "write":
        return bool(principal.can_write)
    if need == "admin":
        return bool(principal.can_admin)
    if need == "owner":
        return bool(principal.is_operator or principal.role == "owner")
    raise ValueError(f"unknown need {need!r}")


def nav_sections(principal: Any) -> list[tuple[str, str]]:
    """``[(url, label)]`` of the sections ``principal`` may open (the role's navigation)."""
    from django.urls import reverse

    return [
        (reverse(name), label) for name, label, need in NAV_SECTIONS if allowed(principal, need)
    ]


@register.filter
def url_page(listing: Any, number: Any) -> str:
    """``portal.listing.Listing.url_with(page=number)`` for a pager link."""
    return listing.url_with(page=number)


@register.simple_tag
def sort_header(listing: Any, field: str, label: str) -> str:
    """A sortable column header's link; the sorted column says its direction (``data-sort``
    and an arrow; ``aria-sort`` belongs on the ``<th>``, which the template does not own)."""
    current = listing.sort
    if current.lstrip("-") == field:
        direction = "descending" if current.startswith("-") else "ascending"
        arrow = " ↓" if current.startswith("-") else " ↑"
        return format_html(
            '<a class="sort" href="{}" data-sort="{}">{}{}</a>',
            listing.sort_url(field),
            direction,
            label,
            arrow,
        )
    return format_html('<a class="sort" href="{}">{}</a>', listing.sort_url(field), label)
