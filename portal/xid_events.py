"""The console's Xid events page: filter choices from real values and the filtered, bounded
query. Read-only; the severity and action of a code are the catalog's Xid table
(``catalog.XidCode``, loaded from ``xid.yaml``), never copied onto the events."""

from __future__ import annotations

from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet

from catalog.models import XidCode
from fleet.models import Host, XidEvent

#: events per page (the page number is bounded by the form: at most 1000 pages are reachable)
PAGE_SIZE = 50


def filter_choices() -> dict[str, Any]:
    """``{"hosts": [(id, hostname)], "codes": [(code, "79 GPU has fallen off the bus")],
    "actions": ["RESET_GPU", ...]}``: hosts that reported an Xid, codes seen or in the
    catalog, the catalog's distinct NVIDIA immediate actions."""
    host_ids = XidEvent.objects.order_by().values_list("host_id", flat=True).distinct()
    hosts = [
        (str(pk), name)
        for pk, name in Host.objects.filter(pk__in=host_ids)
        .order_by("hostname")
        .values_list("id", "hostname")
    ]
    catalog = dict(XidCode.objects.values_list("code", "mnemonic"))
    seen = set(XidEvent.objects.order_by().values_list("xid", flat=True).distinct())
    codes = [(c, f"{c} {catalog.get(c, '(not in the catalog)')}".strip()) for c in sorted(seen)]
    actions = sorted(
        set(
            XidCode.objects.exclude(nvidia_immediate_action="")
            .order_by()
            .values_list("nvidia_immediate_action", flat=True)
        )
    )
    return {"hosts": hosts, "codes": codes, "actions": actions}


def filtered_events(data: dict[str, Any]) -> QuerySet[XidEvent]:
    """Xid events, newest first, narrowed by the cleaned :class:`portal.forms.XidFilterForm`
    data: ``host`` (id), ``gpu`` (UUID prefix, case-insensitive), ``xid`` (code), ``action``
    / ``severity`` (codes whose catalog row has it), ``since`` <= ts < ``until``."""
    events = XidEvent.objects.select_related("host").order_by("-ts", "-id")
    if data.get("host"):
        events = events.filter(host_id=data["host"])
    if data.get("gpu"):
        events = events.filter(gpu_uuid__istartswith=data["gpu"].strip())
    if data.get("xid"):
        events = events.filter(xid=int(data["xid"]))
    codes = XidCode.objects.all()
    if data.get("action"):
        codes = codes.filter(nvidia_immediate_action=data["action"])
    if data.get("severity"):
        codes = codes.filter(severity=data["severity"])
    if data.get("action") or data.get("severity"):
        events = events.filter(xid__in=codes.values("code"))
    if data.get("since"):
        events = events.filter(ts__gte=data["since"])
    if data.get("until"):
        events = events.filter(ts__lt=data["until"])
    return events


def page_count(events: QuerySet[XidEvent]) -> int:
    """How many pages of :data:`PAGE_SIZE` ``events`` fill (at least 1)."""
    return Paginator(events, PAGE_SIZE).num_pages


def events_page(events: QuerySet[XidEvent], number: int) -> tuple[Page, list[dict[str, Any]]]:
    """Page ``number`` (past the last: the last) and its rows ``{"event", "code"}`` with the
    catalog row of each code (None when the catalog does not know it)."""
    page = Paginator(events, PAGE_SIZE).get_page(number)
    rows = list(page.object_list)
    catalog = XidCode.objects.in_bulk({e.xid for e in rows})
    return page, [{"event": e, "code": catalog.get(e.xid)} for e in rows]
