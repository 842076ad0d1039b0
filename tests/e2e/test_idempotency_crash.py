"""``Idempotency-Key`` across a web process SIGKILLed mid-request (issue 29 item 1).

A real gunicorn (2 sync workers) serves ``POST /api/v1/clusters`` with an ``Idempotency-Key``;
its whole process group is SIGKILLed at two fixed points, then started again and the client
retries with the same key:

* before the view's commit: the test holds a lock on the idempotency table, so the request
  stops after the view has written the cluster and before its transaction commits. Nothing
  may be applied, and the retry must run the request (before the fix: 409
  ``idempotency_key_in_progress`` for 24 h, the claim row committed with a null status);
* after the commit: the test waits until the cluster is visible to another connection, then
  kills. The retry must get the stored response (``Idempotent-Replayed``) and apply nothing
  again.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import requests
from django.db import connection, transaction

from tests.e2e.conftest import WebProcess, service_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CLUSTER = {"kubernetes_version": "1.36", "region": "us-east-1"}


@pytest.fixture
def web(tmp_path, tenant_a, make_host):
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")  # the region has GPU hosts
    server = WebProcess(tmp_path / "web.log", service_env())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def key(tenant_a) -> str:
    from tenants.services import create_api_key

    return create_api_key(tenant=tenant_a, name="owner-key", role="owner")[1]


def post(web: WebProcess, key: str, name: str, idem: str) -> requests.Response:
    return requests.post(
        f"{web.url}/api/v1/clusters",
        json={**CLUSTER, "name": name},
        headers={"Authorization": f"Bearer {key}", "Idempotency-Key": idem},
        timeout=60,
    )


def in_background(fn) -> threading.Thread:
    def run() -> None:
        # the server is killed under the request: that is the point
        with contextlib.suppress(requests.RequestException):
            fn()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def clusters(name: str) -> int:
    from clusters.models import Cluster

    return Cluster.objects.filter(name=name).count()


def retry_until_answered(web: WebProcess, key: str, name: str, idem: str) -> requests.Response:
    """Retry as a client would: a 409 in progress is retryable (the killed request's backend
    may take a moment to end); anything else is the answer."""
    deadline = time.monotonic() + 30
    while True:
        response = post(web, key, name, idem)
        if response.status_code != 409 or time.monotonic() > deadline:
            return response
        time.sleep(0.5)


def test_killed_before_the_views_commit_applies_nothing_and_the_retry_runs_it(web, key):
    from nvke.models import IdempotencyRecord

    # the view's record INSERT waits on this lock
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("LOCK TABLE nvke_idempotencyrecord IN SHARE ROW EXCLUSIVE MODE")

        def waiting() -> bool:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted"
                " AND relation = 'nvke_idempotencyrecord'::regclass"
            )
            return cursor.fetchone()[0] == 1

        request = in_background(lambda: post(web, key, "before", "k-before"))
        wait_for(waiting, timeout=30, what="the request to wait before its commit")
        web.kill()
    request.join(10)
    assert clusters("before") == 0  # the killed request's transaction never committed
    assert not IdempotencyRecord.objects.exists()

    web.start()
    answer = retry_until_answered(web, key, "before", "k-before")
    assert answer.status_code == 202, answer.text
    assert "Idempotent-Replayed" not in answer.headers  # it ran: nothing had been applied
    assert clusters("before") == 1
    again = post(web, key, "before", "k-before")
    assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (202, "true")
    assert again.json() == answer.json()
    assert clusters("before") == 1


def test_killed_after_the_views_commit_the_retry_gets_the_stored_response(web, key):
    from clusters.models import Cluster, Operation

    request = in_background(lambda: post(web, key, "after", "k-after"))
    wait_for(lambda: clusters("after") == 1, timeout=30, interval=0.01, what="the commit")
    web.kill()
    request.join(10)

    web.start()
    answer = retry_until_answered(web, key, "after", "k-after")
    assert (answer.status_code, answer.headers.get("Idempotent-Replayed")) == (202, "true")
    cluster = Cluster.objects.get(name="after")
    assert answer.json()["target_id"] == str(cluster.id)
    assert Operation.objects.filter(target_id=cluster.id).count() == 1  # applied once
    assert clusters("after") == 1
