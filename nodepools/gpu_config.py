"""Render what the NVIDIA GPU Operator needs for a node pool's nodes.

Conventions (shared catalog ``gpu_operator.md``, from NVIDIA/k8s-device-plugin,
NVIDIA/mig-parted and NVIDIA/gpu-operator at the commits named there):

* MIG Manager applies the mig-parted config named by the node label ``nvidia.com/mig.config``
  from ONE ConfigMap (ClusterPolicy ``spec.migManager.config.name``, key ``config.yaml``;
  format ``version: v1`` + ``mig-configs: {name: [{devices, mig-enabled, mig-devices}]}``).
  NVKE names a single-profile config like the shipped defaults (``all-1g.10gb``, ``+`` written
  as ``.``), a mixed layout ``nvke-<pool>``, and always includes ``all-disabled``;
* the device plugin (and GFD) read a per-node config chosen by the label
  ``nvidia.com/device-plugin.config`` from the ConfigMap named in ClusterPolicy
  ``spec.devicePlugin.config.name``: ``version: v1``, ``flags.migStrategy``
  (``none|single|mixed``) and ``sharing.timeSlicing`` / ``sharing.mps`` with ``resources:
  [{name, replicas}]``; NVKE gives every pool its own key ``nvke-<pool>``;
* resources: ``nvidia.com/gpu`` (whole GPUs; one per MIG device under ``single``; one per
  replica when shared), ``nvidia.com/mig-<profile>`` under ``mixed`` (``+`` written as ``.``,
  since ``+`` is not allowed in a Kubernetes resource name), vGPU types as
  ``nvidia.com/NVIDIA_<type>`` on ``vm-vgpu`` nodes (GPU Operator KubeVirt doc, A10 example);
* GFD product labels: ``nvidia.com/gpu.product`` = NVML name with blanks as ``-``,
  ``<product>-MIG-<profile>`` under ``single``, ``-SHARED`` appended when shared with
  ``renameByDefault: false``; under ``mixed`` one ``nvidia.com/mig-<profile>.product`` each;
* taint ``nvidia.com/gpu=present:NoSchedule`` on every GPU node.

:func:`render_gpu_config` returns a JSON-ready dict (stored on the pool as ``gpu_config``):
``labels`` (what NVKE puts on the nodes, product labels included so pods can select the pool
before GFD runs; GFD writes the same values), ``taints``, ``resources`` (per node),
``mig_strategy``, ``mig_layout`` (the GPU instances of EACH GPU: profile, start memory slice,
size, in creation order; for a ``tenancy: shared`` pool the instances of EACH NODE, whose
starts the fleet picks on a shared GPU, so ``start`` is None), ``tenancy`` (``shared`` only),
``mig_parted_config`` (None for a shared pool: the fleet partitions a shared host's GPUs,
with no ``nvidia.com/mig.config`` label), ``device_plugin_config``,
``vgpu_device_manager_config`` and
``manifests`` (the Kubernetes objects: ConfigMaps in namespace ``gpu-operator`` and, with a
pinned driver, an ``NVIDIADriver``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from catalog.models import GpuModel
from catalog.services import parse_driver_version

from .choices import GpuPublishing, IsolationMode
from .isolation import IsolationPlan, isolation_plan
from .nvlink import compute_domain, wants_one_domain

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NAMESPACE = "gpu-operator"
MIG_PARTED_CONFIGMAP = "nvke-mig-parted-config"
DEVICE_PLUGIN_CONFIGMAP = "nvke-device-plugin-config"
VGPU_CONFIGMAP = "nvke-vgpu-devices-config"
#: NVIDIADriver defaults of the GPU Operator chart (values.yaml at the catalog snapshot)
DRIVER_REPOSITORY = "nvcr.io/nvidia"
DRIVER_IMAGE = "driver"


def label_safe(profile: str) -> str:
    """A MIG profile name usable in a Kubernetes label value: ``+`` (not allowed there, label
    values are ``[A-Za-z0-9._-]``) becomes ``.``, as mig-parted writes ``all-1g.10gb.me``."""
    return profile.replace("+", ".")


def product_label(product_name: str) -> str:
    """GFD's ``nvidia.com/gpu.product`` value: the NVML name with blanks replaced by '-'."""
    return "-".join(product_name.split())


