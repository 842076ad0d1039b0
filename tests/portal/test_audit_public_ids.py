"""Audit events are numbered by one sequence for every tenant; tenant B reading its events (API
and portal, the portal's "Older events" link included) must not learn from them how much tenant
A did (issue 26, item 5): events are named by a random public UUID (nvke/public_ids.py)."""

from __future__ import annotations

import re
import uuid

import pytest

pytestmark = pytest.mark.django_db


def record(tenant, n, action):
    from tenants import audit

    for _ in range(n):
        audit.record(actor="user:x", action=action, target_type="cluster", tenant=tenant)


def page(portal, query="") -> str:
    """The audit page's table and its "Older events" link (not the per-render CSRF token)."""
    html = portal.get(f"/audit{query}").content.decode()
    table = r'<table class="list" aria-label="audit events">.*?</table>(.*?)$'
    return re.search(table, html, re.S)[0]


def b_reads(api, portal) -> tuple[list[dict], str, str]:
    events = api.get("/api/v1/audit-events", {"limit": 500}).json()["results"]
    first = page(portal)
    older = re.search(r'before=([^"&]+)"', first)
    second = page(portal, f"?before={older.group(1)}") if older else ""
    return events, first, second


def test_b_audit_log_does_not_change_when_a_acts(outsider, outsider_client, tenant_a, tenant_b):
    from tenants.models import AuditEvent

    record(tenant_b, 30, "b.first")
    record(tenant_a, 7, "a.between")
    record(tenant_b, 30, "b.second")  # 60: two portal pages (50 + the rest)
    seen = b_reads(outsider, outsider_client)
    record(tenant_a, 5, "a.after")
    assert b_reads(outsider, outsider_client) == seen  # A's events change nothing B reads

    events, first, second = seen
    mine = list(AuditEvent.objects.filter(tenant=tenant_b).order_by("-ts", "-id"))
    assert [e["id"] for e in events] == [str(e.public_id) for e in mine]
    assert all(uuid.UUID(e["id"]).version == 4 for e in events)
    # the portal's pages: 50, then the rest, linked by the 50th event's public id
    assert re.search(r'before=([^"&]+)"', first).group(1) == str(mine[49].public_id)
    assert first.count("<tr><td") == 50 and second.count("<tr><td") == len(mine) - 50
    assert "before=" not in second
    assert "a.between" not in first + second and "a.after" not in first + second
    serials = {str(pk) for pk in AuditEvent.objects.values_list("id", flat=True)}
    assert not serials & {str(v) for e in events for v in e.values()}


def test_an_older_link_of_another_tenant_or_junk_shows_the_first_page(
    outsider_client, tenant_a, tenant_b
):
    from tenants.models import AuditEvent

    record(tenant_a, 3, "a.only")
    record(tenant_b, 2, "b.only")
    first = page(outsider_client)
    assert first.count("<tr><td") == 2
    a_event = AuditEvent.objects.filter(tenant=tenant_a).first().public_id
    for junk in (str(a_event), "12", "not-a-uuid", "%C2%B2"):
        assert page(outsider_client, f"?before={junk}") == first
