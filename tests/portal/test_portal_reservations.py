"""The pool form's "Check" shows capacity, quota and cost (the API's dry run), and the form
offers the tenant's reservations. Values by hand:

One SIMULATED 8 x H100 host (C = 8). Price sheet: 2.50 USD per GPU-hour, 1.75 per reserved
GPU-hour. Tenant A reserves 4 H100 from now for 4 h, so unreserved pools may take
8 - 0 - 4 = 4 GPUs. Default quota: 512 GPUs per model, 200 nodes.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from tests.portal.test_portal_forms import cluster, options, pool_form  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def reservation(tenant_a, cluster):  # noqa: F811
    from billing.prices import set_price
    from reservations.admission import create_reservation

    set_price(
        gpu_model="h100-sxm5-80gb",
        effective_from=timezone.now() - timedelta(days=1),
        hourly_rate=Decimal("2.50"),
        reservation_hourly_rate=Decimal("1.75"),
    )
    return create_reservation(
        actor="test",
        tenant=tenant_a,
        name="block",
        gpu_model="h100-sxm5-80gb",
        region="us-east-1",
        gpus=4,
        start=timezone.now(),
        end=timezone.now() + timedelta(hours=4),
    )


def check(client, cluster_id, **overrides):
    body = pool_form(isolation_mode="exclusive", action="check", **overrides)
    return client.post(f"/clusters/{cluster_id}/nodepools/new", body).content.decode()


def test_check_shows_capacity_quota_and_cost_of_an_on_demand_pool(
    alice_client,
    cluster,  # noqa: F811
    reservation,
):
    from nodepools.models import NodePool

    html = check(alice_client, cluster.id, gpus_per_node="2")
    assert 'id="dry-run-capacity"' in html
    assert (
        "needs 2; 4 free on-demand, 4 reserved by capacity reservations; "
        "0 held by reservations' nodes now"  # the reservation of 4 has no pool on it yet
    ) in html  # 8 - 0 - 4
    assert "<dt>Placeable</dt><dd>now" in html
    assert "510 of 512 left after it" in html  # 512 - 0 - 2
    assert "199 of 200 left after it" in html
    assert "5.00 USD" in html  # 2 GPUs x 2.50
    assert not NodePool.objects.exists()


def test_check_labels_quota_reserved_by_the_pools_apart_from_what_is_in_use(
    alice_client,
    cluster,  # noqa: F811
    reservation,
):
    """Found in review: the quota line called the quota's reservations "in use". By hand:
    pool ``run`` (1 node x 2 GPUs) is RUNNING: 2 GPUs and 1 node reserved and in use; pool
    ``prov`` (1 node x 1 GPU) was just created: 1 GPU and 1 node reserved, none in use. A check
    of 1 node x 2 GPUs: GPUs 512 - 3 reserved - 2 requested = 507 left, 2 in use; nodes
    200 - 2 - 1 = 197 left, 1 in use."""
    from clusters.models import Cluster
    from nodepools.models import NodePool
    from tests.helpers import drive_cluster, drive_pool

    url = f"/clusters/{cluster.id}/nodepools/new"
    created = alice_client.post(
        url, pool_form(name="run", isolation_mode="exclusive", gpus_per_node="2")
    )
    assert created.status_code == 302
    drive_pool(NodePool.objects.get(name="run").pk)
    # ``prov`` in a second cluster (one operation per cluster: its creation still runs there)
    alice_client.post(
        "/clusters/new", {"name": "other", "kubernetes_version": "1.36", "region": "us-east-1"}
    )
    other = Cluster.objects.get(name="other")
    drive_cluster(other.id)
    created = alice_client.post(
        f"/clusters/{other.id}/nodepools/new",
        pool_form(name="prov", isolation_mode="exclusive"),
    )
    assert created.status_code == 302
    assert dict(NodePool.objects.values_list("name", "phase")) == {
        "run": "RUNNING",
        "prov": "PROVISIONING",
    }
    html = check(alice_client, cluster.id, name="next", gpus_per_node="2")
    quota = html[
        html.index('id="dry-run-quota"') : html.index("</dl>", html.index("dry-run-quota"))
    ]
    assert (
        "<dt>h100-sxm5-80gb GPUs</dt><dd>507 of 512 left after it: 3 reserved by your node "
        "pools, 2 requested; 2 in use on READY nodes</dd>"
    ) in quota
    assert (
        "<dt>Nodes</dt><dd>197 of 200 left after it: 2 reserved by your node pools, "
        "1 requested; 1 in use (READY)</dd>"
    ) in quota
    assert " in use," not in quota  # the reserved count is never called "in use"


def test_check_on_a_reservation_names_it_and_its_own_charge(
    alice_client,
    cluster,  # noqa: F811
    reservation,
):
    page = alice_client.get(f"/clusters/{cluster.id}/nodepools/new").content.decode()
    assert str(reservation.id) in options(page, "reservation")
    html = check(alice_client, cluster.id, gpus_per_node="4", reservation=str(reservation.id))
    assert f'on reservation <span class="mono">{reservation.id}</span>' in html
    assert "needs 4; 4 left in the reservation of 4" in html
    assert "covered by the reservation" in html
    assert (
        "7.00 USD per hour (1.75 USD per reserved GPU-h), billed whether used or not" in html
    )  # 4 x 1.75


def test_check_says_when_reserved_gpus_block_an_on_demand_pool(
    alice_client,
    cluster,  # noqa: F811
    reservation,
):
    html = check(alice_client, cluster.id, gpus_per_node="8")
    assert (
        "needs 8; 4 free on-demand, 4 reserved by capacity reservations; "
        "0 held by reservations' nodes now"  # the reservation of 4 has no pool on it yet
    ) in html
    assert "4 of 8 GPU(s) are reserved, unreserved pools may take 4" in html
