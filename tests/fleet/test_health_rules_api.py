"""The health rules API: operators list, override, restore and dry-run rules; bad input is a
problem+json 400 naming the field; a tenant's key gets 403."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Gpu, HealthRule, XidEvent
from tenants.models import AuditEvent

pytestmark = pytest.mark.django_db

URL = "/api/v1/fleet/health-rules"
RULE = {
    "threshold_count": 3,
    "window_s": 600,
    "condition": "GpuMemoryFaults",
    "ladder": ["gpu_reset", "node_reboot"],
    "escalation_window_s": 3600,
}


def test_a_tenant_key_gets_403_and_writes_nothing(owner, catalog):
    assert owner.get(URL).status_code == 403
    response = owner.put(f"{URL}/xid-31", RULE, format="json")
    assert response.status_code == 403
    assert response["Content-Type"] == "application/problem+json"
    assert owner.post(f"{URL}/dry-run", {"days": 7}, format="json").status_code == 403
    assert not HealthRule.objects.exists()


def test_operators_see_the_catalog_defaults(operator, catalog):
    body = operator.get(URL).json()
    rules = {r["key"]: r for r in body["results"]}
    assert body["count"] == len(rules) > 20
    assert rules["xid-79"]["ladder"] == ["node_reboot", "replace", "hardware_ticket"]
    assert (rules["xid-79"]["source"], rules["xid-79"]["version"]) == ("catalog", 0)
    assert rules["xid-79"]["nvidia_action"] == "RESTART_BM"
    assert operator.get(f"{URL}/xid-31").status_code == 404  # no default: Xid 31 is logged
    assert operator.get(f"{URL}/not-a-rule").status_code == 404


def test_an_override_is_stored_versioned_audited_and_deleting_it_restores_the_default(
    operator, catalog
):
    response = operator.put(f"{URL}/xid-48", {**RULE, "enabled": False}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert (body["source"], body["version"], body["enabled"]) == ("operator", 1, False)
    assert body["updated_by"].startswith("apikey:")
    body = operator.put(f"{URL}/xid-48", RULE, format="json").json()
    assert (body["version"], body["enabled"], body["threshold_count"]) == (2, True, 3)
    assert operator.get(URL).json()["results"][0]["key"]  # the list still answers
    body = operator.delete(f"{URL}/xid-48").json()
    assert (body["source"], body["threshold_count"], body["ladder"][0]) == (
        "catalog",
        1,
        "gpu_reset",
    )
    assert list(
        AuditEvent.objects.filter(target_id="xid-48")
        .order_by("ts", "id")
        .values_list("action", flat=True)
    ) == ["health_rule.save", "health_rule.save", "health_rule.delete"]
    assert operator.delete(f"{URL}/xid-48").status_code == 404  # nothing stored any more
    # stored again: version 3, never a version the deleted rule (and its firings) had
    assert operator.put(f"{URL}/xid-48", RULE, format="json").json()["version"] == 3


def test_a_rule_has_one_key_spelling(operator, catalog):
    """``fallen_off_bus`` (the signal's name) and ``xid-079`` are not rule keys: a PUT under
    them stored the rule that ``fallen-off-bus`` / ``xid-79`` GETs read while a GET of the same
    spelling answered 404 (a fresh-user trial)."""
    rule = {**RULE, "condition": "GpuFellOffBus", "ladder": ["node_reboot"]}
    for key, canonical in (("fallen_off_bus", "fallen-off-bus"), ("xid-079", "xid-79")):
        response = operator.put(f"{URL}/{key}", rule, format="json")
        assert response.status_code == 404, key
        assert f"the rule's key is {canonical}" in response.json()["detail"]
        assert operator.get(f"{URL}/{key}").status_code == 404
    assert not HealthRule.objects.exists()
    assert operator.put(f"{URL}/fallen-off-bus", rule, format="json").status_code == 200
    assert operator.get(f"{URL}/fallen-off-bus").json()["condition"] == "GpuFellOffBus"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"threshold_count": 0}, "threshold_count"),
        ({"threshold_count": 10**6}, "threshold_count"),
        ({"window_s": -1}, "window_s"),
        ({"window_s": 10**9}, "window_s"),
        ({"ladder": ["node_reboot", "gpu_reset"]}, "ladder"),  # must escalate
        ({"ladder": ["gpu_reset", "gpu_reset"]}, "ladder"),
        ({"ladder": ["format_disk"]}, "ladder"),
        ({"ladder": []}, "ladder"),
        ({"condition": "x" * 65}, "condition"),
        ({"condition": "not camel"}, "condition"),
        ({"priority": 1}, "priority"),  # an unknown field
    ],
)
def test_bad_input_is_a_400_naming_the_field(operator, catalog, change, field):
    response = operator.put(f"{URL}/xid-31", {**RULE, **change}, format="json")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    fields = {body.get("field")} | {
        e.get("field", "").split(".")[0] for e in body.get("errors", [])
    }
    assert field in fields, body
    assert not HealthRule.objects.exists()


def test_the_dry_run_reports_what_unsaved_rules_would_have_done(operator, make_host):
    host = make_host("h100-sxm5-80gb", gpus=1, hostname="dry-01")
    gpu = Gpu.objects.get(host=host)
    start = timezone.now() - timedelta(days=2)
    XidEvent.objects.bulk_create(
        [
            XidEvent(
                host=host, gpu_uuid=gpu.uuid, ts=start + timedelta(minutes=m), xid=31, report_seq=m
            )
            for m in (0, 2, 4)
        ]
    )
    # today's rules: Xid 31 is logged only
    body = operator.post(f"{URL}/dry-run", {"days": 7}, format="json").json()
    assert (body["firings"], body["actions"]) == ([], {})
    rule = {"key": "xid-31", **RULE}
    body = operator.post(f"{URL}/dry-run", {"days": 7, "rules": [rule]}, format="json").json()
    assert body["actions"] == {"gpu_reset": 1}
    assert [(f["gpu_uuid"], f["count"], f["step"]) for f in body["firings"]] == [(gpu.uuid, 3, 0)]
    assert not HealthRule.objects.exists()  # nothing saved
    bad = operator.post(
        f"{URL}/dry-run", {"days": 7, "rules": [{**rule, "key": "xid-x"}]}, format="json"
    )
    assert (bad.status_code, bad.json()["field"]) == (400, "rules[0].key")
    too_far = operator.post(f"{URL}/dry-run", {"days": 91}, format="json")
    assert too_far.status_code == 400


def test_operators_list_and_resume_open_breakers_through_the_api(operator, owner, catalog):
    from fleet.models import BreakerTrip

    trip = BreakerTrip.objects.create(
        scope="model:h100-sxm5-80gb", tripped_at=timezone.now(), reason="budget 1 used"
    )
    assert owner.get("/api/v1/fleet/breakers").status_code == 403
    listed = operator.get("/api/v1/fleet/breakers").json()
    assert [(t["scope"], t["reason"]) for t in listed] == [(trip.scope, "budget 1 used")]
    url = f"/api/v1/fleet/breakers/{trip.scope}/resume"
    assert owner.post(url).status_code == 403
    body = operator.post(url).json()
    assert body["resumed_by"].startswith("apikey:") and body["resumed_at"]
    assert operator.get("/api/v1/fleet/breakers").json() == []
    assert operator.post(url).status_code == 404  # nothing open any more
    assert AuditEvent.objects.get(action="breaker.resume").target_id == trip.scope
