"""Audit, idempotency, ETag/If-Match, throttling, quotas, members, keys, secrets."""

from __future__ import annotations

import pytest

from tests.helpers import drive_cluster, drive_pool

pytestmark = pytest.mark.django_db

CLUSTER = {"name": "c1", "kubernetes_version": "1.36", "region": "us-east-1"}


@pytest.fixture
def host(import_capture):
    return import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b").host


# ---------------------------------------------------------------- audit
def test_a_mutation_leaves_an_immutable_audit_event_with_request_id_and_ip(owner, host, tenant_a):
    from django.db import connection, transaction
    from django.db.utils import DatabaseError

    from tenants.models import AuditEvent

    resp = owner.post("/api/v1/clusters", CLUSTER, format="json", HTTP_X_REQUEST_ID="req-42")
    assert resp.status_code == 202
    (event,) = AuditEvent.objects.filter(action="cluster.create")
    assert event.tenant_id == tenant_a.pk
    assert event.actor.startswith("apikey:")
    assert event.target_id == resp.json()["target_id"]
    assert event.request_id == "req-42"
    assert event.source_ip == "127.0.0.1"
    assert event.before is None
    assert event.after == {
        "name": "c1",
        "kubernetes_version": "1.36",
        "region": "us-east-1",
        "provider": "simulated",
    }
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE tenants_auditevent SET actor = 'someone else'")
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEvent.objects.all().delete()


def test_audit_api_is_scoped_filtered_and_keeps_secrets_out(owner, outsider, operator, host):
    owner.post("/api/v1/clusters", CLUSTER, format="json")
    owner_key = owner.post(
        f"/api/v1/tenants/{owner.get('/api/v1/tenants').json()['results'][0]['id']}/api-keys",
        {"name": "ci", "role": "member"},
        format="json",
    ).json()
    events = owner.get("/api/v1/audit-events").json()["results"]
    assert [e["action"] for e in events] == ["apikey.create", "cluster.create"]
    assert owner_key["key"] not in str(events)
    only = owner.get("/api/v1/audit-events", {"action": "cluster.create"}).json()["results"]
    assert [e["action"] for e in only] == ["cluster.create"]
    assert outsider.get("/api/v1/audit-events").json()["results"] == []
    all_actions = {e["action"] for e in operator.get("/api/v1/audit-events").json()["results"]}
    assert {"cluster.create", "apikey.create"} <= all_actions


def test_operator_host_import_is_audited_without_the_xml_or_token(operator, catalog):
    from tenants.models import AuditEvent
    from tests.conftest import capture

    body = operator.post(
        "/api/v1/fleet/hosts",
        {"hostname": "h9", "zone": "us-east-1a", "nvidia_smi_xml": capture("tesla-t4.xml")},
        format="json",
    ).json()
    (event,) = AuditEvent.objects.filter(action="POST host-list")
    assert event.target_id == body["id"]
    assert body["bootstrap_token"] not in str(event.after)
    assert event.after["hostname"] == "h9"


