"""What a host's agent last reported, in the shape the observed-state gates compare.

The agent is the source of truth for what the hardware runs (DESIGN §3 "Observed state gates
transitions"). Ingestion (:mod:`fleet.ingest`) keeps its latest facts on the rows: per GPU
``Gpu.mig_mode``, ``Gpu.mig_devices`` (with ``profile``, ``placement_start``,
``placement_size`` where the source can tell), ``Gpu.health_counters``, ``Gpu.missing_since``
and the holder; per host ``driver_version``, ``agent_source_error`` (NVML does not
initialise …) and the inventory clock ``inventory_at`` / ``inventory_count``. This module only
reads them; it never asks a provider.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from .hygiene import gpu_findings
from .models import Gpu, Host


class MigDevice(NamedTuple):
    """One MIG device as the agent last reported it: ``profile`` (``1g.10gb``; ``"?"`` when
    the source cannot tell), its placement ``start`` / ``size`` in memory slices (``-1`` when
    it cannot tell), ``gpu_instance_id``, the device's ``uuid`` (``MIG-…``; "" when not
    reported) and ``memory_total_bytes`` (None when not reported)."""

    profile: str
    start: int
    size: int
    gpu_instance_id: int | None
    uuid: str = ""
    memory_total_bytes: int | None = None


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as last reported. ``instances``: sorted ``(profile, start, size)``; a device the
    source reported without a profile or placement has ``("?", -1, -1)``."""

    uuid: str
    host_id: uuid.UUID
    holder_id: uuid.UUID | None
    mig_mode: str | None
    instances: tuple[tuple[str, int, int], ...]
    missing: bool
    failed_checks: tuple[str, ...]
    health: str
    health_reason: str
    #: every reported MIG device (:class:`MigDevice`, by start), and the slice scrubs the
    #: agent reported (``Gpu.slice_scrubs``)
    devices: tuple[MigDevice, ...] = ()
    slice_scrubs: tuple[dict[str, Any], ...] = ()
    #: NVML's name (``NVIDIA H100 80GB HBM3``) and memory as the agent reported them
    product_name: str = ""
    memory_total_bytes: int | None = None
    #: the GPU's index on its host and what NVML says of its chip (``Hopper``, ``9.0``; ""
    #: when the agent did not report it): the agent's static ``attributes``
    index: int = 0
    architecture: str = ""
    compute_capability: str = ""


@dataclass(frozen=True)
class HostFacts:
    """A host's latest agent facts; ``gpus`` by UUID (only those asked for that exist)."""

    host_id: uuid.UUID
    hostname: str
    driver_version: str
    source_error: str
    inventory_at: datetime | None
    inventory_count: int
    gpus: dict[str, GpuFacts] = field(default_factory=dict)
    #: the host's multi-node NVLink domain (fabric cluster UUID, clique id), None without one
    nvlink_domain: tuple[uuid.UUID, int] | None = None
    #: the highest CUDA version the driver supports, as reported ("" when unknown)
    cuda_version: str = ""


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _instances(devices: Any) -> tuple[tuple[str, int, int], ...]:
    out = []
    for device in devices or []:
        if not isinstance(device, dict):
            continue
        profile = device.get("profile")
        start, size = device.get("placement_start"), device.get("placement_size")
        if isinstance(profile, str) and isinstance(start, int) and isinstance(size, int):
            out.append((profile, start, size))
        else:
            out.append(("?", -1, -1))
    return tuple(sorted(out))


def _devices(devices: Any) -> tuple[MigDevice, ...]:
    out = []
    for device in devices or []:
        if not isinstance(device, dict):
            continue
        profile = device.get("profile")
        start, size = device.get("placement_start"), device.get("placement_size")
        gi = device.get("gpu_instance_id")
        memory = device.get("memory_total_bytes")
        if not (isinstance(start, int) and isinstance(size, int)):
            start, size = -1, -1
        out.append(
            MigDevice(
                profile if isinstance(profile, str) else "?",
                start,
                size,
                gi if isinstance(gi, int) else None,
                _text(device.get("uuid")),
                memory if isinstance(memory, int) and not isinstance(memory, bool) else None,
            )
        )
    return tuple(sorted(out, key=lambda d: (d[1], d[0])))


def host_facts(host_id: Any, gpu_uuids: list[str] | tuple[str, ...]) -> HostFacts | None:
    """The latest agent facts of ``host_id`` and of the GPUs ``gpu_uuids`` (any host's: the
    caller checks they are this host's). None when the host does not exist."""
    host = (
        Host.objects.filter(pk=host_id)
        .values(
            "id",
            "hostname",
            "driver_version",
            "cuda_version",
            "agent_source_error",
            "inventory_at",
            "inventory_count",
            "nvlink_cluster_uuid",
            "nvlink_clique_id",
        )
        .first()
    )
    if host is None:
        return None
    gpus = {}
    for row in Gpu.objects.filter(uuid__in=list(gpu_uuids)).values(
        "uuid",
        "host_id",
        "holder_id",
        "mig_mode",
        "mig_devices",
        "missing_since",
        "health_counters",
        "health",
        "health_reason",
        "slice_scrubs",
        "product_name",
        "memory_total_bytes",
        "index",
        "attributes",
    ):
        failed = tuple(
            f["detail"]
            for f in gpu_findings(row["uuid"], row["health_counters"])
            if f["status"] == "FAILED"
        )
        gpus[row["uuid"]] = GpuFacts(
            uuid=row["uuid"],
            host_id=row["host_id"],
            holder_id=row["holder_id"],
            mig_mode=row["mig_mode"],
            instances=_instances(row["mig_devices"]) if row["mig_mode"] == "enabled" else (),
            missing=row["missing_since"] is not None,
            failed_checks=failed,
            health=row["health"],
            health_reason=row["health_reason"],
            devices=_devices(row["mig_devices"]) if row["mig_mode"] == "enabled" else (),
            slice_scrubs=tuple(s for s in row["slice_scrubs"] or [] if isinstance(s, dict)),
            product_name=row["product_name"],
            memory_total_bytes=row["memory_total_bytes"],
            index=row["index"],
            architecture=_text((row["attributes"] or {}).get("architecture")),
            compute_capability=_text((row["attributes"] or {}).get("compute_capability")),
        )
    return HostFacts(
        host_id=host["id"],
        hostname=host["hostname"],
        driver_version=host["driver_version"],
        source_error=host["agent_source_error"],
        inventory_at=host["inventory_at"],
        inventory_count=host["inventory_count"],
        gpus=gpus,
        cuda_version=host["cuda_version"] or "",
        nvlink_domain=(
            (host["nvlink_cluster_uuid"], host["nvlink_clique_id"])
            if host["nvlink_cluster_uuid"] is not None
            else None
        ),
    )