def resource_suffix(profile: str) -> str:
    """A MIG profile as it appears in resource names, labels and config names: ``+`` -> ``.``."""
    return profile.replace("+", ".")


def config_hash(gpu_config: dict[str, Any]) -> str:
    """A short stable digest of what a node must run (MIG geometry, plugin and vGPU configs);
    nodes record it once applied, so the reconciler can tell which nodes are out of date."""
    relevant = {
        k: gpu_config.get(k)
        for k in (
            "mig_strategy",
            "mig_layout",
            "device_plugin_config",
            "vgpu_device_manager_config",
            "driver",
        )
    }
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def render_gpu_config(
    *,
    gpu_model: GpuModel,
    gpus_per_node: int,
    isolation: dict[str, Any],
    pool_name: str,
    driver_version: str | None = None,
    placement: dict[str, Any] | None = None,
    gpu_publishing: str = GpuPublishing.DEVICE_PLUGIN,
) -> dict[str, Any]:
    """The GPU Operator inputs of one node pool (see the module docstring for the shape);
    with ``placement.same_nvlink_domain`` also the pool's ComputeDomain (NVIDIA DRA driver,
    :func:`nodepools.nvlink.compute_domain`) in ``manifests`` and ``compute_domain``. A pool
    with ``gpu_publishing`` ``dra`` (its GPUs are the NVIDIA DRA driver's devices,
    :mod:`nodepools.dra`) gets the GPU Operator's per-node switch
    ``nvidia.com/gpu.deploy.device-plugin: "false"``, no ``resources`` and ``gpu_publishing``
    ``dra``: the device plugin never advertises the same GPUs as ``nvidia.com/gpu``."""
    plan = isolation_plan(gpu_model, isolation)
    product = product_label(
        gpu_model.product_names[0] if gpu_model.product_names else gpu_model.name
    )
    key = f"nvke-{pool_name}"
    labels: dict[str, str] = {"nvke.io/nodepool": pool_name, "nvke.io/gpu-model": gpu_model.slug}
    mig_config_name = _mig_config_name(plan, key) if gpu_model.mig_capable else None
    if mig_config_name is not None:
        labels["nvidia.com/mig.config"] = mig_config_name
    resources: dict[str, int] = {}
    device_plugin: dict[str, Any] | None = None
    vgpu_config: dict[str, Any] | None = None
    if plan.mode == IsolationMode.VGPU:
        labels["nvidia.com/gpu.workload.config"] = "vm-vgpu"
        labels["nvidia.com/vgpu.config"] = key
        vgpu_config = {
            "version": "v1",
            "vgpu-configs": {key: [{"devices": "all", "vgpu-devices": dict(plan.vgpu_devices)}]},
        }
        for name, count in plan.vgpu_devices.items():
            resources[f"nvidia.com/NVIDIA_{name}"] = count * gpus_per_node
    else:
        labels["nvidia.com/device-plugin.config"] = key
        labels["nvidia.com/mig.strategy"] = plan.mig_strategy
        device_plugin = _device_plugin_config(plan)
        resources = _resources(plan, gpus_per_node)
        labels.update(_product_labels(plan, product))
    config: dict[str, Any] = {
        "mig_strategy": plan.mig_strategy,
        "labels": labels,
        "taints": [dict(GPU_TAINT)],
        "resources": resources,
        "mig_layout": [
            {"profile": p.profile, "start": p.start, "size": p.size} for p in plan.mig_placements
        ],
        "mig_parted_config": (
            _mig_parted_config(plan, mig_config_name) if mig_config_name is not None else None
        ),
        "device_plugin_config": device_plugin,
        "vgpu_device_manager_config": vgpu_config,
        "driver": driver_version,
    }
    if plan.mig_strategy == "single":
        config["mig_instances_per_gpu"] = len(plan.mig_placements)
    if isolation.get("tenancy") == "shared":
        # a VM node of a shared host gets ``gpus_per_node`` GPU instances, one of the profile
        # each, on GPUs other tenants share (fleet/shared_hosts.py) — not whole GPUs
        # partitioned for it: it sees one device per instance (issue 33: it said 7 per GPU)
        config["tenancy"] = "shared"
        config["resources"] = {name: gpus_per_node for name in resources} or {
            "nvidia.com/gpu": gpus_per_node
        }
        # …and its layout is those instances, not a whole GPU's 7: where each one sits
        # (``start``) is the fleet's choice on a GPU it shares, recorded per node in
        # ``Node.gpu_layout`` once the host's agent reports it (None here)
        config["mig_layout"] = _node_instances(gpu_model, isolation, gpus_per_node)
        config.pop("mig_instances_per_gpu", None)
        # …and no mig-parted entry: the shared host's MIG layout is the fleet's, across
        # tenants (fleet/shared_hosts.py), never a node's MIG Manager partitioning whole GPUs
        # (a fresh-user trial read "all-1g.10gb: 7 per GPU" beside the node's one instance)
        labels.pop("nvidia.com/mig.config", None)
        config["mig_parted_config"] = None
    if gpu_publishing == GpuPublishing.DRA:
        labels["nvidia.com/gpu.deploy.device-plugin"] = "false"
        config["resources"] = {}
        config["gpu_publishing"] = GpuPublishing.DRA.value
    config["manifests"] = _manifests(config, key, pool_name, driver_version)
    if wants_one_domain(placement):
        domain = compute_domain(pool_name)
        config["compute_domain"] = {
            "name": domain["metadata"]["name"],
            "namespace": domain["metadata"]["namespace"],
            "resource_claim_template": domain["spec"]["channel"]["resourceClaimTemplate"]["name"],
        }
        config["manifests"].append(domain)
    return config


