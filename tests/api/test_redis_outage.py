"""The API with Redis down: reads keep working (the throttle fails open, counted), mutations
commit and answer 202 (the beat resync sends their messages later), and no /api/ path answers
an HTML 500. Also the throttle itself: one counter per window, 429 past the rate.

"Redis down" is real: settings, the cache, the throttle's client and the Celery app are pointed
at a Unix socket nobody listens on, so every Redis call fails with a connection error.
"""

from __future__ import annotations

import json

import pytest
import redis
from django.test import RequestFactory

pytestmark = pytest.mark.django_db


def counter_value(counter, *labels) -> float:
    return counter.labels(*labels)._value.get()


@pytest.fixture
def redis_down(settings, tmp_path):
    from nvke import throttling
    from nvke.celery import app

    dead = tmp_path / "nobody-listens.sock"
    settings.REDIS_URL = f"unix://{dead}?db=0"
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": settings.REDIS_URL,
            "KEY_PREFIX": "nvke",
        }
    }
    old_broker = app.conf.broker_write_url

    def point_celery_at(url):
        app.conf.broker_write_url = url
        app._pool = None
        app.amqp._producer_pool = None

    point_celery_at(f"redis+socket://{dead}")
    throttling.reset_client()
    yield
    point_celery_at(old_broker)
    throttling.reset_client()


@pytest.fixture
def cluster(tenant_a):
    from clusters.models import Cluster

    return Cluster.objects.create(
        tenant=tenant_a, name="c1", kubernetes_version="1.36", region="us-east-1"
    )


def test_reads_keep_working_and_the_throttle_fails_open_counted(redis_down, owner, cluster):
    from nvke.throttling import FAIL_OPEN

    before = {s: counter_value(FAIL_OPEN, s) for s in ("principal", "tenant")}
    resp = owner.get("/api/v1/clusters")
    assert resp.status_code == 200
    assert [c["name"] for c in resp.json()["results"]] == ["c1"]
    assert owner.get(f"/api/v1/clusters/{cluster.id}").json()["id"] == str(cluster.id)
    # two requests, each checked against both scopes, each let through
    assert {s: counter_value(FAIL_OPEN, s) - before[s] for s in before} == {
        "principal": 2,
        "tenant": 2,
    }


def test_a_mutation_with_the_broker_down_commits_and_the_resync_finds_it(
    make_host, redis_down, owner, tenant_a, django_capture_on_commit_callbacks
):
    from clusters.models import Cluster, Operation
    from clusters.reconcile import clusters_needing_reconcile
    from nvke.queueing import ENQUEUE_FAILURES

    make_host("a10g", gpus=1, zone="us-east-1a")
    before = counter_value(ENQUEUE_FAILURES, "clusters.tasks.reconcile_cluster")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        resp = owner.post(
            "/api/v1/clusters", {"name": "c2", "kubernetes_version": "1.36", "region": "us-east-1"}
        )
    assert resp.status_code == 202, resp.content
    assert len(callbacks) == 1  # the send was attempted after the commit, and failed
    assert counter_value(ENQUEUE_FAILURES, "clusters.tasks.reconcile_cluster") - before == 1
    op = Operation.objects.get(pk=resp.json()["id"])
    assert (op.type, op.status) == ("CREATE_CLUSTER", "PENDING")
    cluster = Cluster.objects.get(tenant=tenant_a, name="c2")
    assert cluster.phase == "PROVISIONING"
    assert cluster.id in clusters_needing_reconcile()  # the resync sends it once Redis is back


def test_api_server_errors_are_problem_json_never_html():
    from nvke.http import server_error

    request = RequestFactory().get("/api/v1/clusters")
    try:
        raise redis.ConnectionError("Error 111 connecting")
    except redis.ConnectionError:
        resp = server_error(request)
    body = json.loads(resp.content)
    assert (resp.status_code, resp["Content-Type"], resp["Retry-After"]) == (
        503,
        "application/problem+json",
        "5",
    )
    assert (body["code"], body["retryable"]) == ("broker_unavailable", True)
    try:
        raise ValueError("a bug")
    except ValueError:
        resp = server_error(request)
    assert (resp.status_code, json.loads(resp.content)["code"]) == (500, "internal_error")
    assert resp["Content-Type"] == "application/problem+json"
    try:
        raise ValueError("a bug")
    except ValueError:
        page = server_error(RequestFactory().get("/portal/"))
    assert page.status_code == 500 and page["Content-Type"].startswith("text/html")


def test_a_database_outage_inside_a_drf_view_is_a_503_problem():
    from django.db import OperationalError

    from nvke.errors import problem_exception_handler

    resp = problem_exception_handler(OperationalError("server closed the connection"), {})
    assert (resp.status_code, resp.data["code"], resp.data["retryable"]) == (
        503,
        "database_unavailable",
        True,
    )
    assert resp["Retry-After"] == "5"


def test_the_throttle_counts_in_one_key_per_window_and_refuses_past_the_rate(
    settings, owner, tenant_a, cluster, monkeypatch
):
    import math
    import time
    from types import SimpleNamespace

    from django.conf import settings as live

    from nvke import throttling

    settings.REST_FRAMEWORK = {
        **live.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"principal": "3/min", "tenant": "100/min"},
    }
    # the throttle's clock pinned 30 s into a minute: all six requests fall in one window
    # whatever the wall clock does, so its key is known exactly (window start = minute)
    minute = int(time.time()) // 60
    monkeypatch.setattr(
        throttling,
        "time",
        SimpleNamespace(time=lambda: minute * 60 + 30.0, monotonic=time.monotonic),
    )
    throttling.reset_client()
    client = redis.Redis.from_url(live.REDIS_URL)
    for key in client.scan_iter("nvke:throttle:*"):
        client.delete(key)
    codes = [owner.get("/api/v1/clusters").status_code]

    def script_calls() -> int:
        stats = client.info("commandstats")
        return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "eval"))

    before = script_calls()
    codes += [owner.get("/api/v1/clusters").status_code for _ in range(4)]
    # both throttles (principal and tenant) count a request in one script call: 4 requests, 4
    assert script_calls() - before == 4
    assert codes == [200, 200, 200, 429, 429]
    refused = owner.get("/api/v1/clusters")
    assert refused.json()["code"] == "throttled"
    principal_keys = list(client.scan_iter("nvke:throttle:principal:*"))
    tenant_keys = list(client.scan_iter("nvke:throttle:tenant:*"))
    # six requests in one window: one counter per scope, named for that window's minute
    assert len(principal_keys) == 1 and len(tenant_keys) == 1
    assert principal_keys[0].decode().endswith(f":{minute}")
    assert tenant_keys[0].decode() == f"nvke:throttle:tenant:{tenant_a.pk}:{minute}"
    assert int(client.get(principal_keys[0])) == 6
    assert int(client.get(tenant_keys[0])) == 6
    # the counter lives one window (60 s) from its first hit, a few hundred ms ago; Retry-After
    # is what was left of it in whole seconds, rounded up, when the sixth request was refused
    ttl = client.pttl(principal_keys[0])
    assert 50_000 < ttl <= 60_000
    assert int(refused["Retry-After"]) in (math.ceil(ttl / 1000), math.ceil(ttl / 1000) + 1)
