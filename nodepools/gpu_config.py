"""Render what the NVIDIA GPU Operator needs for a node pool's nodes.

Conventions (shared catalog ``gpu_operator.md``, from NVIDIA/k8s-device-plugin and
NVIDIA/mig-parted): the MIG Manager applies the mig-parted config named by the node label
``nvidia.com/mig.config`` (``all-disabled``, ``all-<profile>`` with ``+`` written as ``.``);
under the ``single`` MIG strategy every MIG device is advertised as ``nvidia.com/gpu`` and GFD
labels the product ``<product>-MIG-<profile>``; GPU nodes carry the taint
``nvidia.com/gpu=present:NoSchedule``.
"""

from __future__ import annotations

from typing import Any

from catalog.models import GpuModel, MigProfile

from .choices import IsolationMode

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def product_label(product_name: str) -> str:
    """GFD's ``nvidia.com/gpu.product`` value: the NVML name with blanks replaced by '-'."""
    return "-".join(product_name.split())


def render_gpu_config(
    *, gpu_model: GpuModel, gpus_per_node: int, isolation: dict[str, Any], pool_name: str
) -> dict[str, Any]:
    """``{"labels": {...}, "taints": [...], "resources": {name: count}, "mig_strategy"}``.

    ``resources`` are the extended resources one node advertises (what pods request).
    """
    product = product_label(
        gpu_model.product_names[0] if gpu_model.product_names else gpu_model.name
    )
    labels = {"nvke.io/nodepool": pool_name, "nvke.io/gpu-model": gpu_model.slug}
    mode = isolation.get("mode")
    if mode == IsolationMode.MIG:
        profile = MigProfile.objects.get(gpu_model=gpu_model, name=isolation["mig_profile"])
        per_gpu = profile.max_instances
        labels.update(
            {
                "nvidia.com/mig.config": "all-" + profile.name.replace("+", "."),
                "nvidia.com/mig.strategy": "single",
                "nvidia.com/gpu.product": f"{product}-MIG-{profile.name}",
            }
        )
        return {
            "labels": labels,
            "taints": [GPU_TAINT],
            "resources": {"nvidia.com/gpu": per_gpu * gpus_per_node},
            "mig_strategy": "single",
            "mig_instances_per_gpu": per_gpu,
        }
    if gpu_model.mig_capable:
        labels["nvidia.com/mig.config"] = "all-disabled"
    labels["nvidia.com/gpu.product"] = product
    return {
        "labels": labels,
        "taints": [GPU_TAINT],
        "resources": {"nvidia.com/gpu": gpus_per_node},
        "mig_strategy": "none",
    }