def _node_instances(
    gpu_model: GpuModel, isolation: dict[str, Any], gpus_per_node: int
) -> list[dict[str, Any]]:
    """The GPU instances one VM node of a shared pool holds, as the fleet places them
    (:func:`fleet.shared_hosts.instances_for_policy`): ``[{"profile", "start": None,
    "size"}]`` (size in memory slices, from the catalog's placement table)."""
    from catalog.mig import MigTable
    from fleet.shared_hosts import instances_for_policy

    table = MigTable.from_gpu_model(gpu_model)
    out = []
    for name in instances_for_policy(gpu_model.slug, isolation, gpus_per_node):
        spec = table.profile(name)
        out.append({"profile": name, "start": None, "size": spec.size if spec else 0})
    return out


def _mig_config_name(plan: IsolationPlan, key: str) -> str:
    if not plan.mig_placements:
        return "all-disabled"
    if plan.mig_strategy == "single":
        return "all-" + resource_suffix(plan.mig_placements[0].profile)
    return key


def _mig_parted_config(plan: IsolationPlan, name: str) -> dict[str, Any]:
    configs: dict[str, Any] = {"all-disabled": [{"devices": "all", "mig-enabled": False}]}
    if plan.mig_placements:
        configs[name] = [
            {"devices": "all", "mig-enabled": True, "mig-devices": dict(plan.mig_devices)}
        ]
    return {"version": "v1", "mig-configs": configs}


def _device_plugin_config(plan: IsolationPlan) -> dict[str, Any]:
    config: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": plan.mig_strategy}}
    if plan.sharing is not None:
        strategy, replicas = plan.sharing
        block: dict[str, Any] = {"renameByDefault": False}
        if strategy == "time-slicing":
            block["failRequestsGreaterThanOne"] = True
        block["resources"] = [{"name": "nvidia.com/gpu", "replicas": replicas}]
        config["sharing"] = {"timeSlicing" if strategy == "time-slicing" else "mps": block}
    return config


