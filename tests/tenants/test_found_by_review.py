"""Defects a malicious-tenant review found, each pinned with the right value."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_a_tenant_cannot_pull_in_another_tenants_user_or_learn_their_email(
    owner, outsider, tenant_a, tenant_b
):
    created = owner.post(
        f"/api/v1/tenants/{tenant_a.pk}/members",
        {"username": "alice", "email": "alice@secret-a.example", "role": "owner"},
    )
    assert created.status_code == 201
    resp = outsider.post(
        f"/api/v1/tenants/{tenant_b.pk}/members",
        {"username": "alice", "email": "x@evil.example", "role": "viewer"},
    )
    assert (resp.status_code, resp.json()["code"]) == (409, "username_taken")
    assert "secret-a" not in resp.content.decode()
    assert outsider.get(f"/api/v1/tenants/{tenant_b.pk}/members").json() == []


def test_an_admin_cannot_revoke_an_owner_key_and_the_last_owner_key_stays(tenant_a):
    from tests.conftest import _client, _key

    owner = _client(_key(tenant_a, "owner"))
    admin = _client(_key(tenant_a, "admin"))
    keys = owner.get(f"/api/v1/tenants/{tenant_a.pk}/api-keys").json()
    owner_prefix = next(k["prefix"] for k in keys if k["role"] == "owner")
    resp = admin.delete(f"/api/v1/tenants/{tenant_a.pk}/api-keys/{owner_prefix}")
    assert (resp.status_code, resp.json()["code"]) == (403, "role_too_high")
    assert resp.json()["detail"] == "an admin cannot revoke an owner key"
    last = owner.delete(f"/api/v1/tenants/{tenant_a.pk}/api-keys/{owner_prefix}")
    assert (last.status_code, last.json()["code"]) == (409, "last_owner")


def test_an_idempotent_replay_never_shows_a_secret_twice(owner, tenant_a):
    from nvke.models import IdempotencyRecord

    url = f"/api/v1/tenants/{tenant_a.pk}/api-keys"
    first = owner.post(url, {"name": "ci", "role": "member"}, HTTP_IDEMPOTENCY_KEY="k1")
    key = first.json()["key"]
    again = owner.post(url, {"name": "ci", "role": "member"}, HTTP_IDEMPOTENCY_KEY="k1")
    assert again.status_code == 201
    assert again.json()["key"] == "[redacted]"
    assert again.json()["prefix"] == first.json()["prefix"]
    assert key.encode() not in bytes(IdempotencyRecord.objects.get().body)


def test_deeply_nested_json_is_400_not_500(anonymous, owner):
    body = b"[" * 100_000 + b"]" * 100_000
    for client, url in ((anonymous, "/api/v1/agent/register"), (owner, "/api/v1/clusters")):
        resp = client.generic("POST", url, body, content_type="application/json")
        assert resp.status_code == 400, url
        assert resp.json()["code"] == "parse_error"


def test_nul_bytes_in_path_parameters_are_404(owner, operator, tenant_a):
    for client, url in (
        (owner, f"/api/v1/tenants/{tenant_a.pk}/api-keys/%00"),
        (owner, f"/api/v1/tenants/{tenant_a.pk}/members/%00"),
        (operator, "/api/v1/operator-keys/%00"),
    ):
        resp = client.delete(url)
        assert resp.status_code == 404, url
        assert resp["Content-Type"] == "application/problem+json"


def test_unknown_api_routes_answer_problem_json(owner, settings):
    settings.DEBUG = False
    resp = owner.get("/api/v1/no-such-thing")
    assert resp.status_code == 404
    assert resp.json()["code"] == "not_found"


@pytest.mark.parametrize("second", ["Alice", "ALICE", "alicE"])
def test_a_username_differing_only_in_case_is_taken(owner, outsider, tenant_a, tenant_b, second):
    """Found by the re-probe: "Alice" and "alice" were two accounts. Refused in the same
    tenant and in another one, 409 naming ``username``; one user stays."""
    from django.contrib.auth import get_user_model

    first = owner.post(
        f"/api/v1/tenants/{tenant_a.pk}/members",
        {"username": "alice", "email": "alice@a.example", "role": "member"},
    )
    assert first.status_code == 201, first.content
    for client, tenant in ((owner, tenant_a), (outsider, tenant_b)):
        resp = client.post(
            f"/api/v1/tenants/{tenant.pk}/members",
            {"username": second, "email": "x@b.example", "role": "viewer"},
        )
        assert resp.status_code == 409, resp.content
        assert (resp.json()["field"], resp.json()["code"]) == ("username", "username_taken")
    names = get_user_model().objects.filter(username__iexact="alice").values_list("username")
    assert list(names) == [("alice",)]


def test_the_database_refuses_a_case_variant_username_a_race_would_insert(tenant_a):
    """The unique index on lower(username) (migration tenants.0005) holds when the check is
    passed by two requests at once: the second insert is a Conflict, not a 500."""
    from django.contrib.auth import get_user_model
    from django.db import IntegrityError, transaction

    from nvke.errors import Conflict
    from tenants import members

    get_user_model().objects.create_user(username="Bob")
    with pytest.raises(IntegrityError), transaction.atomic():
        get_user_model().objects.create_user(username="bob")
    with pytest.raises(Conflict) as caught:
        members.create_user("BOB")
    assert (caught.value.code, caught.value.field) == ("username_taken", "username")
