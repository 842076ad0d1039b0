"""``simulated`` source: reads the state file of a SIMULATED host (no real GPU).

NVKE's ``simulated`` provider keeps the hardware state of each simulated host in a JSON file
(``clusters/providers/simhosts.py`` in the control plane documents the shape): GPUs with their
MIG mode and GPU instances (profile, placement start and size), their fabric registration on
a simulated multi-node NVLink tray (NVML's numbers, mapped by :mod:`nvke_agent.fabric` as for
the ``nvml`` source), the loaded driver, whether
NVML initialises, health counters (pending row remap, ECC) and Xid events the driver logged.
The provider changes that file when it applies a MIG config, installs a driver, reboots the
machine or resets a GPU; this source reads it on every round the way the ``nvml`` source reads
NVML, and everything after it (spool, seq, sender, ingestion) is the same as for every source.

NVML that does not initialise (the file's ``nvml_error``, with NVML's name of the error in
``nvml_error_code``) is what the ``nvml`` source meets as a node-level NVML error:
:meth:`inventory` and :meth:`collect` raise :class:`SourceError` (its ``code`` from the file),
the agent sends its report without an inventory and with ``source_error`` (and
``source_error_code``) set. A GPU the file marks ``lost`` (fallen off the bus) is what the
``nvml`` source meets as ``NVML_ERROR_GPU_IS_LOST``: no sample, and listed as lost
(:func:`~nvke_agent.sources.base.lost_gpu`: ``health`` ``{"gpu_is_lost": true}``). Xid events are
handed out once each: those logged after the source opened (``events_after`` overrides).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nvke_agent.fabric import fabric_from_nvml
from nvke_agent.sources.base import (
    Event,
    GpuInventory,
    Inventory,
    MigDeviceInventory,
    Sample,
    SourceError,
    SourceUnavailable,
    empty_sample,
    format_ts,
    lost_gpu,
)

log = logging.getLogger(__name__)


class SimulatedSource:
    """Source over a simulated host's state file (see module docstring)."""

    name = "simulated"

    def __init__(self, path: str | Path, *, events_after: int | None = None) -> None:
        """Read the file once; :class:`SourceUnavailable` if it is missing or unreadable."""
        self._path = Path(path)
        try:
            state = self._read()
        except (OSError, ValueError) as exc:
            raise SourceUnavailable(f"{self._path}: {exc}") from exc
        if events_after is None:
            events_after = max((int(e["id"]) for e in state.get("events") or []), default=0)
        self._last_event = events_after
        self._state = state

    @property
    def exhausted(self) -> bool:
        """A simulated host runs until stopped."""
        return False

    def _read(self) -> dict[str, Any]:
        state = json.loads(self._path.read_text())
        if not isinstance(state, dict) or not isinstance(state.get("gpus"), list):
            raise ValueError("not a simulated host state file (no gpus list)")
        return state

    def _refresh(self) -> dict[str, Any]:
        try:
            self._state = self._read()
        except (OSError, ValueError) as exc:
            log.error("cannot read simulated host state %s: %s", self._path, exc)
        if self._state.get("nvml_error"):
            raise SourceError(
                f"NVML: {self._state['nvml_error']}",
                code=self._state.get("nvml_error_code") or None,
            )
        return self._state

    def inventory(self) -> Inventory:
        """The GPUs as NVML would list them now; SourceError when NVML does not initialise."""
        state = self._refresh()
        return Inventory(
            driver_version=state.get("driver_version") or None,
            cuda_version=state.get("cuda_version") or None,
            gpus=[
                lost_gpu(_gpu_inventory(gpu)) if gpu.get("lost") else _gpu_inventory(gpu)
                for gpu in state["gpus"]
            ],
        )

    def collect(self, now: datetime) -> list[Sample]:
        """One sample per GPU (and per MIG instance), stamped ``now``: an idle GPU."""
        state = self._refresh()
        ts = format_ts(now)
        samples: list[Sample] = []
        for gpu in state["gpus"]:
            if gpu.get("lost"):  # NVML: GpuIsLost, no sample
                continue
            sample = empty_sample(ts, gpu["uuid"])
            mig = gpu.get("mig_mode") == "enabled"
            sample["utilization_gpu_pct"] = None if mig else 0.0  # NVML: N/A in MIG mode
            sample["utilization_memory_pct"] = None if mig else 0.0
            sample["memory_used_bytes"] = 0
            sample["memory_total_bytes"] = gpu.get("memory_total_bytes")
            sample["temperature_c"] = 30.0
            sample["ecc_volatile_uncorrected"] = (gpu.get("health") or {}).get(
                "ecc_volatile_uncorrected"
            )
            samples.append(sample)
            for instance in gpu.get("instances") or [] if mig else []:
                mig_sample = empty_sample(ts, gpu["uuid"], int(instance["gpu_instance_id"]))
                mig_sample["memory_used_bytes"] = 0
                mig_sample["memory_total_bytes"] = instance.get("memory_total_bytes")
                samples.append(mig_sample)
        return samples

    def events(self) -> list[Event]:
        """Xid events logged since the last call."""
        out: list[Event] = []
        for event in self._state.get("events") or []:
            if int(event["id"]) > self._last_event:
                self._last_event = int(event["id"])
                out.append(
                    Event(
                        ts=event["ts"],
                        gpu_uuid=event["gpu_uuid"],
                        type="xid",
                        xid=int(event["xid"]),
                        message=event.get("message", ""),
                    )
                )
        return out

    def close(self) -> None:
        """Nothing to release."""


