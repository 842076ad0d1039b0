"""Add-ons applied, not only rendered (issue 31): a hosted cluster's API holds the upstream CRDs
of the GPU Operator and of NVIDIA's DRA driver, and the objects NVKE renders for its pools
(ClusterPolicy, the device-plugin and mig-parted ConfigMaps, a GB200 pool's ComputeDomain),
applied by NVKE and validated and stored by the real kube-apiserver.

Nothing runs the GPU Operator or the DRA driver here: the nodes are KWOK's and the hosts
simulated; these tests check what the API accepted, refused and deleted.
"""

from __future__ import annotations

import uuid

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.hosted.conftest import api_client, create_cluster, kubeconfig_of
from tests.hosted.test_gpu_nodes import create_pool, drive

pytestmark = pytest.mark.timeout(420)

CRDS = (
    "clusterpolicies.nvidia.com",
    "nvidiadrivers.nvidia.com",
    "computedomains.resource.nvidia.com",
)
DIGEST = "nvke.io/addons-digest"


def condition(pool_id, type_: str = "AddonsApplied") -> dict:
    from nodepools.models import NodePool

    pool = NodePool.objects.get(pk=pool_id)
    return next((c for c in pool.conditions if c["type"] == type_), {})


def config_map(core, name: str):
    try:
        return core.read_namespaced_config_map(name, "gpu-operator")
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def cluster_policy(objects):
    try:
        return objects.get_cluster_custom_object(
            "nvidia.com", "v1", "clusterpolicies", "cluster-policy"
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_the_pools_gpu_operator_objects_are_applied_to_the_hosted_clusters_api(
    hosted, owner, make_host
):
    for _ in range(2):
        make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    cluster = create_cluster(owner, "addons")
    api = api_client(kubeconfig_of(owner, cluster))
    core, objects = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    ext = k8s.ApiextensionsV1Api(api)

    shared = create_pool(owner, cluster, "shared", {"mode": "time-slicing", "replicas": 4})
    mixed = create_pool(owner, cluster, "mixed", {"mode": "mig", "mig_layout": {"1g.10gb": 7}})

    # --- the upstream CRDs, served by the cluster's API ----------------------------------
    for name in CRDS:
        crd = ext.read_custom_resource_definition(name)
        established = {c.type: c.status for c in crd.status.conditions}["Established"]
        assert established == "True", name

    # --- the ClusterPolicy, wired to NVKE's ConfigMaps ------------------------------------
    policy = cluster_policy(objects)
    assert policy["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "nvke"
    spec = policy["spec"]
    assert spec["devicePlugin"]["config"] == {"name": "nvke-device-plugin-config"}
    assert spec["migManager"]["config"] == {
        "name": "nvke-mig-parted-config",
        "default": "all-disabled",
    }
    assert spec["driver"]["useNvidiaDriverCRD"] is True
    default_driver = objects.get_cluster_custom_object(
        "nvidia.com", "v1alpha1", "nvidiadrivers", "nvke-default"
    )
    assert default_driver["spec"]["default"] is True

    # --- the device-plugin config: one key per pool, time-slicing replicas as configured ---
    plugin = config_map(core, "nvke-device-plugin-config").data
    assert sorted(plugin) == ["nvke-mixed", "nvke-shared"]
    shared_config = yaml.safe_load(plugin["nvke-shared"])
    assert shared_config["flags"] == {"migStrategy": "none"}
    assert shared_config["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 4}
    ]
    assert yaml.safe_load(plugin["nvke-mixed"])["flags"] == {"migStrategy": "mixed"}

    # --- the mig-parted config: the mixed pool's layout on every GPU ----------------------
    parted = yaml.safe_load(config_map(core, "nvke-mig-parted-config").data["config.yaml"])
    assert parted["mig-configs"]["nvke-mixed"] == [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}
    ]
    assert parted["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    for pool in (shared, mixed):
        assert condition(pool)["status"] == "True", condition(pool)

    # --- unchanged: another step applies nothing (the digest on the ClusterPolicy) ---------
    before = policy["metadata"]["resourceVersion"]
    plugin_version = config_map(core, "nvke-device-plugin-config").metadata.resource_version
    drive(shared, lambda p: True)
    drive(mixed, lambda p: True)
    after = cluster_policy(objects)
    assert after["metadata"]["resourceVersion"] == before
    assert DIGEST in after["metadata"]["annotations"]
    assert config_map(core, "nvke-device-plugin-config").metadata.resource_version == plugin_version

    # --- a pool deleted: its entries go; the last one: every object of NVKE's goes ---------
    assert owner.delete(f"/api/v1/clusters/{cluster.id}/nodepools/{mixed}").status_code == 202
    drive(mixed, lambda p: p.phase == "DELETED", timeout=120, what="mixed DELETED")
    assert sorted(config_map(core, "nvke-device-plugin-config").data) == ["nvke-shared"]
    parted = yaml.safe_load(config_map(core, "nvke-mig-parted-config").data["config.yaml"])
    assert "nvke-mixed" not in parted["mig-configs"]
    # the ClusterPolicy stays for the shared pool: the same object, not deleted and made anew
    assert cluster_policy(objects)["metadata"]["uid"] == policy["metadata"]["uid"]

    assert owner.delete(f"/api/v1/clusters/{cluster.id}/nodepools/{shared}").status_code == 202
    drive(shared, lambda p: p.phase == "DELETED", timeout=120, what="shared DELETED")
    assert config_map(core, "nvke-device-plugin-config") is None
    assert config_map(core, "nvke-mig-parted-config") is None
    assert cluster_policy(objects) is None
    drivers = objects.list_cluster_custom_object("nvidia.com", "v1alpha1", "nvidiadrivers")
    assert drivers["items"] == []
    for name in CRDS:  # the CRDs stay: the tenant's own objects may use them
        ext.read_custom_resource_definition(name)


def test_a_gb200_pools_compute_domain_is_accepted_a_refused_object_fails_visibly(
    hosted, owner, tenant_a
):
    from clusters.providers import simhosts
    from nodepools.models import NodePool
    from tenants.models import Quota

    fabric = uuid.UUID("6c1f4d3b-0e52-4f9c-b8d3-1a2b3c4d5e6f")
    Quota.objects.update_or_create(
        tenant=tenant_a, defaults={"max_clusters": 5, "max_nodes": 20, "max_gpus": {"gb200": 40}}
    )
    for tray in (1, 2):
        simhosts.create_simulated_host(
            hostname=f"nvl-tray-{tray}",
            zone="us-east-1a",
            gpu_model="gb200",
            gpus=4,
            nvlink_domain=(fabric, 1),
        )
    cluster = create_cluster(owner, "imex")
    api = api_client(kubeconfig_of(owner, cluster))
    objects = k8s.CustomObjectsApi(api)
    resp = owner.post(
        f"/api/v1/clusters/{cluster.id}/nodepools",
        {
            "name": "nvl",
            "gpu_model": "gb200",
            "gpus_per_node": 4,
            "node_count": 2,
            "isolation": {"mode": "exclusive"},
            "placement": {"same_nvlink_domain": True},
        },
        format="json",
    )
    assert resp.status_code == 202, resp.content
    pool = resp.json()["target_id"]
    drive(pool, lambda p: p.phase == "RUNNING", what="nvl RUNNING")

    # --- the ComputeDomain, as rendered, validated by the real API against the CRD --------
    def domain():
        return objects.get_namespaced_custom_object(
            "resource.nvidia.com", "v1beta1", "default", "computedomains", "nvke-nvl"
        )

    stored = domain()
    assert stored["spec"] == {
        "numNodes": 0,
        "channel": {
            "resourceClaimTemplate": {"name": "nvke-nvl-channel"},
            "allocationMode": "Single",
        },
    }
    assert stored["metadata"]["labels"]["nvke.io/nodepool"] == "nvl"
    assert condition(pool)["status"] == "True"

    # --- an object the API refuses (numNodes < 0, the CRD's minimum is 0): the pool says so
    row = NodePool.objects.get(pk=pool)
    config = row.gpu_config
    good = [dict(m) for m in config["manifests"]]
    bad = [dict(m) for m in config["manifests"]]
    [cd] = [m for m in bad if m["kind"] == "ComputeDomain"]
    cd["spec"] = {**cd["spec"], "numNodes": -1}
    NodePool.objects.filter(pk=pool).update(gpu_config={**config, "manifests": bad})
    drive(pool, lambda p: True)
    refused = condition(pool)
    assert (refused["status"], refused["reason"]) == ("False", "RefusedByClusterApi")
    assert "ComputeDomain default/nvke-nvl" in refused["message"]
    assert "422" in refused["message"] and "numNodes" in refused["message"]
    assert domain()["spec"]["numNodes"] == 0  # the API kept the valid one
    assert DIGEST not in (cluster_policy(objects)["metadata"].get("annotations") or {})

    NodePool.objects.filter(pk=pool).update(gpu_config={**config, "manifests": good})
    drive(pool, lambda p: condition(p.id)["status"] == "True", what="AddonsApplied again")

    # --- the pool deleted: its ComputeDomain goes ----------------------------------------
    assert owner.delete(f"/api/v1/clusters/{cluster.id}/nodepools/{pool}").status_code == 202
    drive(pool, lambda p: p.phase == "DELETED", timeout=120, what="nvl DELETED")
    listed = objects.list_namespaced_custom_object(
        "resource.nvidia.com", "v1beta1", "default", "computedomains"
    )
    assert listed["items"] == []