# ---------------------------------------------------------------- idempotency
def test_idempotency_key_replays_the_first_response_and_does_the_work_once(owner, host):
    from clusters.models import Cluster

    first = owner.post("/api/v1/clusters", CLUSTER, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = owner.post("/api/v1/clusters", CLUSTER, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert Cluster.objects.count() == 1
    other = owner.post(
        "/api/v1/clusters", {**CLUSTER, "name": "c2"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    assert other.status_code == 422
    assert other.json()["code"] == "idempotency_key_reused"
    assert Cluster.objects.count() == 1


def test_idempotency_keys_are_per_caller(owner, outsider, host):
    from clusters.models import Cluster

    owner.post("/api/v1/clusters", CLUSTER, format="json", HTTP_IDEMPOTENCY_KEY="same")
    resp = outsider.post("/api/v1/clusters", CLUSTER, format="json", HTTP_IDEMPOTENCY_KEY="same")
    assert resp.status_code == 202
    assert Cluster.objects.count() == 2


# ---------------------------------------------------------------- ETag / If-Match
def test_if_match_with_a_stale_etag_is_412(owner, host):
    cluster = owner.post("/api/v1/clusters", CLUSTER, format="json").json()["target_id"]
    etag = owner.get(f"/api/v1/clusters/{cluster}")["ETag"]
    drive_cluster(cluster)  # status changes: the ETag changes
    fresh = owner.get(f"/api/v1/clusters/{cluster}")["ETag"]
    assert fresh != etag
    stale = owner.delete(f"/api/v1/clusters/{cluster}", HTTP_IF_MATCH=etag)
    assert (stale.status_code, stale.json()["code"]) == (412, "precondition_failed")
    assert owner.get(f"/api/v1/clusters/{cluster}").json()["phase"] == "RUNNING"
    assert owner.delete(f"/api/v1/clusters/{cluster}", HTTP_IF_MATCH=fresh).status_code == 202


# ---------------------------------------------------------------- throttling
def test_throttle_answers_429_with_retry_after(owner, settings, tenant_a):
    from django.core.cache import cache
    from rest_framework.settings import api_settings

    cache.clear()
    rates = {"principal": "3/min", "tenant": "1000/min"}
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}
    from rest_framework.throttling import SimpleRateThrottle

    old = SimpleRateThrottle.THROTTLE_RATES
    SimpleRateThrottle.THROTTLE_RATES = rates
    try:
        codes = [owner.get("/api/v1/clusters").status_code for _ in range(4)]
        resp = owner.get("/api/v1/clusters")
    finally:
        SimpleRateThrottle.THROTTLE_RATES = old
        cache.clear()
    assert codes == [200, 200, 200, 429]
    assert resp.status_code == 429
    assert int(resp["Retry-After"]) > 0
    assert resp.json()["code"] == "throttled"
    assert resp.json()["retryable"] is True
    assert api_settings  # settings module imported for the override above


# ---------------------------------------------------------------- quotas
def test_quota_refusal_says_what_and_how_much(owner, operator, host, tenant_a):
    from clusters.models import Cluster

    resp = operator.put(f"/api/v1/quotas/{tenant_a.pk}", {"max_clusters": 1}, format="json")
    assert resp.json()["clusters"]["limit"] == 1
    assert owner.post("/api/v1/clusters", CLUSTER, format="json").status_code == 202
    refused = owner.post("/api/v1/clusters", {**CLUSTER, "name": "c2"}, format="json")
    assert refused.status_code == 409
    body = refused.json()
    assert (body["code"], body["resource"], body["limit"], body["reserved"], body["requested"]) == (
        "quota_exceeded",
        "clusters",
        1,
        1,
        1,
    )
    assert Cluster.objects.count() == 1
    quota = owner.get(f"/api/v1/quotas/{tenant_a.pk}").json()
    assert quota["clusters"] == {"limit": 1, "reserved": 1, "in_use": 1}


def test_gpu_quota_counts_gpus_per_model_and_is_released_on_delete(owner, operator, host, tenant_a):
    operator.put(f"/api/v1/quotas/{tenant_a.pk}", {"max_gpus": {"a10g": 1}}, format="json")
    cluster = owner.post("/api/v1/clusters", CLUSTER, format="json").json()["target_id"]
    drive_cluster(cluster)
    pool = {"name": "p", "gpu_model": "a10g", "gpus_per_node": 1, "node_count": 1}
    url = f"/api/v1/clusters/{cluster}/nodepools"
    op = owner.post(url, pool, format="json").json()
    drive_pool(op["target_id"])  # one operation per cluster at a time
    refused = owner.post(url, {**pool, "name": "q"}, format="json").json()
    assert (refused["code"], refused["resource"], refused["available"]) == (
        "quota_exceeded",
        "gpus.a10g",
        0,
    )
    owner.delete(f"{url}/{op['target_id']}")
    drive_pool(op["target_id"])
    assert owner.post(url, {**pool, "name": "q"}, format="json").status_code == 202


# ---------------------------------------------------------------- members
def test_owner_manages_members_and_the_last_owner_stays(owner, tenant_a):
    from tenants.models import Membership

    members = f"/api/v1/tenants/{tenant_a.pk}/members"
    for name in ("alice", "bob"):
        resp = owner.post(members, {"username": name, "role": "owner"})
        assert (resp.status_code, resp.json()["role"]) == (201, "owner")
    assert owner.patch(f"{members}/alice", {"role": "viewer"}).json()["role"] == "viewer"
    assert owner.delete(f"{members}/alice").status_code == 204
    demote = owner.patch(f"{members}/bob", {"role": "member"})
    assert (demote.status_code, demote.json()["code"]) == (409, "last_owner")
    remove = owner.delete(f"{members}/bob")
    assert (remove.status_code, remove.json()["code"]) == (409, "last_owner")
    assert list(Membership.objects.values_list("user__username", "role")) == [("bob", "owner")]
    assert owner.get(members).json() == [
        {
            "username": "bob",
            "email": "",
            "role": "owner",
            "created_at": owner.get(members).json()[0]["created_at"],
        }
    ]


# ---------------------------------------------------------------- keys
def test_revoked_expired_and_garbage_keys_are_401(tenant_a, anonymous):
    from datetime import timedelta

    from django.utils import timezone

    from tenants.models import ApiKey
    from tenants.services import create_api_key

    revoked = create_api_key(tenant=tenant_a, name="r")[1]
    ApiKey.objects.filter(name="r").update(revoked=True)
    expired = create_api_key(
        tenant=tenant_a, name="e", expiry_date=timezone.now() - timedelta(seconds=1)
    )[1]
    for header in [
        f"Bearer {revoked}",
        f"Bearer {expired}",
        "Bearer garbage",
        "Basic abc",
        "Bearer",
    ]:
        resp = anonymous.get("/api/v1/clusters", HTTP_AUTHORIZATION=header)
        assert resp.status_code == 401, header
        assert resp.json()["code"] in ("invalid_api_key", "not_authenticated")


def test_a_key_is_shown_once(owner, tenant_a):
    created = owner.post(f"/api/v1/tenants/{tenant_a.pk}/api-keys", {"name": "ci"}, format="json")
    key = created.json()["key"]
    listed = owner.get(f"/api/v1/tenants/{tenant_a.pk}/api-keys").json()
    assert key not in str(listed)
    assert "key" not in listed[0]


# ---------------------------------------------------------------- secrets
def test_kubeconfig_is_encrypted_at_rest_downloadable_and_rotatable(owner, viewer, host, settings):
    from cryptography.fernet import Fernet
    from django.core.management import call_command

    from clusters.models import Cluster
    from nvke import crypto
    from tenants.models import AuditEvent

    first_key = Fernet.generate_key().decode()
    settings.NVKE_SECRET_KEYS = [first_key]
    crypto.reset_cache()
    try:
        cluster = owner.post("/api/v1/clusters", CLUSTER, format="json").json()["target_id"]
        drive_cluster(cluster)
        stored = Cluster.objects.get(pk=cluster).kubeconfig_encrypted
        assert "apiVersion" not in stored and stored.startswith("gAAAA")
        resp = owner.get(f"/api/v1/clusters/{cluster}/kubeconfig")
        assert resp["Content-Type"] == "application/yaml"
        assert resp.content.decode().startswith("apiVersion: v1\nkind: Config")
        assert viewer.get(f"/api/v1/clusters/{cluster}/kubeconfig").status_code == 403
        assert AuditEvent.objects.filter(action="cluster.kubeconfig.read").count() == 1
        new_key = Fernet.generate_key().decode()
        settings.NVKE_SECRET_KEYS = [new_key, first_key]
        crypto.reset_cache()
        call_command("rotate_secrets")
        settings.NVKE_SECRET_KEYS = [new_key]  # the old key is gone: rotated data still reads
        crypto.reset_cache()
        assert owner.get(f"/api/v1/clusters/{cluster}/kubeconfig").status_code == 200
    finally:
        crypto.reset_cache()