def _gpu_inventory(gpu: dict[str, Any]) -> GpuInventory:
    mig = gpu.get("mig_mode") == "enabled"
    health = dict(gpu.get("health") or {})
    health["mig_mode_pending"] = gpu.get("mig_mode_pending")
    health["gpu_is_lost"] = False  # read (a lost GPU is listed by base.lost_gpu)
    inventory = GpuInventory(
        uuid=gpu["uuid"],
        index=int(gpu["index"]),
        name=gpu.get("name") or "",
        pci_bus_id=gpu.get("pci_bus_id") or "",
        memory_total_bytes=gpu.get("memory_total_bytes"),
        mig_mode=gpu.get("mig_mode"),
        mig_devices=[
            MigDeviceInventory(
                uuid=instance.get("uuid"),
                gpu_instance_id=instance.get("gpu_instance_id"),
                compute_instance_id=0,
                memory_total_bytes=instance.get("memory_total_bytes"),
                multiprocessor_count=None,
                profile=instance.get("profile"),
                placement_start=instance.get("start"),
                placement_size=instance.get("size"),
            )
            for instance in (gpu.get("instances") or [] if mig else [])
        ],
        health=health,
        attributes={
            "simulated": True,
            # as the NVML source reports them (absent from state files written before)
            **{k: gpu[k] for k in ("architecture", "compute_capability") if gpu.get(k)},
        },
        # clears of released GPU instances on a shared host, as the host recorded them
        slice_scrubs=[dict(s) for s in gpu.get("slice_scrubs") or [] if isinstance(s, dict)],
    )
    fabric = gpu.get("fabric")
    if isinstance(fabric, dict):
        # the simulated GPU's fabric registration, as NVML's nvmlGpuFabricInfo_t gives it
        # (state/status as numbers, the cluster UUID as its 16 bytes in hex)
        inventory["fabric"] = fabric_from_nvml(
            SimpleNamespace(
                state=int(fabric.get("state", 0)),
                status=int(fabric.get("status", 0)),
                clusterUuid=bytes.fromhex(str(fabric.get("cluster_uuid_hex", "0" * 32))),
                cliqueId=int(fabric.get("clique_id", 0)),
            )
        )
    return inventory
