"""Reserving a whole multi-node NVLink domain: every GPU of its hosts for the window, its
hosts fenced off from everyone else, a pool on it placed inside it, admission refusals naming
the field.

The hosts are SIMULATED GB200 NVL72 compute trays (clusters/providers/simhosts.py, 4 GPUs per
tray; nothing here is real hardware). Fleet in us-east-1: D1 = 12 trays (48 GPUs), D2 = 9
trays (36 GPUs), and one seed tray of a third domain held on-demand by tenant B (4 GPUs), so
C = 88, D = 4. Best fit alone would put an 8-node pool in D2 (1 tray left over, against 4 in
D1): a pool that lands in D1 got there because of its reservation.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from reservations.guard import ReservedCapacity
from tests.helpers import drive_pool
from tests.nodepools.test_nvlink_pools import CLUSTER_UUID, create_pool, label, pool_domains, rack
from tests.reservations.conftest import make_cluster

pytestmark = pytest.mark.django_db

D1, D2, SEED = (CLUSTER_UUID, 32766), (CLUSTER_UUID, 32767), (CLUSTER_UUID, 1)


@pytest.fixture
def fleet(tenant_a, tenant_b, catalog):
    from fleet.models import Gpu
    from tenants.models import Quota

    for tenant in (tenant_a, tenant_b):
        Quota.objects.update_or_create(
            tenant=tenant,
            defaults={"max_clusters": 5, "max_nodes": 200, "max_gpus": {"gb200": 400}},
        )
    (seed,) = rack(SEED, "seed", 1)
    Gpu.objects.filter(host=seed).update(holder_id=uuid.uuid4(), holder_tenant=tenant_b)
    return {"d1": rack(D1, "r1", 12), "d2": rack(D2, "r2", 9), "seed": seed}


def reserve_domain(client, domain, *, start=None, hours=4, **extra):
    start = start or timezone.now()
    body = {
        "gpu_model": "gb200",
        "region": "us-east-1",
        "nvlink_domain": label(domain) if isinstance(domain, tuple) else domain,
        "start": start.isoformat(),
        "end": (start + timedelta(hours=hours)).isoformat(),
        "end_action": "drain",
        **extra,
    }
    return client.post("/api/v1/reservations", body, format="json")


def test_a_reserved_domain_takes_its_8_node_pool_and_is_fenced_from_on_demand_pools(
    owner, outsider, fleet
):
    made = reserve_domain(owner, D1)
    assert made.status_code == 201, made.content
    r = made.json()
    assert r["gpus"] == 48  # 12 trays x 4 GPUs
    assert r["nvlink_domain"] == {
        "cluster_uuid": str(CLUSTER_UUID),
        "clique_id": 32766,
        "label": label(D1),
    }
    # B on-demand: D1 (12 free trays) is fenced, D2 has room for 9 nodes only
    b = make_cluster(outsider, "b")
    too_big = create_pool(outsider, b, node_count=10)
    assert (too_big.status_code, too_big.json()["code"]) == (409, "nvlink_domain_full")
    largest = too_big.json()["largest_free_domain"]
    assert (largest["label"], largest["nodes_that_fit"]) == (label(D2), 9)
    # the counts agree: C - D - R = 88 - 4 - 48 = 36 GPUs on-demand (D2's)
    dry = outsider.post(
        f"/api/v1/clusters/{b}/nodepools?dry_run=true",
        {"name": "x", "gpu_model": "gb200", "gpus_per_node": 4, "node_count": 10},
        format="json",
    ).json()
    assert (dry["capacity"]["free_gpus"], dry["capacity"]["reserved_gpus"]) == (36, 48)

    # A's 8-node pool on the reservation lands in D1 (best fit alone would choose D2)
    a = make_cluster(owner, "a")
    dry_a = owner.post(
        f"/api/v1/clusters/{a}/nodepools?dry_run=true",
        {
            "name": "nvl",
            "gpu_model": "gb200",
            "gpus_per_node": 4,
            "node_count": 8,
            "placement": {"same_nvlink_domain": True},
            "reservation": r["id"],
        },
        format="json",
    ).json()
    assert (dry_a["capacity"]["placeable_now"], dry_a["capacity"]["free_gpus"]) == (True, 48)
    created = create_pool(owner, a, reservation=r["id"])
    assert created.status_code == 202, created.content
    pool_id = created.json()["target_id"]
    drive_pool(pool_id)
    assert owner.get(f"/api/v1/clusters/{a}/nodepools/{pool_id}").json()["phase"] == "RUNNING"
    assert pool_domains(owner, a, pool_id) == {label(D1)}
    assert owner.get(f"/api/v1/reservations/{r['id']}").json()["used_gpus"] == 32

    # B's 8-node pool goes to D2; a 1-node pool after it finds D2 full and D1 fenced
    b8 = create_pool(outsider, b, name="b8", node_count=8)
    assert b8.status_code == 202, b8.content
    drive_pool(b8.json()["target_id"])
    assert pool_domains(outsider, b, b8.json()["target_id"]) == {label(D2)}
    b2 = create_pool(outsider, b, name="b2", node_count=2)
    assert (b2.status_code, b2.json()["code"]) == (409, "nvlink_domain_full")


def test_the_fence_is_binding_in_the_claim_itself(tenant_b, owner, fleet, monkeypatch):
    """With the steering off (no DOMAIN_FENCES), a claim pinned to D1 lands there and the
    placement hook rolls it back, naming the fence."""
    from fleet import placement
    from fleet.models import Gpu

    assert reserve_domain(owner, D1).status_code == 201
    monkeypatch.setattr(placement, "DOMAIN_FENCES", [])
    request = placement.GpuRequest(
        uuid.uuid4(), tenant_b.id, "gb200", 4, "us-east-1", nvlink_domain=D1
    )
    with pytest.raises(ReservedCapacity, match="reserved as a whole"), transaction.atomic():
        placement.claim_gpus([request])
    assert not Gpu.objects.filter(holder_id=request.holder_id).exists()


def test_a_future_domain_reservation_fences_the_domain_now(owner, outsider, fleet):
    """On-demand nodes have no end: one placed in D2 now would still hold it at the start."""
    later = reserve_domain(owner, D2, start=timezone.now() + timedelta(hours=2))
    assert later.status_code == 201, later.content
    b = make_cluster(outsider, "b")
    # D1 12 trays free and unreserved: an 8-node pool fits there, not in D2
    resp = create_pool(outsider, b, node_count=8)
    assert resp.status_code == 202, resp.content
    drive_pool(resp.json()["target_id"])
    assert pool_domains(outsider, b, resp.json()["target_id"]) == {label(D1)}
    # now D1 has 4 trays left and D2 is fenced: a 5-node pool has no room
    more = create_pool(outsider, b, name="more", node_count=5)
    assert (more.status_code, more.json()["code"]) == (409, "nvlink_domain_full")
    # and D2 cannot be reserved by B over A's window
    clash = reserve_domain(outsider, D2, start=timezone.now() + timedelta(hours=3))
    assert (clash.status_code, clash.json()["code"]) == (409, "nvlink_domain_reserved")
    assert clash.json()["field"] == "nvlink_domain"


def test_domain_reservation_refusals_name_the_field(owner, fleet, catalog):
    from clusters.providers import simhosts

    simhosts.create_simulated_host(
        hostname="eu-tray00",
        zone="eu-west-1a",
        gpu_model="gb200",
        gpus=4,
        nvlink_domain=(CLUSTER_UUID, 7),
    )
    cases = [
        (label((CLUSTER_UUID, 99)), {}, 400, "unknown_nvlink_domain", "nvlink_domain"),
        (label((CLUSTER_UUID, 7)), {}, 400, "nvlink_domain_mismatch", "nvlink_domain"),
        ("not-a-domain.3", {}, 400, "invalid_cluster_uuid", "nvlink_domain"),
        (f"{CLUSTER_UUID}.x", {}, 400, "invalid_clique_id", "nvlink_domain"),
        (label(D1), {"gpus": 8}, 400, "nvlink_domain_gpus", "gpus"),
        (label(D1), {"zone": "us-east-1a"}, 400, "zone_with_nvlink_domain", "zone"),
        (label(SEED), {}, 409, "nvlink_domain_in_use", "nvlink_domain"),
    ]
    for domain, extra, status, code, field in cases:
        resp = reserve_domain(owner, domain, **extra)
        assert resp.status_code == status, (domain, resp.content)
        assert (resp.json()["code"], resp.json()["field"]) == (code, field), resp.json()
    assert reserve_domain(owner, label(SEED)).json()["held_gpus"] == 4
    assert reserve_domain(owner, D1, gpus=48).status_code == 201  # the domain's own count
    again = reserve_domain(owner, D1, start=timezone.now() + timedelta(hours=1))
    assert (again.status_code, again.json()["code"]) == (409, "nvlink_domain_reserved")
    no_gpus = owner.post(
        "/api/v1/reservations",
        {
            "gpu_model": "gb200",
            "region": "us-east-1",
            "start": timezone.now().isoformat(),
            "end": (timezone.now() + timedelta(hours=2)).isoformat(),
        },
        format="json",
    )
    assert (no_gpus.status_code, no_gpus.json()["field"]) == (400, "gpus")


def test_a_pool_on_a_scheduled_domain_reservation_is_told_from_when(owner, fleet):
    start = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    r = reserve_domain(owner, D1, start=start).json()
    a = make_cluster(owner, "a")
    body = {
        "name": "nvl",
        "gpu_model": "gb200",
        "gpus_per_node": 4,
        "node_count": 10,  # D2 (9 trays) is too small: only its own D1 may take it
        "placement": {"same_nvlink_domain": True},
        "reservation": r["id"],
    }
    dry = owner.post(f"/api/v1/clusters/{a}/nodepools?dry_run=true", body, format="json")
    assert dry.status_code == 200, dry.content
    cap = dry.json()["capacity"]
    assert (cap["placeable_now"], cap["free_gpus"]) == (False, 48)
    assert cap["placeable_from"].replace("Z", "+00:00") == start.isoformat()
    created = create_pool(owner, a, node_count=10, reservation=r["id"])
    assert (created.status_code, created.json()["code"]) == (409, "reservation_not_active")
