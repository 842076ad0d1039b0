"""``nvidia-smi-xml`` source: reads a ``nvidia-smi -q -x`` report from a file.

The file is re-read on every collection, so whatever rewrites it (a cron job running
``nvidia-smi -q -x > FILE``, or a test) is picked up. Each collection yields one sample per
GPU, stamped with the collection time (the report's own ``<timestamp>`` is local time without
a zone, so it is not used), plus one sample per MIG device (``mig_gpu_instance_id`` set, memory
of that instance, utilization ``None``) — the same shape the ``nvml`` source produces.
Parsing and units: :mod:`nvke_agent.smi_xml`.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

from nvke_agent.smi_xml import NotAnNvidiaSmiReport, SmiGpu, SmiReport, parse_nvidia_smi_xml
from nvke_agent.sources.base import (
    Event,
    GpuInventory,
    Inventory,
    MigDeviceInventory,
    Sample,
    SourceUnavailable,
    empty_sample,
    format_ts,
)

log = logging.getLogger(__name__)


class SmiXmlSource:
    """Source over a ``nvidia-smi -q -x`` file (see module docstring)."""

    name = "nvidia-smi-xml"

    def __init__(self, path: str | Path) -> None:
        """Read the file once; :class:`SourceUnavailable` if it is missing or not a report."""
        self._path = Path(path)
        try:
            self._report: SmiReport = self._read()
        except (OSError, NotAnNvidiaSmiReport) as exc:
            raise SourceUnavailable(f"{self._path}: {exc}") from exc

    @property
    def exhausted(self) -> bool:
        """A live file never runs out."""
        return False

    def _read(self) -> SmiReport:
        return parse_nvidia_smi_xml(self._path.read_bytes())

    def _refresh(self) -> bool:
        try:
            self._report = self._read()
        except (OSError, NotAnNvidiaSmiReport) as exc:
            # A half-written file or a brief absence: keep running, skip this round.
            log.error("cannot read nvidia-smi report %s: %s", self._path, exc)
            return False
        return True

    def inventory(self) -> Inventory:
        """Inventory from the most recently read report."""
        report = self._report
        return Inventory(
            driver_version=report.driver_version,
            cuda_version=report.cuda_version,
            gpus=[_gpu_inventory(gpu) for gpu in report.gpus],
        )

    def collect(self, now: datetime) -> list[Sample]:
        """Re-read the file; one sample per GPU and per MIG device, stamped ``now``."""
        if not self._refresh():
            return []
        ts = format_ts(now)
        samples: list[Sample] = []
        for gpu in self._report.gpus:
            sample = empty_sample(ts, gpu.uuid)
            sample["utilization_gpu_pct"] = gpu.utilization_gpu_pct
            sample["utilization_memory_pct"] = gpu.utilization_memory_pct
            sample["memory_used_bytes"] = gpu.memory_used_bytes
            sample["memory_total_bytes"] = gpu.memory_total_bytes
            sample["power_mw"] = gpu.power_draw_mw
            sample["temperature_c"] = gpu.temperature_c
            sample["ecc_volatile_uncorrected"] = gpu.ecc_volatile_uncorrected
            sample["ecc_volatile_corrected"] = gpu.ecc_volatile_corrected
            sample["sm_clock_mhz"] = gpu.sm_clock_mhz
            sample["memory_clock_mhz"] = gpu.memory_clock_mhz
            sample["clocks_event_reasons"] = gpu.clocks_event_reasons
            samples.append(sample)
            for mig in gpu.mig_devices:
                if mig.gpu_instance_id is None:
                    continue
                mig_sample = empty_sample(ts, gpu.uuid, mig.gpu_instance_id)
                mig_sample["memory_used_bytes"] = mig.memory_used_bytes
                mig_sample["memory_total_bytes"] = mig.memory_total_bytes
                samples.append(mig_sample)
        return samples

    def events(self) -> list[Event]:
        """A report carries no Xid events."""
        return []

    def close(self) -> None:
        """Nothing to release."""


def _gpu_inventory(gpu: SmiGpu) -> GpuInventory:
    inventory = GpuInventory(
        uuid=gpu.uuid,
        index=gpu.index,
        name=gpu.product_name,
        pci_bus_id=gpu.pci_bus_id,
        memory_total_bytes=gpu.memory_total_bytes,
        mig_mode=gpu.mig_mode,
        mig_devices=[
            MigDeviceInventory(
                uuid=mig.uuid,
                gpu_instance_id=mig.gpu_instance_id,
                compute_instance_id=mig.compute_instance_id,
                memory_total_bytes=mig.memory_total_bytes,
                multiprocessor_count=mig.multiprocessor_count,
            )
            for mig in gpu.mig_devices
        ],
        health=dict(gpu.health),
        attributes=dict(gpu.attributes),
    )
    if gpu.fabric is not None:
        inventory["fabric"] = dict(gpu.fabric)
    return inventory
