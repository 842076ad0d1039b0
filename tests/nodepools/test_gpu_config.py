"""What real clusters receive: the rendered GPU Operator inputs of a node pool.

Golden files (``golden/<case>.json``) hold the whole rendering of each case; they were
checked by hand against the formats documented in the shared catalog's ``gpu_operator.md``
(mig-parted ``version: v1`` / ``mig-configs``, device-plugin ``version: v1`` / ``flags`` /
``sharing``, vGPU Device Manager ``vgpu-configs``, GFD product labels, resource names) and
the asserts below restate the important values. Kubernetes objects are validated with
``kubernetes-validate`` (the Kubernetes 1.36 OpenAPI schemas, strict) and the NVIDIADriver
custom resource with the CRD's own ``openAPIV3Schema`` (tests/nodepools/crds/).

Regenerate after an intended change with ``NVKE_UPDATE_GOLDEN=1`` and review the diff.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

pytestmark = pytest.mark.django_db

GOLDEN = Path(__file__).resolve().parent / "golden"
CRD = Path(__file__).resolve().parent / "crds" / "nvidia.com_nvidiadrivers.yaml"
K8S_VERSION = "1.36.0"

#: Kubernetes qualified names (label keys, extended resource names) and label values
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
QUALIFIED = re.compile(
    rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$"
)
LABEL_VALUE = re.compile(rf"^({_NAME})?$")

CASES = {
    "h100-mig-single-1g.10gb": (
        "h100-sxm5-80gb",
        2,
        {"mode": "mig", "mig_profile": "1g.10gb"},
        None,
    ),
    "h100nvl-mig-mixed": (
        "h100-nvl-94gb",
        1,
        {"mode": "mig", "mig_layout": {"3g.47gb": 1, "1g.24gb": 1, "1g.12gb": 1}},
        None,
    ),
    "l40s-time-slicing-4": ("l40s", 4, {"mode": "time-slicing", "replicas": 4}, None),
    "l40s-mps-8": ("l40s", 2, {"mode": "mps", "replicas": 8}, None),
    "a100-exclusive-driver": ("a100-sxm4-80gb", 8, {"mode": "exclusive"}, "580.95.05"),
    "a100-time-sliced-mig": (
        "a100-sxm4-80gb",
        1,
        {"mode": "time-slicing", "replicas": 2, "mig_profile": "3g.40gb"},
        "R580",
    ),
    "a10-vgpu-mixed-sizes": (
        "a10",
        1,
        {"mode": "vgpu", "vgpu_layout": {"A10-4Q": 3, "A10-6Q": 2}},
        None,
    ),
    "h200nvl-vgpu-mig-backed": (
        "h200-nvl-141gb",
        1,
        {"mode": "vgpu", "vgpu_layout": {"H200-3-71C": 1, "H200-1-18C": 2}},
        None,
    ),
    "t4-exclusive": ("t4", 1, {"mode": "exclusive"}, None),
}


def render(case: str) -> dict:
    from catalog.models import GpuModel
    from nodepools.gpu_config import render_gpu_config
    from nodepools.isolation import validate_isolation

    slug, gpus, isolation, driver = CASES[case]
    model = GpuModel.objects.get(slug=slug)
    return render_gpu_config(
        gpu_model=model,
        gpus_per_node=gpus,
        isolation=validate_isolation(model, isolation),
        pool_name="pool-a",
        driver_version=driver,
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendering_matches_the_golden_file(catalog, case):
    rendered = json.loads(json.dumps(render(case)))
    path = GOLDEN / f"{case}.json"
    if os.environ.get("NVKE_UPDATE_GOLDEN"):
        path.write_text(json.dumps(rendered, indent=2, sort_keys=True) + "\n")
    assert rendered == json.loads(path.read_text())


def test_single_strategy_on_h100(catalog):
    config = render("h100-mig-single-1g.10gb")
    assert config["labels"]["nvidia.com/mig.config"] == "all-1g.10gb"  # mig-parted default name
    assert config["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert config["resources"] == {"nvidia.com/gpu": 14}  # 7 per GPU x 2 GPUs
    assert config["mig_parted_config"]["mig-configs"]["all-1g.10gb"] == [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}
    ]
    assert config["device_plugin_config"] == {"version": "v1", "flags": {"migStrategy": "single"}}


def test_mixed_layout_on_h100_nvl(catalog):
    config = render("h100nvl-mig-mixed")
    assert config["labels"]["nvidia.com/mig.config"] == "nvke-pool-a"
    assert config["resources"] == {
        "nvidia.com/mig-3g.47gb": 1,
        "nvidia.com/mig-1g.24gb": 1,
        "nvidia.com/mig-1g.12gb": 1,
    }
    assert config["mig_layout"] == [
        {"profile": "3g.47gb", "start": 0, "size": 4},
        {"profile": "1g.24gb", "start": 4, "size": 2},
        {"profile": "1g.12gb", "start": 6, "size": 1},
    ]
    assert config["labels"]["nvidia.com/mig-1g.12gb.product"] == "NVIDIA-H100-NVL-MIG-1g.12gb"


def test_time_slicing_and_mps_plugin_configs(catalog):
    ts = render("l40s-time-slicing-4")
    assert ts["device_plugin_config"]["sharing"] == {
        "timeSlicing": {
            "renameByDefault": False,
            "failRequestsGreaterThanOne": True,
            "resources": [{"name": "nvidia.com/gpu", "replicas": 4}],
        }
    }
    assert ts["resources"] == {"nvidia.com/gpu": 16}  # 4 GPUs x 4 replicas
    assert "nvidia.com/mig.config" not in ts["labels"]  # L40S has no MIG
    mps = render("l40s-mps-8")
    assert mps["device_plugin_config"]["sharing"] == {
        "mps": {"renameByDefault": False, "resources": [{"name": "nvidia.com/gpu", "replicas": 8}]}
    }
    assert mps["labels"]["nvidia.com/gpu.sharing-strategy"] == "mps"
    # GFD appends -SHARED to the product with renameByDefault=false
    assert mps["labels"]["nvidia.com/gpu.product"].endswith("-SHARED")


def test_time_sliced_mig_devices(catalog):
    config = render("a100-time-sliced-mig")
    assert config["labels"]["nvidia.com/mig.config"] == "all-3g.40gb"
    assert config["resources"] == {"nvidia.com/gpu": 4}  # 2 MIG devices x 2 replicas
    assert config["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb-SHARED"


def test_vgpu_nodes(catalog):
    config = render("a10-vgpu-mixed-sizes")
    assert config["labels"]["nvidia.com/gpu.workload.config"] == "vm-vgpu"
    assert config["vgpu_device_manager_config"] == {
        "version": "v1",
        "vgpu-configs": {
            "nvke-pool-a": [{"devices": "all", "vgpu-devices": {"A10-4Q": 3, "A10-6Q": 2}}]
        },
    }
    assert config["resources"] == {"nvidia.com/NVIDIA_A10-4Q": 3, "nvidia.com/NVIDIA_A10-6Q": 2}
    assert config["device_plugin_config"] is None
    backed = render("h200nvl-vgpu-mig-backed")
    assert backed["mig_parted_config"]["mig-configs"]["nvke-pool-a"][0]["mig-devices"] == {
        "3g.71gb": 1,
        "1g.18gb": 2,
    }


def test_driver_pinning_renders_an_nvidiadriver(catalog):
    (driver,) = [
        m for m in render("a100-exclusive-driver")["manifests"] if m["kind"] == "NVIDIADriver"
    ]
    assert driver["spec"]["version"] == "580.95.05"
    assert driver["spec"]["nodeSelector"] == {"nvke.io/nodepool": "pool-a"}
    (branch,) = [
        m for m in render("a100-time-sliced-mig")["manifests"] if m["kind"] == "NVIDIADriver"
    ]
    assert (branch["spec"]["version"], branch["spec"]["usePrecompiled"]) == ("580", True)
    assert not [m for m in render("t4-exclusive")["manifests"] if m["kind"] == "NVIDIADriver"]


def node_and_pod(config: dict) -> list[dict]:
    """A Node as NVKE labels and taints it, and a Pod asking for one of each resource."""
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "pool-a-0", "labels": config["labels"]},
        "spec": {"taints": config["taints"]},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-job", "namespace": "default"},
        "spec": {
            "nodeSelector": {"nvke.io/nodepool": config["labels"]["nvke.io/nodepool"]},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04",
                    "resources": {"limits": {name: 1 for name in config["resources"]}},
                }
            ],
        },
    }
    return [node, pod]


@pytest.mark.parametrize("case", sorted(CASES))
def test_kubernetes_objects_are_valid(catalog, case):
    config = render(case)
    crd = yaml.safe_load(CRD.read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    for obj in [*config["manifests"], *node_and_pod(config)]:
        if obj["apiVersion"] == "nvidia.com/v1alpha1":
            jsonschema.validate(
                obj["spec"], schema["schema"]["openAPIV3Schema"]["properties"]["spec"]
            )
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    for key, value in config["labels"].items():
        assert QUALIFIED.match(key), key
        assert LABEL_VALUE.match(value), (key, value)
    for name in config["resources"]:
        assert QUALIFIED.match(name) and "/" in name, name
    # the config files inside the ConfigMaps parse back to what the pool holds
    for obj in config["manifests"]:
        if obj["kind"] != "ConfigMap":
            continue
        for key, text in obj["data"].items():
            doc = yaml.safe_load(text)
            assert doc["version"] == "v1"
            if obj["metadata"]["name"] == "nvke-mig-parted-config":
                assert doc == config["mig_parted_config"]
                assert config["labels"]["nvidia.com/mig.config"] in doc["mig-configs"]
            elif obj["metadata"]["name"] == "nvke-device-plugin-config":
                assert key == config["labels"]["nvidia.com/device-plugin.config"]
                assert doc == config["device_plugin_config"]


def test_a_broken_object_fails_the_validator():
    bad = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "gpu-operator"},
        "data": {"config.yaml": 1},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_cluster_wide_configmaps_merge_every_pools_entries(catalog):
    from nodepools.gpu_config import merge_manifests

    merged = merge_manifests([render("h100-mig-single-1g.10gb"), render("h100nvl-mig-mixed")])
    parted = next(m for m in merged if m["metadata"]["name"] == "nvke-mig-parted-config")
    configs = yaml.safe_load(parted["data"]["config.yaml"])["mig-configs"]
    assert sorted(configs) == ["all-1g.10gb", "all-disabled", "nvke-pool-a"]