def _resources(plan: IsolationPlan, gpus: int) -> dict[str, int]:
    replicas = plan.sharing[1] if plan.sharing else 1
    if plan.mig_strategy == "mixed":
        return {
            f"nvidia.com/mig-{resource_suffix(name)}": count * gpus
            for name, count in plan.mig_devices.items()
        }
    per_gpu = len(plan.mig_placements) if plan.mig_strategy == "single" else 1
    return {"nvidia.com/gpu": per_gpu * gpus * replicas}


def _product_labels(plan: IsolationPlan, product: str) -> dict[str, str]:
    shared = "-SHARED" if plan.sharing else ""
    labels = {"nvidia.com/gpu.sharing-strategy": plan.sharing[0] if plan.sharing else "none"}
    if plan.sharing:
        labels["nvidia.com/gpu.replicas"] = str(plan.sharing[1])
    if plan.mig_strategy == "single":
        profile = label_safe(plan.mig_placements[0].profile)
        labels["nvidia.com/gpu.product"] = f"{product}-MIG-{profile}{shared}"
    else:
        labels["nvidia.com/gpu.product"] = f"{product}{shared}"
    if plan.mig_strategy == "mixed":
        for name in plan.mig_devices:
            labels[f"nvidia.com/mig-{resource_suffix(name)}.product"] = (
                f"{product}-MIG-{label_safe(name)}"
            )
    return labels


def _configmap(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/managed-by": "nvke"},
        },
        "data": data,
    }


def _dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def _manifests(
    config: dict[str, Any], key: str, pool_name: str, driver_version: str | None
) -> list[dict[str, Any]]:
    out = []
    if config["mig_parted_config"] is not None:
        out.append(
            _configmap(MIG_PARTED_CONFIGMAP, {"config.yaml": _dump(config["mig_parted_config"])})
        )
    if config["device_plugin_config"] is not None:
        out.append(
            _configmap(DEVICE_PLUGIN_CONFIGMAP, {key: _dump(config["device_plugin_config"])})
        )
    if config["vgpu_device_manager_config"] is not None:
        out.append(
            _configmap(VGPU_CONFIGMAP, {"config.yaml": _dump(config["vgpu_device_manager_config"])})
        )
    if driver_version:
        driver = parse_driver_version(driver_version)
        spec: dict[str, Any] = {
            "driverType": (
                "vgpu-host-manager" if config["vgpu_device_manager_config"] is not None else "gpu"
            ),
            "default": False,
            "repository": DRIVER_REPOSITORY,
            "image": DRIVER_IMAGE,
            "nodeSelector": {"nvke.io/nodepool": pool_name},
        }
        if driver.exact is None:  # a branch: precompiled driver images are tagged by branch
            spec.update(usePrecompiled=True, version=str(driver.branch))
        else:
            spec["version"] = driver.text
        out.append(
            {
                "apiVersion": "nvidia.com/v1alpha1",
                "kind": "NVIDIADriver",
                "metadata": {"name": key, "labels": {"app.kubernetes.io/managed-by": "nvke"}},
                "spec": spec,
            }
        )
    return out


def merge_manifests(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cluster-wide objects for several pools: the MIG Manager and device plugin each read
    one ConfigMap, so pools' ``mig-configs`` entries and plugin keys are merged into it
    (names are per pool, so they never collide; ``all-disabled`` and ``all-<profile>`` are
    identical wherever they appear). Other objects are kept as they are."""
    merged: dict[str, dict[str, Any]] = {}
    others: list[dict[str, Any]] = []
    for config in configs:
        for obj in config.get("manifests", []):
            if obj["kind"] != "ConfigMap":
                others.append(obj)
                continue
            name = obj["metadata"]["name"]
            if name not in merged:
                merged[name] = json.loads(json.dumps(obj))
                continue
            target = merged[name]["data"]
            for key, text in obj["data"].items():
                if key == "config.yaml" and key in target:
                    mine, theirs = yaml.safe_load(target[key]), yaml.safe_load(text)
                    section = "mig-configs" if "mig-configs" in mine else "vgpu-configs"
                    mine[section].update(theirs[section])
                    target[key] = _dump(mine)
                else:
                    target[key] = text
    return [merged[name] for name in sorted(merged)] + others
