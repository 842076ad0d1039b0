"""The console's Health rules page (Django test client, real DB): an operator sees the catalog
defaults, overrides a rule (audited as the operator), sees a refusal beside the field (400,
never a 500), restores the default and runs the dry run; a tenant user gets the 404 page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Gpu, HealthRule, XidEvent
from tenants.models import AuditEvent

pytestmark = pytest.mark.django_db

FORM = {
    "key": "xid-31",
    "threshold_count": "3",
    "window_s": "600",
    "condition": "GpuMemoryFaults",
    "ladder": ["gpu_reset", "node_reboot"],
    "escalation_window_s": "3600",
    "needs_operator": "on",
    "enabled": "on",
}


def row_of(html: str, key: str) -> str:
    return html.split(f'data-key="{key}"')[1].split("</tr>")[0]


def test_an_operator_overrides_restores_and_dry_runs_a_rule(ops_client, make_host):
    html = ops_client.get("/console/health-rules").content.decode()
    assert "node_reboot → replace → hardware_ticket" in row_of(html, "xid-79")
    assert 'data-key="xid-31"' not in html  # no default for an application Xid

    response = ops_client.post("/console/health-rules/save", FORM)
    assert (response.status_code, response["Location"]) == (302, "/console/health-rules")
    html = ops_client.get("/console/health-rules").content.decode()
    row = row_of(html, "xid-31")
    assert "operator v1" in row and "3\u00d7 in 600 s" in row and "gpu_reset → node_reboot" in row
    event = AuditEvent.objects.get(action="health_rule.save")
    assert event.actor.startswith("user:") and event.after["threshold_count"] == 3

    # a bound broken: refused beside the field (400), nothing stored
    refused = ops_client.post("/console/health-rules/save", {**FORM, "threshold_count": "0"})
    assert refused.status_code == 400
    assert 'id="id_threshold_count-error"' in refused.content.decode()
    assert HealthRule.objects.get().threshold_count == 3

    # the dry run over stored events: three Xid 31 within 4 minutes yesterday -> a GPU reset
    host = make_host("h100-sxm5-80gb", gpus=1, hostname="console-rules-01")
    gpu = Gpu.objects.get(host=host)
    yesterday = timezone.now() - timedelta(days=1)
    XidEvent.objects.bulk_create(
        [
            XidEvent(
                host=host,
                gpu_uuid=gpu.uuid,
                ts=yesterday + timedelta(minutes=m),
                xid=31,
                report_seq=m,
            )
            for m in (0, 2, 4)
        ]
    )
    html = ops_client.get("/console/health-rules?dry_run_days=7").content.decode()
    table = html.split('id="dry-run-firings"')[1].split("</table>")[0]
    assert table.count("<tr>") == 2  # the header and one firing
    assert gpu.uuid in table and "gpu_reset" in table and "xid-31" in table
    assert ops_client.get("/console/health-rules?dry_run_days=x").status_code == 400

    # restore: the override goes, Xid 31 has no rule again
    assert ops_client.post("/console/health-rules/xid-31/restore").status_code == 302
    assert not HealthRule.objects.exists()
    assert 'data-key="xid-31"' not in ops_client.get("/console/health-rules").content.decode()


def test_a_tenant_user_cannot_see_or_change_rules(alice_client, catalog):
    assert alice_client.get("/console/health-rules").status_code == 404
    assert alice_client.post("/console/health-rules/save", FORM).status_code == 404
    assert not HealthRule.objects.exists()


def test_the_console_shows_an_open_breaker_and_an_operator_resumes_it(ops_client, alice_client):
    from fleet.models import BreakerTrip

    trip = BreakerTrip.objects.create(
        scope="pool:6f1c0c7e-0000-4000-8000-000000000001",
        tripped_at=timezone.now(),
        reason="circuit breaker open for the node pool (20 nodes): 1 cordon(s) …",
    )
    html = ops_client.get("/console/health-rules").content.decode()
    row = html.split(f'data-scope="{trip.scope}"')[1].split("</tr>")[0]
    assert "circuit breaker open for the node pool (20 nodes)" in row
    url = f"/console/breakers/{trip.scope}/resume"
    assert alice_client.post(url).status_code == 404  # tenants cannot
    assert ops_client.post(url).status_code == 302
    trip.refresh_from_db()
    assert trip.resumed_at is not None and trip.resumed_by.startswith("user:")
    assert "No breaker is open" in ops_client.get("/console/health-rules").content.decode()
    assert ops_client.post(url).status_code == 404  # nothing open any more
