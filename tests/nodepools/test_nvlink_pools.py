"""Node pools kept in one multi-node NVLink domain, through the API and the reconciler
(issue #19): placed in one domain, refused with a 409 naming the largest free domain,
scale-up staying in the domain, bad input refused with 400s naming the field.

The hosts are SIMULATED GB200 NVL72 compute trays (clusters/providers/simhosts.py: 4 GB200
GPUs per tray, 18 trays per 72-GPU domain as the catalog's ``gb200-nvl72`` says); their
in-process agent reports each GPU's fabric info (cluster UUID + clique id), from which the
control plane keeps each host's domain. Nothing here is real hardware.
"""

from __future__ import annotations

import uuid

import pytest

from clusters.providers import simhosts
from fleet.models import Gpu, Host
from tenants.models import Quota
from tests.helpers import drive_cluster, drive_pool

pytestmark = pytest.mark.django_db

CLUSTER_UUID = uuid.UUID("5b6f3c2a-9d41-4e8b-a7c2-0f1e2d3c4b5a")
D1, D2 = (CLUSTER_UUID, 32766), (CLUSTER_UUID, 32767)


def label(domain) -> str:
    return f"{domain[0]}.{domain[1]}"


def rack(domain, prefix: str, trays: int) -> list[Host]:
    """``trays`` SIMULATED GB200 NVL72 trays of one NVLink domain."""
    return [
        simhosts.create_simulated_host(
            hostname=f"{prefix}-tray{i:02d}",
            zone="us-east-1a",
            gpu_model="gb200",
            gpus=4,
            nvlink_domain=domain,
        )
        for i in range(trays)
    ]


