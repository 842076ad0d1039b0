"""Webhooks: operator-allowed targets, tenant admin only, tenant isolation, the deadline, and
every event type raised by the real place that causes it (a real repair, a real host drain,
a real quota reservation, a real invoice finalization, a real operation finishing)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.helpers import drive_cluster, drive_pool, make_cluster
from tests.nodepools.test_repair import fault, nodes
from tests.webhooks.receiver import Receiver, start

pytestmark = pytest.mark.django_db

ALL_TYPES = [
    "operation.finished",
    "operation.failed",
    "node.repaired",
    "node.replaced",
    "host.maintenance",
    "invoice.finalized",
    "quota.80",
    "quota.100",
]


@pytest.fixture
def loopback_allowed(settings):
    settings.NVKE_WEBHOOK_ALLOW_HTTP = True
    settings.NVKE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]


@pytest.fixture
def admin(tenant_a):
    from tests.conftest import _client, _key

    return _client(_key(tenant_a, "admin"))


def register(client, url="http://127.0.0.1:9/hook", types=None):
    return client.post(
        "/api/v1/webhooks", {"url": url, "event_types": types or ALL_TYPES}, format="json"
    )


def deliveries(event_type=None):
    from webhooks.models import WebhookDelivery

    qs = WebhookDelivery.objects.order_by("created_at")
    return list(qs.filter(event_type=event_type) if event_type else qs)


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/hook",  # loopback
        "https://10.1.2.3/hook",  # private
        "https://169.254.169.254/latest/meta-data",  # link-local (cloud metadata)
        "https://[::1]/hook",
        "http://8.8.8.8/hook",  # plain http is off by default
        # ports out of range (a 500 before: urllib's ValueError), found by the probe
        "https://1.1.1.1:99999/x",
        "https://1.1.1.1:65536/x",
        "https://1.1.1.1:0/x",
    ],
)
def test_targets_outside_what_the_operator_allows_are_refused(admin, url):
    resp = register(admin, url)
    body = resp.json()
    assert (resp.status_code, body["code"], body["field"]) == (
        400,
        "webhook_target_not_allowed",
        "url",
    )


def test_a_public_https_target_is_accepted_and_its_secret_shown_once(admin):
    resp = register(admin, "https://8.8.8.8/hook", ["quota.80"])
    assert resp.status_code == 201, resp.content
    secret = resp.json()["secret"]
    assert secret.startswith("whsec_")
    listed = admin.get("/api/v1/webhooks").json()["results"]
    assert [(h["url"], h["event_types"]) for h in listed] == [
        ("https://8.8.8.8/hook", ["quota.80"])
    ]
    assert "secret" not in listed[0]
    # audited (the fallback audit of mutations), the secret redacted
    from tenants.models import AuditEvent

    events = list(AuditEvent.objects.filter(action__contains="webhook"))
    assert len(events) == 1
    assert secret not in str(events[0].__dict__)


def test_unknown_event_types_name_the_field(admin, loopback_allowed):
    resp = register(admin, types=["cluster.exploded"])
    assert (resp.status_code, resp.json()["field"]) == (400, "event_types.0")
    # the refusal names every accepted type (webhooks.choices.EventType, 12 of them)
    detail = resp.json()["detail"]
    assert detail.startswith(
        'event_types.0: "cluster.exploded" is not an event type; valid: operation.finished,'
    )
    assert detail.endswith("reservation.ending, reservation.ended")
    assert detail.count(", ") == 11


def test_only_admins_manage_webhooks_and_other_tenants_see_nothing(
    admin, owner, viewer, outsider, loopback_allowed
):
    assert register(viewer).status_code == 403
    hook = register(admin).json()
    assert register(owner).status_code == 201
    assert outsider.get(f"/api/v1/webhooks/{hook['id']}").status_code == 404
    assert outsider.get(f"/api/v1/webhooks/{hook['id']}/deliveries").status_code == 404
    assert outsider.delete(f"/api/v1/webhooks/{hook['id']}").status_code == 404
    assert outsider.get("/api/v1/webhooks").json()["results"] == []
    assert viewer.delete(f"/api/v1/webhooks/{hook['id']}").status_code == 403
    assert admin.delete(f"/api/v1/webhooks/{hook['id']}").status_code == 204


def test_after_the_deadline_a_delivery_fails_with_its_log(tenant_a, settings, loopback_allowed):
    from webhooks import services
    from webhooks.models import WebhookEndpoint

    settings.NVKE_WEBHOOK_BACKOFF_S = 0.2
    settings.NVKE_WEBHOOK_DEADLINE_S = 1
    receiver = Receiver(answers=[500] * 10)
    server = start(receiver)
    try:
        _endpoint, secret = services.register_endpoint(
            tenant=tenant_a, url=receiver.url, event_types=["quota.80"]
        )
        receiver.secrets = [secret]
        (delivery,) = services.emit(
            tenant_id=tenant_a.id, event_type="quota.80", source="/t", subject="s", data={}
        )
        waits = []
        while (wait := services.attempt_delivery(delivery.id)) is not None:
            waits.append(wait)
            delivery.refresh_from_db()
            # the test plays the queue: jump to the next attempt's time
            type(delivery).objects.filter(pk=delivery.pk).update(
                deadline=delivery.deadline - timedelta(seconds=wait)
            )
        delivery.refresh_from_db()
        # 0.2 s, 0.4 s fit in the 1 s deadline (moved back by each wait); 0.8 s does not
        assert waits == [0.2, 0.4]
        assert (delivery.status, delivery.attempts) == ("FAILED", 3)
        assert [a["status_code"] for a in delivery.log] == [500, 500, 500]
        assert all(r.verified_with == [0] for r in receiver.received)
        assert WebhookEndpoint.objects.count() == 1
    finally:
        server.shutdown()


def test_a_target_refused_at_delivery_time_is_logged_without_a_request(tenant_a, settings):
    from nvke import crypto
    from webhooks import services
    from webhooks.models import WebhookEndpoint

    endpoint = WebhookEndpoint.objects.create(
        tenant=tenant_a,
        url="http://127.0.0.1:9/x",  # registered while allowed; the operator then closed it
        event_types=["quota.80"],
        secret_encrypted=crypto.encrypt("whsec_" + "A" * 44),
    )
    (delivery,) = services.emit(
        tenant_id=tenant_a.id, event_type="quota.80", source="/t", subject="s", data={}
    )
    assert services.attempt_delivery(delivery.id) == settings.NVKE_WEBHOOK_BACKOFF_S
    delivery.refresh_from_db()
    assert delivery.log[0]["status_code"] is None
    assert delivery.log[0]["error"] == "delivery failed (target not allowed)"
    assert endpoint.deliveries.count() == 1


def test_quota_thresholds_are_crossed_once_each():
    from tenants.quotas import crossed_thresholds

    assert crossed_thresholds(10, 7, 8) == [80]
    assert crossed_thresholds(10, 7, 10) == [80, 100]
    assert crossed_thresholds(10, 8, 9) == []
    assert crossed_thresholds(5, 3, 4) == [80]
    assert crossed_thresholds(0, 0, 1) == []


def test_quota_80_and_100_percent_come_from_real_reservations(
    admin, tenant_a, import_capture, loopback_allowed, django_capture_on_commit_callbacks
):
    from tenants.models import Quota
    from tenants.quotas import quota_for

    import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b")
    quota_for(tenant_a.id, lock=False)
    Quota.objects.filter(tenant=tenant_a).update(max_clusters=5)
    register(admin, types=["quota.80", "quota.100"])
    for i in range(5):
        with django_capture_on_commit_callbacks(execute=True):
            resp = admin.post(
                "/api/v1/clusters",
                {"name": f"c{i}", "kubernetes_version": "1.36", "region": "us-east-1"},
                format="json",
            )
        assert resp.status_code == 202, resp.content
    got = [(d.event_type, d.event["data"]) for d in deliveries()]
    assert got == [
        ("quota.80", {"resource": "clusters", "limit": 5, "reserved": 4, "percent": 80}),
        ("quota.100", {"resource": "clusters", "limit": 5, "reserved": 5, "percent": 100}),
    ]
    assert deliveries()[0].event["type"] == "dev.nvke.quota.80"


def test_operation_finished_comes_from_the_reconciler(
    admin, import_capture, loopback_allowed, django_capture_on_commit_callbacks
):
    import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b")
    register(admin, types=["operation.finished"])
    op = admin.post(
        "/api/v1/clusters",
        {"name": "c1", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    ).json()
    with django_capture_on_commit_callbacks(execute=True):
        drive_cluster(op["target_id"])
    (delivery,) = deliveries("operation.finished")
    assert delivery.event["subject"] == op["id"]
    assert (delivery.event["data"]["type"], delivery.event["data"]["status"]) == (
        "CREATE_CLUSTER",
        "DONE",
    )


def test_a_finished_operation_of_a_tenant_without_endpoints_is_never_serialized(
    admin, import_capture, monkeypatch, django_capture_on_commit_callbacks
):
    """Every finished operation emits (the reconcile benchmark: 1,058 of them, none
    subscribed); the event body is built only for a subscribed endpoint."""
    from clusters.api import serializers

    import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b")
    op = admin.post(
        "/api/v1/clusters",
        {"name": "c1", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    ).json()
    built = []
    real = serializers.OperationSerializer
    monkeypatch.setattr(
        serializers, "OperationSerializer", lambda op: built.append(op.id) or real(op)
    )
    with django_capture_on_commit_callbacks(execute=True):
        drive_cluster(op["target_id"])
    assert (deliveries(), built) == ([], [])


@pytest.fixture
def pool(admin, make_host):
    for _ in range(6):
        make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    cluster = make_cluster(admin, "c1")
    op = admin.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {"name": "h100", "gpu_model": "h100-sxm5-80gb", "gpus_per_node": 8, "node_count": 2},
    ).json()
    drive_pool(op["target_id"])
    return op["target_id"]


def test_node_repaired_and_replaced_come_from_auto_repair(admin, pool, loopback_allowed, settings):
    from fleet.models import Gpu

    # two repairs in a row in a small pool: past the circuit breaker's default budget (1 an
    # hour), which has its own test (tests/nodepools/test_circuit_breaker.py)
    settings.NVKE_BREAKER_SHARE = 1.0

    register(admin, types=["node.repaired", "node.replaced"])
    first, second = nodes(pool)
    fault(first, "WORKFLOW_XID_48", 48)  # reboot in place
    drive_pool(pool)
    Gpu.objects.filter(uuid=second.gpu_uuids[0]).update(health="UNHEALTHY")
    fault(second, "CONTACT_SUPPORT", 79)  # replace
    drive_pool(pool)
    got = [(d.event_type, d.event["data"]["node"], d.event["data"]["action"]) for d in deliveries()]
    assert got == [
        ("node.repaired", first.name, "reboot"),
        ("node.replaced", second.name, "replace"),
    ]
    assert deliveries()[0].event["data"]["reason"] == (
        f"GPU {first.gpu_uuids[0]}: Xid 48 (WORKFLOW_XID_48)"
    )


def test_host_maintenance_reaches_the_tenants_on_the_host_only(
    admin, pool, operator, outsider, loopback_allowed, django_capture_on_commit_callbacks
):
    from fleet.models import Host

    register(admin, types=["host.maintenance"])
    first = nodes(pool)[0]
    host = Host.objects.get(pk=first.host_id)
    with django_capture_on_commit_callbacks(execute=True):
        resp = operator.post(f"/api/v1/fleet/hosts/{host.id}/maintenance", {}, format="json")
    assert resp.status_code == 200, resp.content
    (delivery,) = deliveries("host.maintenance")
    assert delivery.event["subject"] == str(host.id)
    on_host = sorted(n.name for n in nodes(pool) if n.host_id == host.id)
    assert sorted(n["node"] for n in delivery.event["data"]["nodes"]) == on_host


def test_invoice_finalized_comes_from_finalization(admin, tenant_a, loopback_allowed):
    from datetime import UTC, datetime

    from billing.invoices import build_invoice, finalize_invoice
    from tenants.models import Tenant

    # a tenant of September: October is a month it existed in (no invoice before that)
    Tenant.objects.filter(pk=tenant_a.pk).update(created_at=datetime(2026, 9, 1, tzinfo=UTC))
    register(admin, types=["invoice.finalized"])
    draft = build_invoice(tenant_a.id, "2026-10", datetime(2026, 11, 2, tzinfo=UTC))
    done = finalize_invoice(draft.id, now=datetime(2026, 11, 2, tzinfo=UTC))
    (delivery,) = deliveries("invoice.finalized")
    assert delivery.event["data"]["number"] == done.number
    assert delivery.event["data"]["period_label"] == "2026-10"
    assert timezone.is_aware(done.finalized_at)
