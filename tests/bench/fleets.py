"""The SIMULATED 10,000-host fleet the placement and defragmentation benchmarks share (plain
data, no database): 8-GPU hosts in us-east-1a/b/c — 6,000 HGX H100 (NVSwitch: one NVLink
island of 8), 2,000 H100 NVL (NVLink bridges: islands of 2), 2,000 A100 HGX, hostnames
``h100-00001`` … in that order, GPU UUIDs ``GPU-<hostname>-<index>``."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from fleet.placement import GpuSlot, HostView
from tests.bench.size import pick

ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
#: (catalog slug, hosts, NVLink shape: ``switch`` one island of 8, ``pairs`` islands of 2)
#: (CI size: 300 hosts in the same shares)
MODELS = (
    ("h100-sxm5-80gb", pick(6000, 180), "switch"),
    ("h100-nvl-94gb", pick(2000, 60), "pairs"),
    ("a100-sxm4-80gb", pick(2000, 60), "switch"),
)
HOSTS = sum(count for _, count, _ in MODELS)


def build_fleet(occupy: Callable[[list[GpuSlot]], None] | None = None) -> list[HostView]:
    """Every host of :data:`MODELS`, all GPUs free; ``occupy(gpus)``, called once per host in
    hostname order, may mark some of them held (``holder``, ``tenant``)."""
    hosts: list[HostView] = []
    n = 0
    for model, count, shape in MODELS:
        for _ in range(count):
            n += 1
            name = f"{model[:4]}-{n:05d}"
            gpus = [
                GpuSlot(i, f"GPU-{name}-{i}", i // 2 if shape == "pairs" else 0, True)
                for i in range(8)
            ]
            if occupy is not None:
                occupy(gpus)
            hosts.append(
                HostView(
                    id=uuid.uuid5(uuid.NAMESPACE_DNS, name),
                    hostname=name,
                    zone=ZONES[n % 3],
                    region="us-east-1",
                    gpu_model=model,
                    gpus=gpus,
                )
            )
    return hosts
