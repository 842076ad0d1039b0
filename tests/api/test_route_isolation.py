"""Walk every route of the URLconf: each must be classified here, so a new endpoint fails
this test until its tenant isolation is stated and checked.

For tenant-scoped routes: the owner gets 200; the outsider (tenant B) gets 404 with the same
body as a missing id (or a list without A's objects); a viewer cannot write (403); no
credentials -> 401. Operator routes refuse tenants (403) and anonymous callers (401).
"""

from __future__ import annotations

import uuid

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from tests.helpers import drive_cluster, drive_pool

pytestmark = pytest.mark.django_db

MISSING = "00000000-0000-0000-0000-000000000000"

#: route name -> kind. "tenant-detail" routes take ids of tenant A's objects.
ROUTES = {
    "tenant-list": "tenant-list",
    "tenant-detail": "tenant-detail",
    "tenant-api-keys": "tenant-detail",
    "cluster-list": "tenant-list",
    "cluster-detail": "tenant-detail",
    "operation-list": "tenant-list",
    "operation-detail": "tenant-detail",
    "nodepool-list": "tenant-detail",
    "nodepool-detail": "tenant-detail",
    "cluster-usage": "tenant-detail",
    "nodepool-set-size": "tenant-write",
    "nodepool-upgrade": "tenant-write",
    "nodepool-autoscaling": "tenant-write",
    "nodepool-resume-upgrade": "tenant-write",
    "nodepool-gpu-config": "tenant-detail",
    "nodepool-disruption-hook": "tenant-write",
    "nodepool-disruption-request-list": "tenant-detail",
    "nodepool-disruption-request-detail": "tenant-detail",
    "nodepool-disruption-request-ack": "tenant-write",
    "cluster-kubeconfig": "tenant-detail",
    "cluster-rotate-credentials": "tenant-write",
    "operation-cancel": "tenant-write",
    "member-list": "tenant-detail",
    "member-detail": "tenant-write",
    "tenant-api-key-detail": "tenant-write",
    "quota-list": "tenant-list",
    "quota-detail": "tenant-detail",
    "audit-event-list": "tenant-list",
    "operator-key-list": "operator",
    "operator-key-detail": "operator",
    "host-list": "operator",
    "host-detail": "operator",
    "host-bootstrap-token": "operator",
    # fleet operator routes (checked in test_fleet_operator_routes_* below)
    "host-cordon": "operator",
    "host-uncordon": "operator",
    "host-drain": "operator",
    "host-maintenance": "operator",
    "host-retire": "operator",
    "host-mark-healthy": "operator",
    "host-events": "operator",
    "host-checks": "operator",
    "host-scrubs": "operator",
    "host-tenancy": "operator",
    "host-slices": "operator",
    "host-health": "operator",
    "host-telemetry": "operator",
    "fleet-fragmentation": "operator",
    "health-rules": "operator",
    "health-rule": "operator",
    "health-rules-dry-run": "operator",
    "breakers": "operator",
    "breaker-resume": "operator",
    "defrag-plan": "operator",
    "defrag-run-list": "operator",
    "defrag-run-detail": "operator",
    "gpu-model-list": "catalog",
    "gpu-model-detail": "catalog",
    "kubernetes-version-list": "catalog",
    "driver-branch-list": "catalog",
    "cuda-version-list": "catalog",
    "xid-code-list": "catalog",
    "xid-code-detail": "catalog",
    "agent-register": "agent",
    "agent-reports": "agent",
    "schema": "public",
    "docs": "public",
    "api-root": "public",  # a static index of the two above (tests/api/test_api_root.py)
    # billing (checked in test_billing_routes_* below)
    "usage": "tenant-list",
    "usage-csv": "tenant-list",
    "ledger-list": "tenant-list",
    "ledger-csv": "tenant-list",
    "invoice-list": "tenant-list",
    "invoice-list-csv": "tenant-list",
    "invoice-detail": "tenant-detail",
    "invoice-detail-csv": "tenant-detail",
    "invoice-finalize": "operator",
    "utilization": "tenant-list",
    # webhooks: tenant admins write
    "webhook-list": "tenant-list",
    "webhook-detail": "tenant-detail",
    "webhook-rotate-secret": "tenant-write",
    "webhook-delivery-list": "tenant-detail",
    "webhook-delivery-detail": "tenant-detail",
    "webhook-delivery-redeliver": "tenant-write",
    # reservations: tenant-scoped; the calendar is counts only (checked below)
    "reservation-list": "tenant-list",
    "reservation-detail": "tenant-detail",
    "reservation-cancel": "tenant-write",
    "reservation-calendar": "catalog",
}


