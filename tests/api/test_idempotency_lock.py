"""``Idempotency-Key``: a request of a key that another request is running answers 409 while
(and only while) that request's transaction holds the key's advisory lock; the lock is the
claim, so it ends with its request (see nvke.idempotency; the crash tests with a real gunicorn
are in tests/e2e/test_idempotency_crash.py)."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True)

CLUSTER = {"name": "c1", "kubernetes_version": "1.36", "region": "us-east-1"}


@pytest.fixture
def owner_key(tenant_a):
    from tenants.services import create_api_key

    return create_api_key(tenant=tenant_a, name="owner-key", role="owner")[1]


def test_a_key_held_by_a_running_request_answers_409_and_is_free_when_it_ends(
    owner_key, make_host, catalog
):
    from rest_framework.test import APIClient

    from clusters.models import Cluster
    from nvke.idempotency import _lock_key, _sha
    from nvke.models import IdempotencyRecord

    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {owner_key}")
    scope = _sha(f"Bearer {owner_key}".encode(), b"POST", b"/api/v1/clusters", b"k-1")
    other = connection.copy()  # the "running request": its own database connection
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [_lock_key(scope)])
            busy = client.post(
                "/api/v1/clusters", CLUSTER, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
            )
            assert (busy.status_code, busy.json()["code"], busy.json()["retryable"]) == (
                409,
                "idempotency_key_in_progress",
                True,
            )
            assert not Cluster.objects.exists() and not IdempotencyRecord.objects.exists()
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_lock_key(scope)])
    finally:
        other.close()
    done = client.post("/api/v1/clusters", CLUSTER, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert done.status_code == 202
    record = IdempotencyRecord.objects.get(scope=scope)
    assert record.status == 202 and bytes(record.body) == done.content
    assert Cluster.objects.count() == 1


def test_a_claim_row_left_by_the_old_scheme_is_not_stuck(owner_key, make_host, catalog):
    """A null-status row (the pre-fix claim, committed before its view ran) never blocks."""
    from rest_framework.test import APIClient

    from clusters.models import Cluster
    from nvke.idempotency import _sha
    from nvke.models import IdempotencyRecord

    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {owner_key}")
    scope = _sha(f"Bearer {owner_key}".encode(), b"POST", b"/api/v1/clusters", b"k-old")
    IdempotencyRecord.objects.create(scope=scope, request_hash="x", status=None)
    done = client.post("/api/v1/clusters", CLUSTER, format="json", HTTP_IDEMPOTENCY_KEY="k-old")
    assert done.status_code == 202
    assert IdempotencyRecord.objects.get(scope=scope).status == 202
    assert Cluster.objects.count() == 1
