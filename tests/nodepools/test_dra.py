"""A pool's GPUs as DRA devices (nodepools/dra.py): the devices a node's ResourceSlice carries
are derived from its host's observed report, with the exact attributes NVIDIA's DRA driver
publishes; such a pool's Node has no nvidia.com/gpu. No control plane here (tests/hosted/
test_dra.py has the real API and scheduler)."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from tests.nodepools.test_tenant_nodes import HOST, derive, facts, gpu, pool_and_node

pytestmark = pytest.mark.django_db

H100 = "NVIDIA H100 80GB HBM3"
H100_BYTES = 81559 * 2**20
CLIQUE = uuid.UUID("5b6f3c2a-9d41-4e8b-a7c2-0f1e2d3c4b5a")


def hopper(n: int, **kw):
    return replace(
        gpu(n, **kw), index=n, architecture="Hopper", compute_capability="9.0", host_id=HOST
    )


def dra_pool(gpus: int):
    pool, node = pool_and_node({"mode": "exclusive"}, gpus)
    pool.gpu_publishing = "dra"
    return pool, node


def test_each_healthy_gpu_is_one_device_with_the_drivers_attributes(catalog):
    pool, node = dra_pool(3)
    host = replace(
        facts([hopper(0), hopper(1, health="UNHEALTHY"), hopper(2)], driver="570.172.08"),
        cuda_version="12.8",
    )
    out = derive(pool, node, host)
    assert out.dra_devices == (
        {
            "name": "gpu-0",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": "GPU-0"},
                "productName": {"string": H100},
                "architecture": {"string": "Hopper"},
                "cudaComputeCapability": {"version": "9.0.0"},
                "driverVersion": {"version": "570.172.8"},
                "cudaDriverVersion": {"version": "12.8.0"},
            },
            "capacity": {"memory": {"value": "81559Mi"}},
        },
        # gpu-1 is UNHEALTHY: not published
        {
            "name": "gpu-2",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": "GPU-2"},
                "productName": {"string": H100},
                "architecture": {"string": "Hopper"},
                "cudaComputeCapability": {"version": "9.0.0"},
                "driverVersion": {"version": "570.172.8"},
                "cudaDriverVersion": {"version": "12.8.0"},
            },
            "capacity": {"memory": {"value": "81559Mi"}},
        },
    )
    # never both: no GPU resource on the Node, the rest of the Node as before
    assert out.capacity == out.allocatable == {"cpu": "1k", "memory": "1Ti", "pods": "110"}
    assert out.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert out.taints == ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},)


def test_only_what_the_agent_reported_is_published_and_the_clique_where_there_is_one(catalog):
    pool, node = dra_pool(1)
    bare = replace(gpu(0), index=0, product_name="", memory_total_bytes=None)
    out = derive(pool, node, facts([bare], driver="", domain=(CLIQUE, 32766)))
    assert out.dra_devices == (
        {
            "name": "gpu-0",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": "GPU-0"},
                "cliqueID": {"string": f"{CLIQUE}.32766"},
            },
            "capacity": {},
        },
    )
    # a GPU the agent no longer lists, or no report at all: no device
    assert derive(pool, node, facts([replace(bare, missing=True)])).dra_devices == ()
    assert derive(pool, node, None).dra_devices == ()


def test_a_gpu_in_mig_mode_is_published_as_its_mig_devices_with_the_drivers_names(catalog):
    from fleet.agent_facts import MigDevice

    pool, node = pool_and_node({"mode": "mig", "mig_layout": {"3g.40gb": 1, "1g.10gb": 2}}, 2)
    pool.gpu_publishing = "dra"
    mig = [
        # reported out of order; H100 profile ids (catalog, nvidia-smi mig -lgip): 3g.40gb 9,
        # 1g.10gb 19; a device without a placement cannot be named
        MigDevice("1g.10gb", 4, 1, 13, "MIG-b", 10240 * 2**20),
        MigDevice("3g.40gb", 0, 4, 2, "MIG-a", 40448 * 2**20),
        MigDevice("1g.10gb", 5, 1, 14, "", None),
        MigDevice("?", -1, -1, 7, "MIG-x", 1),
    ]
    gpus = [
        replace(hopper(0), mig_mode="enabled", devices=tuple(mig)),
        replace(hopper(1), mig_mode="disabled"),  # MIG off (drift): the whole GPU, as the driver
    ]
    out = derive(pool, node, replace(facts(gpus, driver="570.172.08"), cuda_version="12.8"))
    parent = {
        "productName": {"string": H100},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "570.172.8"},
        "cudaDriverVersion": {"version": "12.8.0"},
    }
    slices = {f"memorySlice{i}": {"value": "1"} for i in range(4)}
    assert out.dra_devices == (
        {
            "name": "gpu-0-mig-3g40gb-9-0",
            "attributes": {
                "type": {"string": "mig"},
                "uuid": {"string": "MIG-a"},
                "parentUUID": {"string": "GPU-0"},
                "profile": {"string": "3g.40gb"},
                **parent,
            },
            "capacity": {"memory": {"value": "40448Mi"}, **slices},
        },
        {
            "name": "gpu-0-mig-1g10gb-19-4",
            "attributes": {
                "type": {"string": "mig"},
                "uuid": {"string": "MIG-b"},
                "parentUUID": {"string": "GPU-0"},
                "profile": {"string": "1g.10gb"},
                **parent,
            },
            "capacity": {"memory": {"value": "10Gi"}, "memorySlice4": {"value": "1"}},
        },
        {
            "name": "gpu-0-mig-1g10gb-19-5",
            "attributes": {
                "type": {"string": "mig"},
                "parentUUID": {"string": "GPU-0"},
                "profile": {"string": "1g.10gb"},
                **parent,
            },
            "capacity": {"memorySlice5": {"value": "1"}},
        },
        {
            "name": "gpu-1",
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-1"}, **parent},
            "capacity": {"memory": {"value": "81559Mi"}},
        },
    )
    assert out.capacity == out.allocatable == {"cpu": "1k", "memory": "1Ti", "pods": "110"}
    # an unhealthy GPU's MIG devices all leave the slice
    sick = [replace(gpus[0], health="UNHEALTHY"), gpus[1]]
    assert [d["name"] for d in derive(pool, node, facts(sick)).dra_devices] == ["gpu-1"]


def test_mig_device_names_follow_the_driver():
    from nodepools.dra import mig_device_name

    assert mig_device_name(0, "1g.10gb", 19, 0) == "gpu-0-mig-1g10gb-19-0"
    assert mig_device_name(3, "1g.10gb+me", 20, 6) == "gpu-3-mig-1g10gb-me-20-6"
    assert mig_device_name(1, "7g.80gb", None, 0) == "gpu-1-mig-7g80gb-0"


def test_a_device_plugin_pool_has_no_dra_devices(catalog):
    pool, node = pool_and_node({"mode": "exclusive"}, 2)
    out = derive(pool, node, facts([hopper(0), hopper(1)]))
    assert out.dra_devices is None
    assert out.allocatable["nvidia.com/gpu"] == "2"


@pytest.mark.parametrize(
    ("raw", "version"),
    [("570.172.08", "570.172.8"), ("9.0", "9.0.0"), ("12", "12.0.0"), ("", None), ("R580", None)],
)
def test_versions_are_written_as_semver(raw, version):
    from nodepools.dra import semver

    assert semver(raw) == version


def test_memory_is_a_binary_si_quantity():
    from nodepools.dra import quantity

    assert quantity(H100_BYTES) == "81559Mi"
    assert quantity(80 * 2**30) == "80Gi"
    assert quantity(1000) == "1000"


@pytest.fixture
def cluster(owner, make_host, catalog):
    from tests.helpers import drive_cluster

    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    resp = owner.post(
        "/api/v1/clusters",
        {"name": "dra", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    )
    assert resp.status_code == 202, resp.content
    drive_cluster(resp.json()["target_id"])
    return resp.json()["target_id"]


def post_pool(owner, cluster, **overrides):
    body = {
        "name": "dra",
        "gpu_model": "h100-sxm5-80gb",
        "gpus_per_node": 8,
        "node_count": 1,
        "isolation": {"mode": "exclusive"},
        "gpu_publishing": "dra",
    }
    body.update(overrides)
    return owner.post(f"/api/v1/clusters/{cluster}/nodepools", body, format="json")


@pytest.mark.parametrize(
    ("overrides", "field", "code"),
    [
        ({"gpu_publishing": "both"}, "gpu_publishing", "invalid_choice"),
        (
            {"isolation": {"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"}},
            "isolation",
            "dra_isolation_not_supported",
        ),
        (
            {"isolation": {"mode": "time-slicing", "replicas": 4}},
            "isolation",
            "dra_isolation_not_supported",
        ),
    ],
)
def test_bad_gpu_publishing_is_a_400_naming_the_field(owner, cluster, overrides, field, code):
    resp = post_pool(owner, cluster, **overrides)
    assert resp.status_code == 400, resp.content
    assert resp["Content-Type"].startswith("application/problem+json")
    body = resp.json()
    assert (body["code"], body["field"]) == (code, field)


def test_a_dra_pool_says_so_and_keeps_exclusive_isolation(owner, cluster):
    from nodepools.models import NodePool

    resp = post_pool(owner, cluster)
    assert resp.status_code == 202, resp.content
    pool = NodePool.objects.get(pk=resp.json()["target_id"])
    assert pool.gpu_publishing == "dra"
    # on a real cluster the GPU Operator keeps its device plugin off the pool's nodes
    assert pool.gpu_config["labels"]["nvidia.com/gpu.deploy.device-plugin"] == "false"
    assert pool.gpu_config["resources"] == {}
    assert pool.gpu_config["gpu_publishing"] == "dra"
    url = f"/api/v1/clusters/{cluster}/nodepools/{pool.id}"
    assert owner.get(url).json()["gpu_publishing"] == "dra"
    resp = owner.patch(url, {"isolation": {"mode": "time-slicing", "replicas": 2}}, format="json")
    assert resp.status_code == 400, resp.content
    assert resp.json()["code"] == "dra_isolation_not_supported"
    assert resp.json()["supported_modes"] == ["exclusive", "mig"]


def test_a_dedicated_mig_pool_may_publish_dra_devices(owner, cluster):
    from nodepools.models import NodePool

    resp = post_pool(owner, cluster, isolation={"mode": "mig", "mig_layout": {"1g.10gb": 7}})
    assert resp.status_code == 202, resp.content
    pool = NodePool.objects.get(pk=resp.json()["target_id"])
    assert (pool.gpu_publishing, pool.isolation["mode"]) == ("dra", "mig")
    assert pool.gpu_config["resources"] == {}  # no nvidia.com/mig-1g.10gb besides the devices
    # MIG Manager still applies the layout: the driver publishes the MIG devices it made
    assert pool.gpu_config["labels"]["nvidia.com/mig.config"]


def test_device_plugin_stays_the_default():
    from nodepools.api.serializers import NodePoolCreateSerializer

    form = NodePoolCreateSerializer(
        data={"name": "p", "gpu_model": "h100-sxm5-80gb", "gpus_per_node": 8, "node_count": 1}
    )
    assert form.is_valid(), form.errors
    assert form.validated_data["gpu_publishing"] == "device-plugin"


def test_a_device_plugin_pool_renders_as_before(catalog):
    from catalog.models import GpuModel
    from nodepools.gpu_config import render_gpu_config

    model = GpuModel.objects.get(slug="h100-sxm5-80gb")
    config = render_gpu_config(
        gpu_model=model, gpus_per_node=8, isolation={"mode": "exclusive"}, pool_name="p"
    )
    assert "nvidia.com/gpu.deploy.device-plugin" not in config["labels"]
    assert "gpu_publishing" not in config
    assert config["resources"] == {"nvidia.com/gpu": 8}
