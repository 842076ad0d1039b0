"""The Node a tenant's API shows for a node is derived from its host's observed report, in one
place (nodepools/tenant_nodes.py); these cases need no control plane (tests/hosted has the real
API, KWOK and scheduler)."""

from __future__ import annotations

import uuid

import pytest

from fleet.agent_facts import GpuFacts, HostFacts

pytestmark = pytest.mark.django_db

HOST = uuid.uuid4()


def gpu(n: int, *, mig=None, instances=(), health="HEALTHY", missing=False) -> GpuFacts:
    return GpuFacts(
        uuid=f"GPU-{n}",
        host_id=HOST,
        holder_id=None,
        mig_mode=mig,
        instances=tuple(instances),
        missing=missing,
        failed_checks=(),
        health=health,
        health_reason="",
        product_name="NVIDIA H100 80GB HBM3",
        memory_total_bytes=81559 * 2**20,
    )


def facts(gpus: list[GpuFacts], *, domain=None, driver="580.95.05") -> HostFacts:
    return HostFacts(
        host_id=HOST,
        hostname="h1",
        driver_version=driver,
        source_error="",
        inventory_at=None,
        inventory_count=1,
        gpus={g.uuid: g for g in gpus},
        nvlink_domain=domain,
    )


def pool_and_node(isolation: dict, gpus: int, *, phase: str = "READY"):
    from catalog.models import GpuModel
    from nodepools.gpu_config import render_gpu_config
    from nodepools.models import Node, NodePool

    model = GpuModel.objects.get(slug="h100-sxm5-80gb")
    config = render_gpu_config(
        gpu_model=model, gpus_per_node=gpus, isolation=isolation, pool_name="p"
    )
    pool = NodePool(name="p", gpu_model=model, gpus_per_node=gpus, isolation=isolation)
    pool.gpu_config = config
    node = Node(
        name="c1-p-abc", phase=phase, zone="us-east-1a", gpu_uuids=[f"GPU-{i}" for i in range(gpus)]
    )
    return pool, node


def derive(pool, node, host_facts, **kw):
    from nodepools.tenant_nodes import mig_profile_ids, tenant_node

    kw.setdefault("profile_ids", mig_profile_ids(pool.gpu_model_id))  # as the sync passes them
    return tenant_node(node, pool, host_facts, region="us-east-1", kubelet_version="v1.36.3", **kw)


def test_time_slicing_multiplies_by_replicas_and_an_unhealthy_gpu_leaves_allocatable(catalog):
    pool, node = pool_and_node({"mode": "time-slicing", "replicas": 4}, 2)
    out = derive(pool, node, facts([gpu(0), gpu(1, health="UNHEALTHY")]))
    assert out.capacity["nvidia.com/gpu"] == "8"  # 2 GPUs x 4 replicas
    assert out.allocatable["nvidia.com/gpu"] == "4"  # the unhealthy GPU's 4 replicas gone
    assert out.labels["nvidia.com/gpu.replicas"] == "4"
    assert out.labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert out.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert out.labels["nvidia.com/cuda.driver-version.major"] == "580"
    assert out.taints == ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},)


def test_mixed_mig_follows_what_each_gpu_reports_not_what_was_asked(catalog):
    pool, node = pool_and_node({"mode": "mig", "mig_layout": {"1g.10gb": 7}}, 2)
    seven = [("1g.10gb", s, 1) for s in range(7)]
    # GPU 1 reports MIG off (drift): the device plugin's mixed strategy shows it as one GPU
    out = derive(
        pool, node, facts([gpu(0, mig="enabled", instances=seven), gpu(1, mig="disabled")])
    )
    assert out.allocatable["nvidia.com/mig-1g.10gb"] == "7"
    assert out.allocatable["nvidia.com/gpu"] == "1"
    assert out.labels["nvidia.com/mig-1g.10gb.count"] == "7"
    assert out.labels["nvidia.com/mig.config.state"] == "pending"
    assert out.labels["nvidia.com/gpu.count"] == "2"


def test_a_gpu_missing_from_the_agents_inventory_is_not_published(catalog):
    pool, node = pool_and_node({"mode": "exclusive"}, 2)
    out = derive(pool, node, facts([gpu(0), gpu(1, missing=True)]))
    assert (out.capacity["nvidia.com/gpu"], out.labels["nvidia.com/gpu.count"]) == ("1", "1")
    assert out.capacity["pods"] == "110"


def test_clique_xid_condition_cordon_and_kubelet_version(catalog):
    from nodepools.models import Node
    from nodepools.tenant_nodes import kubelet_version

    pool, node = pool_and_node({"mode": "exclusive"}, 1, phase="CORDONED")
    fabric = uuid.UUID("12345678-1234-5678-1234-567812345678")
    out = derive(pool, node, facts([gpu(0)], domain=(fabric, 7)), xids={"GPU-0": 79})
    assert out.labels["nvidia.com/gpu.clique"] == f"{fabric}.7"
    assert out.conditions == (
        {
            "type": "GpuXidCritical",
            "status": "True",
            "reason": "XidCriticalError",
            "message": "GPU-0: Xid 79",
        },
    )
    assert out.unschedulable is True
    assert out.kubelet_version == "v1.36.3"
    assert kubelet_version(Node(kubernetes_version="1.36"), "1.36.3") == "v1.36.3"
    assert kubelet_version(Node(kubernetes_version="1.37.2"), "1.36.3") == "v1.37.2"
    assert kubelet_version(Node(kubernetes_version="1.35"), "1.36.3") == "v1.35"
    assert kubelet_version(Node(kubernetes_version=""), "1.36") == "v1.36"  # Cluster API
    assert derive(pool, node, None).capacity == {"cpu": "1k", "memory": "1Ti", "pods": "110"}


def test_a_vm_node_of_a_shared_host_publishes_only_its_own_instances(catalog):
    pool, node = pool_and_node({"mode": "mig", "mig_layout": {"1g.10gb": 7}}, 1)
    seven = [("1g.10gb", s, 1) for s in range(7)]  # 2 are this node's, 5 other tenants'
    own = {"GPU-0": (("1g.10gb", 0, 1), ("1g.10gb", 1, 1))}
    out = derive(pool, node, facts([gpu(0, mig="enabled", instances=seven)]), own=own)
    assert out.allocatable["nvidia.com/mig-1g.10gb"] == "2"