@pytest.fixture
def cluster(owner, tenant_a, tenant_b, catalog):
    """A RUNNING cluster in us-east-1 (a region needs a host first: one simulated tray of a
    third domain, already held by another tenant, so it never takes a pool)."""
    Quota.objects.update_or_create(
        tenant=tenant_a, defaults={"max_clusters": 5, "max_nodes": 200, "max_gpus": {"gb200": 400}}
    )
    (seed,) = rack((CLUSTER_UUID, 1), "seed", 1)
    Gpu.objects.filter(host=seed).update(holder_id=uuid.uuid4(), holder_tenant=tenant_b)
    resp = owner.post(
        "/api/v1/clusters",
        {"name": "train", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    )
    assert resp.status_code == 202, resp.content
    drive_cluster(resp.json()["target_id"])
    return resp.json()["target_id"]


def create_pool(client, cluster_id, **overrides):
    body = {
        "name": "nvl",
        "gpu_model": "gb200",
        "gpus_per_node": 4,
        "node_count": 8,
        "isolation": {"mode": "exclusive"},
        "placement": {"same_nvlink_domain": True},
    }
    body.update(overrides)
    return client.post(f"/api/v1/clusters/{cluster_id}/nodepools", body, format="json")


def pool_domains(owner, cluster_id, pool_id) -> set[str]:
    pool = owner.get(f"/api/v1/clusters/{cluster_id}/nodepools/{pool_id}").json()
    hosts = Host.objects.filter(pk__in=[n["host_id"] for n in pool["nodes"]])
    return {f"{h.nvlink_cluster_uuid}.{h.nvlink_clique_id}" for h in hosts}


def test_an_8_node_pool_is_placed_in_one_domain_and_renders_its_compute_domain(owner, cluster):
    # D1: 6 trays (too small for 8 nodes of one tray each), D2: 10 trays -> D2
    rack(D1, "r1", 6)
    rack(D2, "r2", 10)
    resp = create_pool(owner, cluster)
    assert resp.status_code == 202, resp.content
    pool_id = resp.json()["target_id"]
    drive_pool(pool_id, max_steps=40)
    pool = owner.get(f"/api/v1/clusters/{cluster}/nodepools/{pool_id}").json()
    assert pool["phase"] == "RUNNING", pool["conditions"]
    assert pool["placement"] == {"same_nvlink_domain": True}
    assert len(pool["nodes"]) == 8
    assert {n["phase"] for n in pool["nodes"]} == {"READY"}
    assert len({n["host_id"] for n in pool["nodes"]}) == 8  # a whole tray per node
    assert pool_domains(owner, cluster, pool_id) == {label(D2)}
    # the agent (simulated source, in-process) reported the trays' fabric info: still D2
    host = Host.objects.get(pk=pool["nodes"][0]["host_id"])
    assert (host.nvlink_cluster_uuid, host.nvlink_clique_id) == D2
    assert host.inventory_count >= 1
    # the rendered GPU config carries the pool's ComputeDomain (NVIDIA DRA driver)
    (domain,) = [m for m in pool["gpu_config"]["manifests"] if m["kind"] == "ComputeDomain"]
    assert domain["apiVersion"] == "resource.nvidia.com/v1beta1"
    assert domain["metadata"]["name"] == "nvke-nvl"
    assert domain["spec"]["channel"]["resourceClaimTemplate"] == {"name": "nvke-nvl-channel"}
    assert pool["gpu_config"]["compute_domain"] == {
        "name": "nvke-nvl",
        "namespace": "default",
        "resource_claim_template": "nvke-nvl-channel",
    }


def test_a_pool_no_domain_has_room_for_is_refused_naming_the_largest_free_domain(
    owner, cluster, tenant_b
):
    rack(D1, "r1", 6)
    d2 = rack(D2, "r2", 10)
    # tenant B holds 3 of D2's trays: D2 has room for 7 nodes of 4 GPUs, D1 for 6
    for host in d2[:3]:
        Gpu.objects.filter(host=host).update(holder_id=uuid.uuid4(), holder_tenant=tenant_b)
    resp = create_pool(owner, cluster)
    assert resp.status_code == 409, resp.content
    body = resp.json()
    assert body["code"] == "nvlink_domain_full"
    assert body["retryable"] is True
    assert body["largest_free_domain"] == {
        "cluster_uuid": str(CLUSTER_UUID),
        "clique_id": 32767,
        "label": label(D2),
        "hosts": 7,
        "free_gpus": 28,
        "nodes_that_fit": 7,
    }
    assert f"the largest free domain is {label(D2)} with room for 7 node(s)" in body["detail"]
    # 2-GPU nodes: 8 of them fit in D1 (6 trays x 2) or D2 (7 x 2); D1 is the tighter fit
    resp = create_pool(owner, cluster, gpus_per_node=2)
    assert resp.status_code == 202, resp.content
    pool_id = resp.json()["target_id"]
    drive_pool(pool_id, max_steps=40)
    assert pool_domains(owner, cluster, pool_id) == {label(D1)}


def test_scale_up_stays_in_the_pool_domain(owner, cluster):
    rack(D1, "r1", 9)
    rack(D2, "r2", 18)
    op = create_pool(owner, cluster).json()  # 8 nodes: D1 (1 tray left) fits tighter than D2
    drive_pool(op["target_id"], max_steps=40)
    pool_id = op["target_id"]
    assert pool_domains(owner, cluster, pool_id) == {label(D1)}
    url = f"/api/v1/clusters/{cluster}/nodepools/{pool_id}/set-size"
    resp = owner.post(url, {"node_count": 9}, format="json")
    assert resp.status_code == 202, resp.content
    drive_pool(pool_id, max_steps=40)
    # the 9th node took D1's last tray although D2 had 18 free
    assert pool_domains(owner, cluster, pool_id) == {label(D1)}
    resp = owner.post(url, {"node_count": 10}, format="json")
    assert resp.status_code == 409, resp.content
    body = resp.json()
    assert body["code"] == "nvlink_domain_full"
    assert body["pool_domain"]["label"] == label(D1)
    assert body["pool_domain"]["nodes_that_fit"] == 0
    assert body["largest_free_domain"]["label"] == label(D2)


@pytest.mark.parametrize(
    ("overrides", "field", "code"),
    [
        (
            {"gpu_model": "h100-sxm5-80gb", "gpus_per_node": 8},
            "placement.same_nvlink_domain",
            "nvlink_domain_unsupported",
        ),
        # 19 trays of 4 GPUs = 76 GPUs > one NVL72 domain (72)
        ({"node_count": 19}, "placement.same_nvlink_domain", "nvlink_domain_too_small"),
        ({"placement": {"same_nvlink_domain": "yes"}}, "placement.same_nvlink_domain", None),
        ({"placement": {"rack": "r1"}}, "placement.rack", "invalid_placement"),
        ({"placement": ["same_nvlink_domain"]}, "placement", "invalid_placement"),
    ],
)
def test_bad_placement_is_a_400_naming_the_field(owner, cluster, overrides, field, code):
    rack(D1, "r1", 2)
    resp = create_pool(owner, cluster, **overrides)
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert body["code"] == (code or "invalid_placement")
    assert body["field"] == field