def api_routes():
    """``[(name, pattern string)]`` for every route under /api/v1/."""
    out = []

    def walk(patterns, prefix):
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                out.append((p.name, prefix + str(p.pattern)))

    walk(get_resolver().url_patterns, "")
    return [(name, pat) for name, pat in out if pat.startswith("api/v1/")]


def test_every_api_route_is_classified():
    unclassified = sorted({name for name, _ in api_routes()} - set(ROUTES))
    assert unclassified == [], f"classify these routes in ROUTES and test them: {unclassified}"


@pytest.fixture
def world(owner, import_capture, tenant_a, operator):
    """Tenant A's cluster, running node pool and operation; a host."""
    host = import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b").host
    op = owner.post(
        "/api/v1/clusters",
        {"name": "c1", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    ).json()
    drive_cluster(op["target_id"])
    pool_op = owner.post(
        f"/api/v1/clusters/{op['target_id']}/nodepools",
        {"name": "p1", "gpu_model": "a10g", "gpus_per_node": 1, "node_count": 1},
        format="json",
    ).json()
    drive_pool(pool_op["target_id"])
    hook, delivery = _webhook(tenant_a)
    from datetime import timedelta

    from django.utils import timezone

    from reservations.models import Reservation

    reservation = Reservation.objects.create(  # rows: H100 capacity is not what is tested
        tenant=tenant_a,
        gpu_model_id="h100-sxm5-80gb",
        region="us-east-1",
        gpus=8,
        start=timezone.now() + timedelta(hours=1),
        end=timezone.now() + timedelta(hours=3),
        end_action="drain",  # its GPUs come back at the end (keep would count on after it)
    )
    from nodepools.models import DisruptionRequest

    asked = DisruptionRequest.objects.create(  # a row: how one is asked is tested elsewhere
        tenant=tenant_a,
        nodepool_id=pool_op["target_id"],
        nodes=["n1"],
        reason="upgrade",
        requested_at=timezone.now(),
        deadline=timezone.now() + timedelta(hours=1),
    )
    return {
        "disruption": str(asked.id),
        "reservation": str(reservation.id),
        "webhook": str(hook.id),
        "delivery": str(delivery.id),
        "cluster": op["target_id"],
        "pool": pool_op["target_id"],
        "operation": op["id"],
        "tenant": str(tenant_a.id),
        "host": str(host.id),
    }


def _webhook(tenant):
    """An endpoint of tenant A (rows: registration checks the target) with one delivery."""
    from datetime import timedelta

    from django.utils import timezone

    from nvke import crypto
    from webhooks.models import WebhookDelivery, WebhookEndpoint

    hook = WebhookEndpoint.objects.create(
        tenant=tenant,
        url="https://8.8.8.8/hook",
        event_types=["quota.80"],
        secret_encrypted=crypto.encrypt("whsec_" + "A" * 44),
    )
    delivery = WebhookDelivery.objects.create(
        tenant=tenant,
        endpoint=hook,
        event_id="e1",
        event_type="quota.80",
        event={"id": "e1"},
        deadline=timezone.now() + timedelta(hours=1),
    )
    return hook, delivery


def detail_urls(world, missing=False):
    ids = {k: (MISSING if missing else v) for k, v in world.items()}
    c = ids["cluster"] if not missing else MISSING
    return {
        "tenant-detail": f"/api/v1/tenants/{ids['tenant']}",
        "tenant-api-keys": f"/api/v1/tenants/{ids['tenant']}/api-keys",
        "cluster-detail": f"/api/v1/clusters/{c}",
        "operation-detail": f"/api/v1/operations/{ids['operation']}",
        "nodepool-list": f"/api/v1/clusters/{c}/nodepools",
        "nodepool-detail": f"/api/v1/clusters/{c}/nodepools/{ids['pool']}",
        "nodepool-gpu-config": f"/api/v1/clusters/{c}/nodepools/{ids['pool']}/gpu-config",
        "nodepool-disruption-hook": f"/api/v1/clusters/{c}/nodepools/{ids['pool']}/disruption-hook",
        "nodepool-disruption-request-list": (
            f"/api/v1/clusters/{c}/nodepools/{ids['pool']}/disruption-requests"
        ),
        "nodepool-disruption-request-detail": (
            f"/api/v1/clusters/{c}/nodepools/{ids['pool']}/disruption-requests/{ids['disruption']}"
        ),
        "cluster-usage": f"/api/v1/clusters/{c}/usage",
        "member-list": f"/api/v1/tenants/{ids['tenant']}/members",
        "cluster-kubeconfig": f"/api/v1/clusters/{c}/kubeconfig",
        "quota-detail": f"/api/v1/quotas/{ids['tenant']}",
        "reservation-detail": f"/api/v1/reservations/{ids['reservation']}",
        "webhook-detail": f"/api/v1/webhooks/{ids['webhook']}",
        "webhook-delivery-list": f"/api/v1/webhooks/{ids['webhook']}/deliveries",
        "webhook-delivery-detail": (
            f"/api/v1/webhooks/{ids['webhook']}/deliveries/{ids['delivery']}"
        ),
    }


LISTS = {
    "tenant-list": "/api/v1/tenants",
    "cluster-list": "/api/v1/clusters",
    "operation-list": "/api/v1/operations",
    "quota-list": "/api/v1/quotas",
    "audit-event-list": "/api/v1/audit-events",
    "webhook-list": "/api/v1/webhooks",
    "reservation-list": "/api/v1/reservations",
}


def write_requests(world, missing=False):
    """(method, url, body) for every tenant-scoped write route, on A's objects (or missing)."""
    ids = {k: (MISSING if missing else v) for k, v in world.items()}
    c, p, t = ids["cluster"], ids["pool"], ids["tenant"]
    return {
        # PATCH of nodepool-detail (an isolation change); first, before set-size starts an
        # operation that would make the pool busy (409)
        "nodepool-detail-patch": (
            "patch",
            f"/api/v1/clusters/{c}/nodepools/{p}",
            {"isolation": {"mode": "time-slicing", "replicas": 2}},
        ),
        "nodepool-autoscaling": (
            "put",
            f"/api/v1/clusters/{c}/nodepools/{p}/autoscaling",
            {"min_node_count": 1, "max_node_count": 3},
        ),
        "nodepool-disruption-hook": (
            "put",
            f"/api/v1/clusters/{c}/nodepools/{p}/disruption-hook",
            {"checkpoint_deadline_s": 60},
        ),
        "nodepool-disruption-request-ack": (
            "post",
            f"/api/v1/clusters/{c}/nodepools/{p}/disruption-requests/{ids['disruption']}/ack",
            None,
        ),
        "nodepool-upgrade": (
            "post",
            f"/api/v1/clusters/{c}/nodepools/{p}/upgrade",
            {"driver_version": "580.95.05"},
        ),
        "nodepool-resume-upgrade": (
            "post",
            f"/api/v1/clusters/{c}/nodepools/{p}/resume-upgrade",
            {"force": True},
        ),
        "nodepool-set-size": (
            "post",
            f"/api/v1/clusters/{c}/nodepools/{p}/set-size",
            {"node_count": 1},
        ),
        "member-detail": ("patch", f"/api/v1/tenants/{t}/members/alice", {"role": "viewer"}),
        "tenant-api-key-detail": ("delete", f"/api/v1/tenants/{t}/api-keys/nokey123", None),
        "member-list": ("post", f"/api/v1/tenants/{t}/members", {"username": "mallory"}),
        "tenant-api-keys": ("post", f"/api/v1/tenants/{t}/api-keys", {"name": "x"}),
        "nodepool-list": (
            "post",
            f"/api/v1/clusters/{c}/nodepools",
            {"name": "evil", "gpu_model": "a10g", "gpus_per_node": 1, "node_count": 1},
        ),
        "cluster-detail": ("delete", f"/api/v1/clusters/{c}", None),
        "cluster-rotate-credentials": ("post", f"/api/v1/clusters/{c}/rotate-credentials", None),
        "operation-cancel": ("post", f"/api/v1/operations/{ids['operation']}/cancel", None),
        "nodepool-detail": ("delete", f"/api/v1/clusters/{c}/nodepools/{p}", None),
        "quota-detail": ("put", f"/api/v1/quotas/{t}", {"max_nodes": 1000}),
        "webhook-rotate-secret": ("post", f"/api/v1/webhooks/{ids['webhook']}/rotate-secret", None),
        "webhook-delivery-redeliver": (
            "post",
            f"/api/v1/webhooks/{ids['webhook']}/deliveries/{ids['delivery']}/redeliver",
            None,
        ),
        "webhook-detail": ("delete", f"/api/v1/webhooks/{ids['webhook']}", None),
        "reservation-cancel": ("post", f"/api/v1/reservations/{ids['reservation']}/cancel", None),
    }


def test_outsider_cannot_write_to_tenant_a(outsider, world):
    missing = write_requests(world, missing=True)
    for name, (method, url, body) in write_requests(world).items():
        foreign = getattr(outsider, method)(url, body, format="json")
        absent = getattr(outsider, method)(missing[name][1], body, format="json")
        assert foreign.status_code == 404, (name, foreign.status_code, foreign.content)
        assert foreign.json() == absent.json(), name


def test_viewer_gets_403_on_every_write(viewer, world):
    for name, (method, url, body) in write_requests(world).items():
        resp = getattr(viewer, method)(url, body, format="json")
        assert resp.status_code == 403, (name, resp.status_code, resp.content)


def test_member_writes_clusters_but_not_keys_members_or_quotas(tenant_a, world):
    from tests.conftest import _client, _key

    member = _client(_key(tenant_a, "member"))
    allowed = {
        "nodepool-autoscaling",
        "nodepool-disruption-hook",
        "nodepool-disruption-request-ack",
        "nodepool-upgrade",
        "nodepool-resume-upgrade",
        "nodepool-detail-patch",
        "nodepool-set-size",
        "nodepool-list",
        "nodepool-detail",
        "cluster-detail",
        "cluster-rotate-credentials",
        "operation-cancel",
    }
    for name, (method, url, body) in write_requests(world).items():
        resp = getattr(member, method)(url, body, format="json")
        if name in allowed:  # the role may: any refusal is about state, never permission
            assert resp.status_code < 500, (name, resp.content)
            assert resp.status_code in (200, 201, 202) or resp.json()["code"] not in (
                "permission_denied",
                "not_found",
            ), (name, resp.content)
        else:
            assert resp.status_code == 403, (name, resp.status_code, resp.content)


def test_admin_manages_keys_but_not_members_or_quotas(tenant_a, world):
    from tests.conftest import _client, _key

    admin = _client(_key(tenant_a, "admin"))
    t = world["tenant"]
    created = admin.post(f"/api/v1/tenants/{t}/api-keys", {"name": "ci"}, format="json")
    assert created.status_code == 201
    prefix = created.json()["prefix"]
    assert admin.delete(f"/api/v1/tenants/{t}/api-keys/{prefix}").json()["revoked"] is True
    assert admin.post(f"/api/v1/tenants/{t}/members", {"username": "bob"}).status_code == 403
    assert admin.put(f"/api/v1/quotas/{t}", {"max_nodes": 9}, format="json").status_code == 403
    owner_key = admin.post(
        f"/api/v1/tenants/{t}/api-keys", {"name": "o", "role": "owner"}, format="json"
    )
    assert (owner_key.status_code, owner_key.json()["code"]) == (403, "role_too_high")


def results(body):
    return body["results"] if isinstance(body, dict) and "results" in body else body


def test_owner_reads_every_tenant_route(owner, world):
    for name, url in {**detail_urls(world), **LISTS}.items():
        resp = owner.get(url)
        assert resp.status_code == 200, (name, resp.status_code, resp.content)


def test_outsider_gets_404_like_a_missing_object(outsider, owner, world):
    missing = detail_urls(world, missing=True)
    for name, url in detail_urls(world).items():
        foreign = outsider.get(url)
        absent = outsider.get(missing[name])
        assert foreign.status_code == 404, (name, foreign.status_code)
        assert foreign.json() == absent.json(), name
        if name in ("cluster-detail", "nodepool-detail"):
            assert outsider.delete(url).status_code == 404, name
    assert (
        outsider.post(
            f"/api/v1/clusters/{world['cluster']}/nodepools",
            {"name": "evil", "gpu_model": "a10g", "gpus_per_node": 1, "node_count": 1},
            format="json",
        ).status_code
        == 404
    )


def test_outsider_lists_do_not_show_tenant_a(outsider, world):
    for name, url in LISTS.items():
        resp = outsider.get(url)
        assert resp.status_code == 200, name
        text = resp.content.decode()
        assert not [v for v in world.values() if v in text], name  # no id of A anywhere


def test_viewer_cannot_write(viewer, world):
    assert viewer.delete(f"/api/v1/clusters/{world['cluster']}").status_code == 403
    assert (
        viewer.delete(f"/api/v1/clusters/{world['cluster']}/nodepools/{world['pool']}").status_code
        == 403
    )
    resp = viewer.post(
        "/api/v1/clusters", {"name": "x", "kubernetes_version": "1.36", "region": "us-east-1"}
    )
    assert resp.status_code == 403
    assert (
        viewer.post(f"/api/v1/tenants/{world['tenant']}/api-keys", {"name": "k"}).status_code == 403
    )
    assert viewer.get(f"/api/v1/clusters/{world['cluster']}").status_code == 200


def test_no_credentials_is_401(anonymous, world):
    urls = [*detail_urls(world).values(), *LISTS.values(), "/api/v1/fleet/hosts"]
    urls.append("/api/v1/catalog/gpu-models")
    for url in urls:
        resp = anonymous.get(url)
        assert resp.status_code == 401, url
        assert resp.json()["code"] == "not_authenticated"


def test_operator_routes_refuse_tenants(owner, operator, world):
    host = world["host"]
    for method, url in [
        ("get", "/api/v1/fleet/hosts"),
        ("get", f"/api/v1/fleet/hosts/{host}"),
        ("post", f"/api/v1/fleet/hosts/{host}/bootstrap-token"),
        ("post", "/api/v1/tenants"),
        ("get", "/api/v1/fleet/health-rules"),
        ("put", "/api/v1/fleet/health-rules/xid-79"),
        ("delete", "/api/v1/fleet/health-rules/xid-79"),
        ("post", "/api/v1/fleet/health-rules/dry-run"),
        ("get", "/api/v1/fleet/breakers"),
        ("post", "/api/v1/fleet/breakers/model:h100-sxm5-80gb/resume"),
    ]:
        assert getattr(owner, method)(url, {}, format="json").status_code == 403, url
    assert operator.get(f"/api/v1/fleet/hosts/{host}").status_code == 200
    assert operator.post("/api/v1/tenants", {"name": "t-new"}, format="json").status_code == 201


def test_operators_see_every_tenant(operator, world):
    assert operator.get(f"/api/v1/clusters/{world['cluster']}").status_code == 200


def test_catalog_and_public_routes(owner, anonymous, catalog):
    assert owner.get("/api/v1/catalog/gpu-models/a100-sxm4-80gb").status_code == 200
    assert owner.get("/api/v1/catalog/kubernetes-versions").status_code == 200
    for url in (
        "/api/v1/catalog/driver-branches",
        "/api/v1/catalog/cuda-versions",
        "/api/v1/catalog/xid-codes",
        "/api/v1/catalog/xid-codes/79",
    ):
        assert owner.get(url).status_code == 200, url
        assert anonymous.get(url).status_code == 401, url
        assert owner.post(url, {}, format="json").status_code == 405, url  # read-only
    assert anonymous.get("/api/v1/schema/").status_code == 200
    assert anonymous.get("/api/v1/docs/").status_code == 200


def test_reservation_calendar_is_counts_only_for_any_tenant(owner, outsider, anonymous, world):
    url = "/api/v1/reservations/calendar?gpu_model=h100-sxm5-80gb&region=us-east-1"
    assert anonymous.get(url).status_code == 401
    body = outsider.get(url)
    assert body.status_code == 200
    assert [i["reserved"] for i in body.json()["intervals"]] == [0, 8, 0]  # A's 8, unnamed
    assert world["reservation"] not in body.content.decode()
    assert world["tenant"] not in body.content.decode()
    assert outsider.post("/api/v1/reservations/calendar", {}).status_code == 405


def test_random_ids_are_404_not_500(owner):
    assert owner.get(f"/api/v1/clusters/{uuid.uuid4()}").status_code == 404
    assert owner.get("/api/v1/clusters/not-a-uuid").status_code == 404
    assert owner.get("/api/v1/operations/not-a-uuid").status_code == 404


# ---------------------------------------------------------------- billing routes

BILLING_LISTS = {
    "usage": "/api/v1/usage",
    "usage-csv": "/api/v1/usage.csv",
    "ledger-list": "/api/v1/ledger",
    "ledger-csv": "/api/v1/ledger.csv",
    "invoice-list": "/api/v1/invoices",
    "invoice-list-csv": "/api/v1/invoices.csv",
    "utilization": "/api/v1/utilization",
}


@pytest.fixture
def invoice(world, tenant_a):
    """Tenant A's DRAFT invoice of the current month (a10g at 1.00/GPU-h), usage aggregated."""
    from datetime import UTC, datetime
    from decimal import Decimal

    from django.utils import timezone

    from billing.aggregation import aggregate_usage
    from billing.invoices import build_invoice
    from billing.prices import set_price

    set_price(
        gpu_model="a10g",
        hourly_rate=Decimal("1.00"),
        effective_from=datetime(2020, 1, 1, tzinfo=UTC),
    )
    now = timezone.now()
    aggregate_usage(tenant_a.id, now, now, now)
    return str(build_invoice(tenant_a.id, f"{now:%Y-%m}", now).id)


def test_billing_routes_owner_reads_and_outsider_sees_nothing_of_a(owner, outsider, world, invoice):
    missing = {
        "invoice-detail": f"/api/v1/invoices/{MISSING}",
        "invoice-detail-csv": f"/api/v1/invoices/{MISSING}.csv",
    }
    mine = {
        "invoice-detail": f"/api/v1/invoices/{invoice}",
        "invoice-detail-csv": f"/api/v1/invoices/{invoice}.csv",
    }
    for name, url in {**BILLING_LISTS, **mine}.items():
        assert owner.get(url).status_code == 200, name
    for name, url in mine.items():
        foreign, absent = outsider.get(url), outsider.get(missing[name])
        assert foreign.status_code == 404, name
        assert foreign.json() == absent.json(), name
    assert owner.get("/api/v1/ledger").json()["count"] == 1  # A's one a10g GPU
    assert outsider.get("/api/v1/ledger").json()["count"] == 0
    assert outsider.get("/api/v1/invoices").json()["count"] == 0
    assert outsider.get("/api/v1/usage").json()["totals"]["gpu_seconds"] == "0"
    assert outsider.get("/api/v1/utilization").json()["groups"] == []
    for name in ("usage-csv", "ledger-csv", "invoice-list-csv"):
        lines = outsider.get(BILLING_LISTS[name]).content.decode().strip().splitlines()
        assert len(lines) == 1, (name, lines)  # the header only
        assert world["cluster"] not in lines[0]


def test_billing_routes_viewer_reads_only_operators_finalize_anonymous_401(
    viewer, owner, operator, anonymous, world, invoice
):
    assert viewer.get(f"/api/v1/invoices/{invoice}").status_code == 200
    assert viewer.post(f"/api/v1/invoices/{invoice}/finalize").status_code == 403
    assert owner.post(f"/api/v1/invoices/{invoice}/finalize").status_code == 403
    # the month is not over: the operator is allowed, the invoice refuses (409, not 403)
    resp = operator.post(f"/api/v1/invoices/{invoice}/finalize")
    assert (resp.status_code, resp.json()["code"]) == (409, "period_not_ended")
    assert operator.get(f"/api/v1/invoices/{invoice}").status_code == 200
    urls = [
        *BILLING_LISTS.values(),
        f"/api/v1/invoices/{invoice}",
        f"/api/v1/invoices/{invoice}.csv",
    ]
    for url in urls:
        resp = anonymous.get(url)
        assert resp.status_code == 401, url
        assert resp.json()["code"] == "not_authenticated"
    assert anonymous.post(f"/api/v1/invoices/{invoice}/finalize").status_code == 401


def fleet_operator_requests(host):
    """Every fleet operator route: ``[(method, url)]``."""
    base = f"/api/v1/fleet/hosts/{host}"
    return [
        *[
            ("post", f"{base}/{action}")
            for action in (
                "cordon",
                "uncordon",
                "drain",
                "maintenance",
                "retire",
                "mark-healthy",
                "tenancy",
            )
        ],
        *[
            ("get", f"{base}/{view}")
            for view in ("events", "checks", "scrubs", "health", "telemetry", "slices")
        ],
        ("get", "/api/v1/fleet/fragmentation"),
        ("get", "/api/v1/fleet/defrag/plan"),
        ("get", "/api/v1/fleet/defrag/runs"),
        ("post", "/api/v1/fleet/defrag/runs"),
    ]


def test_fleet_operator_routes_refuse_tenants_and_anonymous(
    owner, viewer, outsider, anonymous, operator, world
):
    from fleet.models import Host

    before = Host.objects.values_list("state", "drain_target").get(pk=world["host"])
    for method, url in fleet_operator_requests(world["host"]):
        for client in (owner, viewer, outsider):
            resp = getattr(client, method)(url, {}, format="json")
            assert (resp.status_code, resp.json()["code"]) == (403, "permission_denied"), url
        resp = getattr(anonymous, method)(url, {}, format="json")
        assert (resp.status_code, resp.json()["code"]) == (401, "not_authenticated"), url
    # nothing a tenant sent changed the host
    assert Host.objects.values_list("state", "drain_target").get(pk=world["host"]) == before
    for method, url in fleet_operator_requests(world["host"]):
        if method == "get":
            assert operator.get(url).status_code == 200, url
