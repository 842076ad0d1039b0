"""The API key cache (tenants/key_cache.py): a key that authenticated is read from the cache
(no query), and a revocation, a wrong secret, an expiry or a deleted tenant still answer 401 at
once. Real Redis (the suite's), real PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

pytestmark = pytest.mark.django_db


def _client(key: str):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


@pytest.fixture
def key(tenant_a):
    from tenants.services import create_api_key

    return create_api_key(tenant=tenant_a, name="cached", role="owner")[1]


def test_a_key_seen_recently_costs_no_query(key, django_assert_num_queries):
    client = _client(key)
    assert client.get("/api/v1/operations").status_code == 200  # reads the row, caches it
    # the page's count only (no operations: DRF runs no rows query for an empty page); the key
    # comes from the cache, and last_used_at was written by the first request (once a minute)
    with django_assert_num_queries(1):
        resp = client.get("/api/v1/operations")
    assert resp.status_code == 200 and resp.json()["count"] == 0


def test_revocation_is_honoured_at_once(key, tenant_a, owner):
    from tenants import key_cache

    client = _client(key)
    assert client.get("/api/v1/clusters").status_code == 200
    prefix = key.partition(".")[0]
    assert key_cache.lookup(key) is not None  # cached now
    resp = owner.delete(f"/api/v1/tenants/{tenant_a.pk}/api-keys/{prefix}")
    assert resp.status_code in (200, 204), resp.content
    assert key_cache.lookup(key) is None
    denied = client.get("/api/v1/clusters")
    assert denied.status_code == 401 and denied.json()["code"] == "invalid_api_key"


def test_a_wrong_secret_with_a_cached_prefix_is_refused(key):
    client = _client(key)
    assert client.get("/api/v1/clusters").status_code == 200
    prefix, _, secret = key.partition(".")
    forged = f"{prefix}.{'x' * len(secret)}"
    denied = _client(forged).get("/api/v1/clusters")
    assert denied.status_code == 401 and denied.json()["code"] == "invalid_api_key"
    assert _client(key).get("/api/v1/clusters").status_code == 200  # the real one still works


def test_an_expiry_set_on_a_cached_key_applies_at_once(key):
    from tenants.models import ApiKey

    client = _client(key)
    assert client.get("/api/v1/clusters").status_code == 200
    row = ApiKey.objects.get(prefix=key.partition(".")[0])
    row.expiry_date = timezone.now() - timedelta(seconds=1)
    row.save(update_fields=["expiry_date"])  # the admin's way: a save, which drops the entry
    assert client.get("/api/v1/clusters").status_code == 401


def test_a_cached_entry_past_its_expiry_is_refused(tenant_a):
    """The cached expiry is checked on every request, not only when the row is read."""
    from tenants import key_cache
    from tenants.services import create_api_key

    soon = timezone.now() + timedelta(minutes=5)
    key = create_api_key(tenant=tenant_a, name="soon", role="viewer", expiry_date=soon)[1]
    client = _client(key)
    assert client.get("/api/v1/clusters").status_code == 200
    entry = key_cache.lookup(key)
    assert entry is not None and entry.expiry_date == soon
    # the same entry, as the cache would hold it a little after the expiry passed
    import dataclasses

    key_cache.store(dataclasses.replace(entry, expiry_date=timezone.now() - timedelta(seconds=1)))
    assert client.get("/api/v1/clusters").status_code == 401


def test_deleting_the_tenant_drops_its_keys(key, tenant_a):
    from tenants import key_cache

    assert _client(key).get("/api/v1/clusters").status_code == 200
    tenant_a.delete()
    assert key_cache.lookup(key) is None
    assert _client(key).get("/api/v1/clusters").status_code == 401
