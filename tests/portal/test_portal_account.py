"""Login and the tenant switcher, API keys, members and roles, quotas, audit log."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.helpers import drive_cluster, drive_pool
from tests.portal.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def test_login_lands_tenants_on_clusters_and_operators_on_the_console(alice, portal_user):
    client = Client()
    response = client.post("/login", {"username": "alice", "password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/")["Location"] == "/clusters"
    wrong = Client().post("/login", {"username": "alice", "password": "nope"})
    assert wrong.status_code == 200 and "Please enter a correct username" in wrong.content.decode()
    portal_user("ops", staff=True)
    ops = Client()
    ops.post("/login", {"username": "ops", "password": PASSWORD})
    assert ops.get("/")["Location"] == "/console/"
    # logout is a POST (Django 5) and ends the session
    assert client.post("/logout").status_code == 302
    assert client.get("/clusters")["Location"] == "/login?next=/clusters"


def test_a_user_in_two_tenants_chooses_one_and_the_api_follows_the_choice(
    portal_user, tenant_a, tenant_b, h100_host, catalog
):
    from clusters.models import Cluster
    from tenants.models import Membership

    user = portal_user("carla", tenant_a, "owner")
    Membership.objects.create(user=user, tenant=tenant_b, role="viewer")
    for tenant, name in ((tenant_a, "alpha"), (tenant_b, "beta")):
        Cluster.objects.create(
            tenant=tenant, name=name, kubernetes_version="1.36", region="us-east-1"
        )
    client = Client()
    client.force_login(user)
    response = client.get("/clusters")
    assert response["Location"] == "/tenant/choose?next=%2Fclusters"
    # a tenant she is not a member of cannot be chosen
    from tenants.models import Tenant

    other = Tenant.objects.create(name="other")
    refused = client.post("/tenant/choose", {"tenant": str(other.id), "next": "/clusters"})
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()
    assert client.get("/clusters").status_code == 302
    chosen = client.post("/tenant/choose", {"tenant": str(tenant_b.id), "next": "/clusters"})
    assert chosen["Location"] == "/clusters"
    page = client.get("/clusters").content.decode()
    assert 'data-cluster="beta"' in page and 'data-cluster="alpha"' not in page
    assert "carla · viewer" in page  # the role is the one in the chosen tenant
    api = client.get("/api/v1/clusters").json()
    assert [c["name"] for c in api["results"]] == ["beta"]
    # the switcher in the top bar lists both tenants
    assert re.findall(r'<option value="[^"]+"( selected)?>(\S+) \((\w+)\)</option>', page) == [
        ("", "tenant-a", "owner"),
        (" selected", "tenant-b", "viewer"),
    ]


def test_an_api_key_is_shown_once_works_and_is_revoked(alice_client, tenant_a):
    from tenants.models import ApiKey

    response = alice_client.post("/api-keys", {"name": "ci", "role": "member"})
    html = response.content.decode()
    key = re.search(r'id="new-key-value" class="mono wide" readonly value="([^"]+)"', html)
    assert key, html[:2000]
    assert response["Cache-Control"].startswith("max-age=0")
    row = ApiKey.objects.get(tenant=tenant_a, name="ci")
    assert key.group(1).startswith(row.prefix + ".") and row.role == "member"
    bearer = Client(HTTP_AUTHORIZATION=f"Bearer {key.group(1)}")
    assert bearer.get("/api/v1/clusters").status_code == 200
    listing = alice_client.get("/api-keys").content.decode()
    assert row.prefix in listing and key.group(1) not in listing
    confirm = alice_client.get(f"/api-keys/{row.prefix}/revoke").content.decode()
    assert "Revoke API key ci?" in confirm
    assert alice_client.post(f"/api-keys/{row.prefix}/revoke").status_code == 302
    assert bearer.get("/api/v1/clusters").status_code == 401
    assert alice_client.get("/api-keys/nosuchkey/revoke").status_code == 404


def test_an_admin_may_not_mint_an_owner_key(portal_user, tenant_a):
    client = Client()
    client.force_login(portal_user("adam", tenant_a, "admin"))
    html = client.get("/api-keys").content.decode()
    roles = re.findall(r'<option value="(\w+)"', html.split('name="role"')[1].split("</select>")[0])
    assert roles == ["admin", "member", "viewer"]
    refused = client.post("/api-keys", {"name": "root", "role": "owner"}).content.decode()
    assert "an admin cannot create an owner key" in refused
    assert '<code class="code">role_too_high</code>' in refused
    from tenants.models import ApiKey
    from tenants.services import create_api_key

    row, _ = create_api_key(tenant=tenant_a, name="owner-key", role="owner")
    kept = client.post(f"/api-keys/{row.prefix}/revoke", follow=True).content.decode()
    assert "an admin cannot revoke an owner key (role_too_high)" in kept
    assert ApiKey.objects.get(pk=row.pk).revoked is False


def test_owners_change_roles_and_the_last_owner_stays(alice_client, tenant_a, alice, portal_user):
    from tenants.models import Membership

    portal_user("bob", tenant_a, "member")
    alice_client.post("/members/bob/role", {"bob-role": "viewer"})
    assert Membership.objects.get(user__username="bob").role == "viewer"
    demoted = alice_client.post("/members/alice/role", {"alice-role": "viewer"}, follow=True)
    assert "a tenant keeps at least one owner (last_owner)" in demoted.content.decode()
    assert Membership.objects.get(user=alice).role == "owner"
    removed = alice_client.post("/members/alice/remove", follow=True)
    assert "the last owner cannot be removed (last_owner)" in removed.content.decode()
    # members see the list but cannot change it (no invite form, POST refused)
    bob = Client()
    bob.force_login(Membership.objects.get(user__username="bob").user)
    assert "Invite a member" not in bob.get("/members").content.decode()
    assert bob.post("/members", {"email": "eve@example.com", "role": "owner"}).status_code == 403


def test_quotas_show_limits_reservations_and_use(alice_client, tenant_a, h100_host, catalog):
    from clusters.services import create_cluster
    from nodepools.services import create_nodepool
    from tenants.principal import Principal

    owner = Principal(tenant_a, "owner", False, "user:alice")
    op = create_cluster(principal=owner, name="q", kubernetes_version="1.36", region="us-east-1")
    drive_cluster(op.target_id)
    pool = create_nodepool(
        principal=owner,
        cluster=op.cluster,
        name="p",
        gpu_model="h100-sxm5-80gb",
        gpus_per_node=2,
        node_count=2,
        isolation={"mode": "exclusive"},
    )
    drive_pool(pool.target_id)
    html = alice_client.get("/quotas").content.decode()
    # 1 running cluster of 20; 2 READY nodes of 200; 4 H100s held and reserved of 512
    assert "1 in use · 1 reserved · limit 20" in html
    assert "2 in use · 2 reserved · limit 200" in html
    assert "GPUs h100-sxm5-80gb" in html and "4 in use · 4 reserved · limit 512" in html
    assert 'style="width:1%"' in html  # 2 of 200 nodes and 4 of 512 GPUs round to 1 %


def test_the_audit_log_filters_by_action_and_is_for_owners_and_admins(
    alice_client, portal_user, tenant_a, tenant_b
):
    from tenants import audit

    audit.record(
        actor="user:alice", action="cluster.create", target_type="cluster", tenant=tenant_a
    )
    audit.record(actor="user:alice", action="apikey.create", target_type="apikey", tenant=tenant_a)
    audit.record(actor="user:olga", action="cluster.create", target_type="cluster", tenant=tenant_b)
    html = alice_client.get("/audit?action=cluster.create").content.decode()
    rows = re.findall(r'<td class="mono">([\w.]+)</td>', html)
    assert rows == ["cluster.create"]  # tenant B's cluster.create is not shown
    assert "user:olga" not in html
    everything = alice_client.get("/audit").content.decode()
    assert re.findall(r'<td class="mono">([\w.]+)</td>', everything) == [
        "apikey.create",
        "cluster.create",
    ]
    member = Client()
    member.force_login(portal_user("mia", tenant_a, "member"))
    assert member.get("/audit").status_code == 403
