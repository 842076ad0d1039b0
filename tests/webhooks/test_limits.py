"""Per-tenant caps (issue 26, item 3): webhook endpoints and API keys. The report registered
300 endpoints in 1.9 s and 200 keys; now the request past the cap is a 409 naming the
setting an operator would raise, and the caps are per tenant (another tenant is unaffected)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(tenant_a):
    from tests.conftest import _client, _key

    return _client(_key(tenant_a, "admin"))


def register(client, n: int):
    return client.post(
        "/api/v1/webhooks",
        {"url": f"https://8.8.8.{n}/hook", "event_types": ["quota.80"]},
        format="json",
    )


def test_webhook_endpoints_stop_at_the_cap_with_a_409_naming_the_setting(admin, outsider, settings):
    from webhooks.models import WebhookEndpoint

    assert settings.NVKE_MAX_WEBHOOK_ENDPOINTS_PER_TENANT == 20  # the default
    made = [register(admin, n).status_code for n in range(1, 21)]
    assert made == [201] * 20
    refused = register(admin, 21)
    body = refused.json()
    assert (refused.status_code, body["code"], body["setting"], body["limit"]) == (
        409,
        "webhook_endpoint_limit",
        "NVKE_MAX_WEBHOOK_ENDPOINTS_PER_TENANT",
        20,
    )
    assert "NVKE_MAX_WEBHOOK_ENDPOINTS_PER_TENANT" in body["detail"]
    assert WebhookEndpoint.objects.count() == 20
    # another tenant has its own 20
    assert register(outsider, 1).status_code == 201
    # deleting one makes room again
    first = admin.get("/api/v1/webhooks").json()["results"][0]["id"]
    assert admin.delete(f"/api/v1/webhooks/{first}").status_code == 204
    assert register(admin, 22).status_code == 201


def test_api_keys_stop_at_the_cap_and_revoked_keys_do_not_count(tenant_a, owner, settings):
    from tenants.models import ApiKey

    settings.NVKE_MAX_API_KEYS_PER_TENANT = 4  # the owner fixture's key is one of them
    url = f"/api/v1/tenants/{tenant_a.id}/api-keys"
    made = [owner.post(url, {"name": f"k{i}", "role": "viewer"}).status_code for i in range(4)]
    assert made == [201, 201, 201, 409]
    refused = owner.post(url, {"name": "k9", "role": "viewer"}).json()
    assert (refused["status"], refused["code"], refused["setting"], refused["limit"]) == (
        409,
        "api_key_limit",
        "NVKE_MAX_API_KEYS_PER_TENANT",
        4,
    )
    assert "NVKE_MAX_API_KEYS_PER_TENANT" in refused["detail"]
    assert ApiKey.objects.filter(tenant=tenant_a).count() == 4
    victim = ApiKey.objects.filter(tenant=tenant_a, name="k0").get()
    assert owner.delete(f"{url}/{victim.prefix}").status_code == 200
    assert owner.post(url, {"name": "k5", "role": "viewer"}).status_code == 201
