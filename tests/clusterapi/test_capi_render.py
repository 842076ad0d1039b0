"""What the ``clusterapi`` provider renders, checked by hand.

The expected values below were worked out from the inputs (fixed ids, the catalog's H100 /
H100 NVL MIG profiles, NVKE's GPU Operator rendering in nodepools/gpu_config.py) and the
Cluster API conventions named in clusters/providers/clusterapi/render.py. The whole
rendering of one pool is also kept as a golden file (``golden/h100-mig-single.json``,
reviewed by hand; regenerate with ``NVKE_UPDATE_GOLDEN=1`` and review the diff).
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tests.clusterapi.specs import CLUSTER_ID, NODE_IDS, POOL_ID, TENANT_ID, cluster_spec, pool_spec

pytestmark = pytest.mark.django_db

GOLDEN = Path(__file__).resolve().parent / "golden"
NS = "nvke"


def infra(value: str = "Metal3"):
    from clusters.providers.clusterapi.render import Infrastructure

    return Infrastructure.parse(value)


def kubelet_labels(template: dict) -> dict[str, str]:
    registration = template["spec"]["template"]["spec"]["joinConfiguration"]["nodeRegistration"]
    (arg,) = [a for a in registration["kubeletExtraArgs"] if a["name"] == "node-labels"]
    return dict(pair.split("=", 1) for pair in arg["value"].split(","))


def render_pool(pool, nodes=None, version=None):
    from clusters.providers.clusterapi.render import render_node_pool

    nodes = nodes if nodes is not None else {str(NODE_IDS[0]): "gpu-a", str(NODE_IDS[1]): "gpu-b"}
    return render_node_pool(
        pool, nodes=nodes, namespace=NS, infrastructure=infra(), kubernetes_version=version
    )


def test_cluster_and_kubeadm_control_plane_are_rendered_as_expected():
    from clusters.providers.clusterapi.render import render_cluster

    capi_cluster, control_plane = render_cluster(
        cluster_spec(), namespace=NS, infrastructure=infra()
    )
    labels = {
        "app.kubernetes.io/managed-by": "nvke",
        "cluster.x-k8s.io/cluster-name": "llm-training-0a1b2c3d",
        "nvke.io/cluster-id": str(CLUSTER_ID),
        "nvke.io/tenant-id": str(TENANT_ID),
    }
    assert capi_cluster == {
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {
            "name": "llm-training-0a1b2c3d",
            "namespace": "nvke",
            "labels": labels,
            "annotations": {"nvke.io/cluster-name": "llm-training"},
        },
        "spec": {
            "clusterNetwork": {
                "pods": {"cidrBlocks": ["192.168.0.0/16"]},
                "services": {"cidrBlocks": ["10.96.0.0/12"]},
                "serviceDomain": "cluster.local",
            },
            "controlPlaneRef": {
                "apiGroup": "controlplane.cluster.x-k8s.io",
                "kind": "KubeadmControlPlane",
                "name": "llm-training-0a1b2c3d-control-plane",
            },
            "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "Metal3Cluster",
                "name": "llm-training-0a1b2c3d",
            },
        },
    }
    assert control_plane == {
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
        "kind": "KubeadmControlPlane",
        "metadata": {
            "name": "llm-training-0a1b2c3d-control-plane",
            "namespace": "nvke",
            "labels": labels,
        },
        "spec": {
            "replicas": 3,
            "version": "v1.36.0",
            "machineTemplate": {
                "metadata": {"labels": {"nvke.io/cluster-id": str(CLUSTER_ID)}},
                "spec": {
                    "infrastructureRef": {
                        "apiGroup": "infrastructure.cluster.x-k8s.io",
                        "kind": "Metal3MachineTemplate",
                        "name": "nvke-control-plane",
                    }
                },
            },
            "rollout": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}},
        },
    }


def test_mig_single_pool_machines_register_with_gpu_labels_taint_and_mig_config(catalog):
    template, deployment, health_check = render_pool(pool_spec())
    # GPU Operator conventions (shared catalog gpu_operator.md): MIG Manager applies the
    # shipped config "all-1g.10gb"; H100 SXM5 80GB is "NVIDIA H100 80GB HBM3" in NVML
    assert kubelet_labels(template) == {
        "nvidia.com/device-plugin.config": "nvke-h100-mig",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.config": "all-1g.10gb",
        "nvidia.com/mig.strategy": "single",
        "nvke.io/gpu-model": "h100-sxm5-80gb",
        "nvke.io/nodepool": "h100-mig",
        "nvke.io/nodepool-id": str(POOL_ID),
    }
    registration = template["spec"]["template"]["spec"]["joinConfiguration"]["nodeRegistration"]
    assert registration["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
    assert template["metadata"]["name"].startswith("llm-training-0a1b2c3d-h100-mig-fedcba-")
    spec = deployment["spec"]
    assert deployment["metadata"]["name"] == "llm-training-0a1b2c3d-h100-mig-fedcba"
    assert spec["replicas"] == 2
    assert json.loads(deployment["metadata"]["annotations"]["nvke.io/nodes"]) == {
        str(NODE_IDS[0]): "gpu-a",
        str(NODE_IDS[1]): "gpu-b",
    }
    assert spec["rollout"] == {"strategy": {"type": "OnDelete"}}
    assert spec["selector"]["matchLabels"] == {
        "cluster.x-k8s.io/cluster-name": "llm-training-0a1b2c3d",
        "nvke.io/nodepool-id": str(POOL_ID),
    }
    machine = spec["template"]
    assert set(spec["selector"]["matchLabels"].items()) <= set(
        machine["metadata"]["labels"].items()
    )
    assert machine["spec"]["version"] == "v1.36.0"
    assert machine["spec"]["bootstrap"]["configRef"] == {
        "apiGroup": "bootstrap.cluster.x-k8s.io",
        "kind": "KubeadmConfigTemplate",
        "name": template["metadata"]["name"],
    }
    assert machine["spec"]["infrastructureRef"] == {
        "apiGroup": "infrastructure.cluster.x-k8s.io",
        "kind": "Metal3MachineTemplate",
        "name": "nvke-h100-sxm5-80gb",
    }
    assert health_check["spec"]["selector"] == spec["selector"]
    assert health_check["spec"]["checks"]["unhealthyNodeConditions"] == [
        {"type": "Ready", "status": "False", "timeoutSeconds": 300},
        {"type": "Ready", "status": "Unknown", "timeoutSeconds": 300},
    ]
    assert health_check["spec"]["remediation"] == {
        "triggerIf": {"unhealthyLessThanOrEqualTo": "40%"}
    }


def test_mixed_layout_pool_names_its_own_mig_config_and_every_profile(catalog):
    pool = pool_spec(
        "h100-nvl-94gb",
        1,
        {"mode": "mig", "mig_layout": {"3g.47gb": 1, "1g.24gb": 1, "1g.12gb": 1}},
        name="nvl",
    )
    template, deployment, _ = render_pool(pool, nodes={str(NODE_IDS[0]): "nvl-1"})
    labels = kubelet_labels(template)
    assert labels["nvidia.com/mig.config"] == "nvke-nvl"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.12gb.product"] == "NVIDIA-H100-NVL-MIG-1g.12gb"
    assert labels["nvidia.com/mig-1g.24gb.product"] == "NVIDIA-H100-NVL-MIG-1g.24gb"
    assert labels["nvidia.com/mig-3g.47gb.product"] == "NVIDIA-H100-NVL-MIG-3g.47gb"
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["template"]["spec"]["infrastructureRef"]["name"] == (
        "nvke-h100-nvl-94gb"
    )


def test_a_changed_gpu_config_is_a_new_template_and_the_same_config_the_same_name(catalog):
    single = render_pool(pool_spec())[0]["metadata"]["name"]
    again = render_pool(pool_spec())[0]["metadata"]["name"]
    balanced = render_pool(
        pool_spec(
            isolation={"mode": "mig", "mig_layout": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}
        )
    )[0]["metadata"]["name"]
    assert single == again
    assert balanced != single
    assert balanced.rsplit("-", 1)[0] == single.rsplit("-", 1)[0]


def test_workers_run_the_version_they_are_given_and_the_cluster_version_otherwise(catalog):
    assert render_pool(pool_spec())[1]["spec"]["template"]["spec"]["version"] == "v1.36.0"
    deployment = render_pool(pool_spec(), version="v1.35.4")[1]
    assert deployment["spec"]["template"]["spec"]["version"] == "v1.35.4"


def test_names_stay_within_the_label_value_limit_for_the_longest_names(catalog):
    from clusters.providers.clusterapi.render import cluster_name, machine_deployment_name

    cluster = cluster_spec(name="a" * 63)
    pool = replace(pool_spec(cluster=cluster), name="p" * 40)
    assert cluster_name(cluster) == "a" * 30 + "-0a1b2c3d"
    assert machine_deployment_name(pool) == "a" * 30 + "-0a1b2c3d-" + "p" * 14 + "-fedcba"
    assert len(machine_deployment_name(pool)) == 61  # Cluster API's deployment-name label <= 63
    odd = cluster_spec(name="--Odd_Name.v2--")
    assert cluster_name(odd) == "odd-name-v2-0a1b2c3d"


@pytest.mark.parametrize(
    ("given", "expected"),
    [("1.36", "v1.36.0"), ("1.36.3", "v1.36.3"), ("v1.35.12", "v1.35.12"), (" 1.37 ", "v1.37.0")],
)
def test_capi_version_adds_the_patch_release_kubeadm_needs(given, expected):
    from clusters.providers.clusterapi.render import capi_version

    assert capi_version(given) == expected


def test_capi_version_refuses_what_is_not_a_version():
    from clusters.providers.clusterapi.render import capi_version

    with pytest.raises(ValueError):
        capi_version("latest")


def test_infrastructure_setting_names_the_group_and_kind_prefix():
    from clusters.providers.clusterapi.render import Infrastructure

    assert Infrastructure.parse("Docker").ref("Cluster", "c") == {
        "apiGroup": "infrastructure.cluster.x-k8s.io",
        "kind": "DockerCluster",
        "name": "c",
    }
    assert Infrastructure.parse("infrastructure.example.com/Foo") == Infrastructure(
        "infrastructure.example.com", "Foo"
    )
    with pytest.raises(ValueError):
        Infrastructure.parse("metal3")  # a Kind starts with a capital


def test_kubelet_labels_leave_out_gfd_labels_only_when_too_long():
    from clusters.providers.clusterapi.render import KUBELET_ARG_MAX, node_labels_arg

    short = {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/gpu.product": "X"}
    assert node_labels_arg(short) == "nvidia.com/gpu.product=X,nvidia.com/mig.config=all-1g.10gb"
    long = {f"nvidia.com/mig-{i}g.{i}gb.product": "P" * 60 for i in range(1, 20)}
    long["nvidia.com/mig.config"] = "nvke-big"
    assert len(",".join(f"{k}={v}" for k, v in long.items())) > KUBELET_ARG_MAX
    assert node_labels_arg(long) == "nvidia.com/mig.config=nvke-big"
    with pytest.raises(ValueError):
        node_labels_arg({f"nvke.io/l{i}": "v" * 60 for i in range(20)})


def test_gpu_operator_configmaps_keep_the_entries_of_other_pools(catalog):
    from clusters.providers.clusterapi.render import render_gpu_operator

    pool = pool_spec()
    existing = {
        "nvke-mig-parted-config": {
            "metadata": {"name": "nvke-mig-parted-config", "resourceVersion": "7"},
            "data": {
                "config.yaml": yaml.safe_dump(
                    {
                        "version": "v1",
                        "mig-configs": {
                            "nvke-other": [
                                {
                                    "devices": "all",
                                    "mig-enabled": True,
                                    "mig-devices": {"7g.80gb": 1},
                                }
                            ]
                        },
                    }
                )
            },
        },
        "nvke-device-plugin-config": {
            "metadata": {"name": "nvke-device-plugin-config"},
            "data": {"nvke-other": "version: v1\nflags:\n  migStrategy: none\n"},
        },
    }
    objects = render_gpu_operator(pool, existing)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ConfigMap", "nvke-device-plugin-config"),
        ("ConfigMap", "nvke-mig-parted-config"),
        ("NVIDIADriver", "nvke-default"),
        ("ClusterPolicy", "cluster-policy"),
    ]
    plugin, parted = objects[0], objects[1]
    assert sorted(plugin["data"]) == ["nvke-h100-mig", "nvke-other"]
    assert yaml.safe_load(plugin["data"]["nvke-h100-mig"]) == {
        "version": "v1",
        "flags": {"migStrategy": "single"},
    }
    configs = yaml.safe_load(parted["data"]["config.yaml"])["mig-configs"]
    assert configs == {
        "nvke-other": [{"devices": "all", "mig-enabled": True, "mig-devices": {"7g.80gb": 1}}],
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-1g.10gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
    }
    assert "resourceVersion" not in parted["metadata"]  # the provider adds the one it read
    policy = objects[-1]["spec"]
    assert policy["migManager"]["config"] == {
        "name": "nvke-mig-parted-config",
        "default": "all-disabled",
    }
    assert policy["devicePlugin"]["config"] == {"name": "nvke-device-plugin-config"}
    assert policy["driver"] == {"enabled": True, "useNvidiaDriverCRD": True}


def test_a_pinned_driver_pool_brings_its_own_nvidiadriver_before_the_default(catalog):
    from clusters.providers.clusterapi.render import render_gpu_operator

    pool = pool_spec("a100-sxm4-80gb", 8, {"mode": "exclusive"}, name="a100", driver="580.95.05")
    drivers = [o for o in render_gpu_operator(pool) if o["kind"] == "NVIDIADriver"]
    assert [(d["metadata"]["name"], d["spec"]["default"]) for d in drivers] == [
        ("nvke-a100", False),
        ("nvke-default", True),
    ]
    assert drivers[0]["spec"]["version"] == "580.95.05"
    assert drivers[0]["spec"]["nodeSelector"] == {"nvke.io/nodepool": "a100"}


def test_nodes_recorded_on_a_machine_deployment_read_back():
    from clusters.providers.clusterapi.render import nodes_of

    node = str(uuid.uuid4())
    assert nodes_of({"metadata": {"annotations": {"nvke.io/nodes": json.dumps({node: "h"})}}}) == {
        node: "h"
    }
    assert nodes_of(None) == {}
    assert nodes_of({"metadata": {"annotations": {"nvke.io/nodes": "not json"}}}) == {}


def test_whole_rendering_matches_the_reviewed_golden_file(catalog):
    from clusters.providers.clusterapi.render import render_cluster, render_gpu_operator

    pool = pool_spec()
    objects = [
        *render_cluster(pool.cluster, namespace=NS, infrastructure=infra()),
        *render_pool(pool),
        *render_gpu_operator(pool),
    ]
    path = GOLDEN / "h100-mig-single.json"
    if os.environ.get("NVKE_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(objects, indent=2, sort_keys=True) + "\n")
    assert objects == json.loads(path.read_text())


def test_a_metal3_pool_template_admits_only_the_hosts_nvke_reserved(catalog):
    from clusters.providers.clusterapi import render
    from tests.clusterapi.specs import pool_spec

    pool = pool_spec()
    metal3 = render.Infrastructure.parse("Metal3")
    assert (metal3.api_group, metal3.version, metal3.managed) == (
        "infrastructure.cluster.x-k8s.io",
        "v1beta1",
        True,
    )
    image = {"image": {"url": "http://images/ubuntu.qcow2", "checksum": "sha256:ab"}}
    template = render.render_worker_template(
        pool,
        namespace="nvke",
        infrastructure=metal3,
        host_ids=["h2", "h1", "h2"],
        machine_spec=image,
    )
    assert template["apiVersion"] == "infrastructure.cluster.x-k8s.io/v1beta1"
    assert template["kind"] == "Metal3MachineTemplate"
    spec = template["spec"]["template"]["spec"]
    assert spec["image"] == image["image"]
    assert spec["hostSelector"] == {
        "matchExpressions": [{"key": "nvke.io/host-id", "operator": "in", "values": ["h1", "h2"]}]
    }
    assert image == {"image": {"url": "http://images/ubuntu.qcow2", "checksum": "sha256:ab"}}
    other = render.render_worker_template(
        pool, namespace="nvke", infrastructure=metal3, host_ids=["h1"], machine_spec=image
    )
    assert other["metadata"]["name"] != template["metadata"]["name"]  # immutable: a new one
    assert template["metadata"]["name"].startswith(render.machine_deployment_name(pool) + "-")
    # the MachineDeployment points to it; a provider NVKE does not know is only referenced
    _, deployment, _ = render.render_node_pool(
        pool,
        nodes={"n1": "gpu-a"},
        namespace="nvke",
        infrastructure=metal3,
        infrastructure_template=template["metadata"]["name"],
    )
    assert deployment["spec"]["template"]["spec"]["infrastructureRef"] == {
        "apiGroup": "infrastructure.cluster.x-k8s.io",
        "kind": "Metal3MachineTemplate",
        "name": template["metadata"]["name"],
    }
    foo = render.Infrastructure.parse("infrastructure.example.com/v1alpha1/Foo")
    assert (foo.version, foo.managed) == ("v1alpha1", False)
    assert (
        render.render_worker_template(pool, namespace="nvke", infrastructure=foo, host_ids=["h1"])
        is None
    )
