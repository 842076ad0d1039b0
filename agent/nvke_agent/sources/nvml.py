"""``nvml`` source: live GPU facts through NVML (``import pynvml``, package nvidia-ml-py).

Calls, units and errors follow shared/catalog/nvml.md (rows cited as "nvml.md §N"):

* Lifecycle (§1): ``nvmlInit`` loads ``libnvidia-ml.so.1``; failure (``NVMLError_LibraryNotFound``,
  ``DriverNotLoaded``, ``LibRmVersionMismatch`` …) becomes :class:`SourceUnavailable` carrying
  NVML's own message (``str(err)``, e.g. "NVML Shared Library Not Found").
* Inventory (§2, §4): ``nvmlDeviceGetCount``, ``…GetHandleByIndex``, ``…GetUUID``, ``…GetName``,
  ``…GetPciInfo().busId``, ``…GetMemoryInfo().total`` (bytes), ``…GetMigMode()[0]`` (current
  mode; ``NotSupported`` -> ``None``), MIG devices by ``…GetMaxMigDeviceCount`` +
  ``…GetMigDeviceHandleByIndex`` (``NotFound`` = empty slot, skipped), ``…GetGpuInstanceId``,
  ``…GetComputeInstanceId``, ``…GetAttributes().multiprocessorCount``, MIG ``UUID`` and memory,
  and the GPU instance's profile (from the MIG device's name) and placement
  (``…GetGpuInstanceById`` + ``nvmlGpuInstanceGetInfo().placement``: start, size).
* Samples (§3): ``…GetUtilizationRates`` (%; ``NotSupported`` on a MIG-enabled GPU -> ``None``),
  ``…GetMemoryInfo().used`` (bytes), ``…GetPowerUsage`` (mW), ``…GetTotalEnergyConsumption``
  (mJ since driver load), ``…GetTemperature(h, NVML_TEMPERATURE_GPU)`` (°C),
  ``…GetTotalEccErrors(h, UNCORRECTED, VOLATILE)`` (count); plus one sample per MIG device with
  its GI id and its own memory (utilization ``None``: NVML has none per MIG device).
* More facts (§2, §3), all optional: ``…GetClockInfo`` (SM / memory clock, MHz),
  ``…GetCurrentClocksEventReasons`` (bit mask; older bindings ``…ThrottleReasons``), volatile
  *corrected* ECC count; per GPU in the inventory ``attributes`` (``…GetSerial``,
  ``…GetArchitecture``, ``…GetCudaComputeCapability``, ``…GetVbiosVersion``,
  ``…GetEnforcedPowerLimit`` / ``…PowerManagementDefaultLimit`` / ``…LimitConstraints`` (mW),
  ``…GetMaxClockInfo`` (MHz), active NVLinks by ``…GetNvLinkState``) and ``health``
  (aggregate uncorrected ECC, ``…GetRetiredPages`` per cause + ``…PendingStatus``,
  ``…GetRemappedRows``, pending MIG mode), and the host ``topology``: per GPU pair ``NV<n>``
  when ``…GetP2PStatus(…, NVML_P2P_CAPS_INDEX_NVLINK)`` is OK (n = links whose
  ``…GetNvLinkRemotePciInfo`` is the peer, else the GPU's active links: an NVSwitch), else the
  PCIe level of ``…GetTopologyCommonAncestor`` as ``nvidia-smi topo -m`` names it.
* Every field call is wrapped: ``NotSupported``/``NoPermission`` (and ``FunctionNotFound``,
  an older driver, §1) give ``None`` for that field only; a function the installed
  nvidia-ml-py lacks (nvml.md §7: check ``hasattr``) is ``None`` too. ``GpuIsLost``
  ("fallen off the bus", §1) omits that GPU's sample, is logged, and the GPU is not polled
  again (it needs a reset); the other GPUs are still sampled. The inventory keeps listing
  the lost GPU under the UUID (name, PCI bus id, memory) read before it was lost, with
  ``health`` ``{"gpu_is_lost": true}`` (:func:`~nvke_agent.sources.base.lost_gpu`); a
  readable GPU's health says ``"gpu_is_lost": false``. A GPU lost before this process read
  its UUID cannot be named and is left out. Node-level errors (``Uninitialized``,
  ``DriverNotLoaded``, ``LibRmVersionMismatch``, ``LibraryNotFound``, §1) abort the round
  with :class:`SourceError` whose ``code`` is NVML's name of the error
  (``NVML_ERROR_DRIVER_NOT_LOADED`` …): the report's ``source_error_code``.
* Xid events (§5): a daemon thread registers ``nvmlEventTypeXidCriticalError`` where
  ``nvmlDeviceGetSupportedEventTypes`` allows it and loops on ``nvmlEventSetWait_v2(set, ms)``;
  ``NVMLError_Timeout`` means no event. ``eventData`` is the Xid code; the GI/CI ids are
  ``0xFFFFFFFF`` when the event is not attributable to a MIG instance.

The ``pynvml`` module can be injected (``NvmlSource(nvml=module)``) so tests can run the real
code against a simulated GPU; production passes nothing and the real module is imported.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import re
import subprocess
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from types import ModuleType
from typing import Any, TypeVar

from nvke_agent.commands import run_command
from nvke_agent.fabric import GpuFabric, fabric_from_nvml
from nvke_agent.slice_scrubs import read_records
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

T = TypeVar("T")

# NVML leaves gpuInstanceId/computeInstanceId at 0xFFFFFFFF for events of a whole GPU (§5).
_NOT_A_MIG_INSTANCE = 0xFFFFFFFF

#: nvmlDeviceGetArchitecture values (nvml.md §2)
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}
#: nvmlDeviceGetTopologyCommonAncestor levels as nvidia-smi topo -m names them (nvml.md §3)
NVML_LEVEL_TO_LINK = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

# Field-level errors: the feature is absent or hidden from us; store null, not 0 (nvml.md §1).
_FIELD_ERROR_NAMES = (
    "NVMLError_NotSupported",
    "NVMLError_NoPermission",
    "NVMLError_FunctionNotFound",
)
# Node-level errors: nothing on this host can be read right now (nvml.md §1, agent guidance),
# with NVML's name of each (nvml.h ``nvmlReturn_t``): the report's ``source_error_code``
_NODE_ERROR_CODES = {
    "NVMLError_Uninitialized": "NVML_ERROR_UNINITIALIZED",
    "NVMLError_DriverNotLoaded": "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVMLError_LibRmVersionMismatch": "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "NVMLError_LibraryNotFound": "NVML_ERROR_LIBRARY_NOT_FOUND",
}
_NODE_ERROR_NAMES = tuple(_NODE_ERROR_CODES)


class _SkipGpu(Exception):
    """Internal: the GPU being read cannot be read this round (lost, or its UUID failed)."""


class NvmlSource:
    """Live source over NVML (see module docstring)."""

    name = "nvml"

    def __init__(
        self,
        *,
        nvml: ModuleType | Any | None = None,
        xid_events: bool = True,
        event_wait_ms: int = 1000,
        runner: Callable[[Any], Any] | None = None,
        slice_scrub_dir: str | None = None,
    ) -> None:
        """Initialise NVML; raises :class:`SourceUnavailable` with NVML's message on failure.

        ``slice_scrub_dir``: on a shared (hypervisor) host, where the clear tool records the
        memory clears of released GPU instances (:mod:`nvke_agent.slice_scrubs`)."""
        self._slice_scrub_dir = slice_scrub_dir
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        self._runner = runner or run_command
        self._field_errors = _classes(nvml, _FIELD_ERROR_NAMES)
        self._node_errors = _classes(nvml, _NODE_ERROR_NAMES)
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise SourceUnavailable(str(exc)) from exc
        self._closed = False
        self._lost: set[int] = set()  # indexes of GPUs that raised GpuIsLost
        #: index -> the GPU as last read (its UUID at least): how a lost GPU is still listed
        self._known: dict[int, GpuInventory] = {}
        self._warned: set[tuple[str, str]] = set()
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._event_wait_ms = event_wait_ms
        self._event_set: Any = None
        self._listener: threading.Thread | None = None
        self._topology: dict[str, Any] | None = None  # read once: links do not change
        if xid_events:
            try:
                self._start_xid_listener()
            except nvml.NVMLError as exc:
                log.warning("Xid events unavailable: %s", exc)

    @property
    def exhausted(self) -> bool:
        """A live GPU never runs out."""
        return False

    # --- inventory ----------------------------------------------------------------------------

    def inventory(self) -> Inventory:
        """Current GPUs plus driver and CUDA driver versions; a lost GPU whose UUID was read
        before is listed as lost (:func:`~nvke_agent.sources.base.lost_gpu`)."""
        nvml = self._nvml
        gpus: list[GpuInventory] = []
        with self._round():
            handles = self._handles()
            for index, handle in handles:
                try:
                    gpus.append(self._gpu_inventory(index, handle))
                except _SkipGpu:
                    continue
            driver = self._field("driver_version", nvml.nvmlSystemGetDriverVersion)
            cuda = self._field("cuda_version", nvml.nvmlSystemGetCudaDriverVersion)
            if self._topology is None and len(gpus) == len(handles):
                try:
                    self._topology = self.topology(handles) or {}
                except nvml.NVMLError as exc:
                    if isinstance(exc, self._node_errors):
                        raise
                    log.warning("GPU topology unavailable: %s", exc)
                    self._topology = {}
        lost = [lost_gpu(self._known[i]) for i in sorted(self._lost) if i in self._known]
        inventory = Inventory(
            driver_version=_str(driver) if driver is not None else None,
            cuda_version=_cuda_version(cuda),
            gpus=sorted(gpus + lost, key=lambda g: g["index"]),
        )
        if self._topology:
            inventory["topology"] = self._topology
        return inventory

    def _gpu_inventory(self, index: int, handle: Any) -> GpuInventory:
        nvml = self._nvml
        with self._gpu(index):
            uuid = _str(nvml.nvmlDeviceGetUUID(handle))
            name = self._field("name", nvml.nvmlDeviceGetName, handle)
            pci = self._field("pci", nvml.nvmlDeviceGetPciInfo, handle)
            memory = self._field("memory", nvml.nvmlDeviceGetMemoryInfo, handle)
            modes = self._field("mig_mode", nvml.nvmlDeviceGetMigMode, handle)
            mig_mode = self._mode_name(modes[0]) if modes is not None else None
            migs = self._mig_inventory(handle) if mig_mode == "enabled" else []
            health = self._health(handle, mig_mode, modes)
            attributes = self._attributes(handle)
            fabric = self._fabric(handle)
        inventory = GpuInventory(
            uuid=uuid,
            index=index,
            name=_str(name) if name is not None else "",
            pci_bus_id=_str(pci.busId) if pci is not None else "",
            memory_total_bytes=int(memory.total) if memory is not None else None,
            mig_mode=mig_mode,
            mig_devices=migs,
            health=health,
            attributes=attributes,
        )
        self._known[index] = inventory
        if self._slice_scrub_dir:
            inventory["slice_scrubs"] = read_records(self._slice_scrub_dir, uuid)
        if fabric is not None:
            inventory["fabric"] = fabric
        return inventory

    def _fabric(self, handle: Any) -> GpuFabric | None:
        """The GPU's fabric info (multi-node NVLink; :mod:`nvke_agent.fabric`), or None where
        NVML has no such call or the GPU does not support it. ``nvmlDeviceGetGpuFabricInfoV``
        with the ``nvmlGpuFabricInfo_v2`` struct where the bindings have it, else the older
        ``nvmlDeviceGetGpuFabricInfo``."""
        nvml = self._nvml
        for struct_name, fn_name in (
            ("c_nvmlGpuFabricInfoV_t", "nvmlDeviceGetGpuFabricInfoV"),
            ("c_nvmlGpuFabricInfo_t", "nvmlDeviceGetGpuFabricInfo"),
        ):
            struct, fn = getattr(nvml, struct_name, None), getattr(nvml, fn_name, None)
            if struct is None or fn is None:
                continue
            info = struct()
            if hasattr(info, "version"):
                info.version = getattr(nvml, "nvmlGpuFabricInfo_v2", 0x02000024)
            if self._field("fabric", fn, handle, ctypes.byref(info)) is None:
                return None
            try:
                return fabric_from_nvml(info)
            except ValueError as exc:
                log.warning("NVML fabric info: %s (reported as null)", exc)
                return None
        return None

    def _mode_name(self, mode: int) -> str:
        return "enabled" if mode == self._nvml.NVML_DEVICE_MIG_ENABLE else "disabled"

    def _optional(self, what: str, name: str, *args: Any) -> Any:
        """:meth:`_field` for a function older nvidia-ml-py releases may not have."""
        fn = getattr(self._nvml, name, None)
        if fn is None:
            return None
        return self._field(what, fn, *args)

    def _health(self, handle: Any, mig_mode: str | None, modes: Any) -> dict[str, Any]:
        nvml = self._nvml
        uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        sbe = self._optional(
            "retired_pages_sbe",
            "nvmlDeviceGetRetiredPages",
            handle,
            getattr(nvml, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
        )
        dbe = self._optional(
            "retired_pages_dbe",
            "nvmlDeviceGetRetiredPages",
            handle,
            getattr(nvml, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1),
        )
        pending = self._optional(
            "retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", handle
        )
        remapped = self._optional("remapped_rows", "nvmlDeviceGetRemappedRows", handle)
        return {
            "reset_required": None,
            "drain_and_reset_recommended": None,
            "ecc_volatile_uncorrected": self._optional(
                "ecc",
                "nvmlDeviceGetTotalEccErrors",
                handle,
                uncorrected,
                getattr(nvml, "NVML_VOLATILE_ECC", 0),
            ),
            "ecc_aggregate_uncorrected": self._optional(
                "ecc_aggregate",
                "nvmlDeviceGetTotalEccErrors",
                handle,
                uncorrected,
                getattr(nvml, "NVML_AGGREGATE_ECC", 1),
            ),
            "retired_pages_sbe": len(sbe) if sbe is not None else None,
            "retired_pages_dbe": len(dbe) if dbe is not None else None,
            "retired_pages_pending": bool(pending) if pending is not None else None,
            "remapped_rows_correctable": int(remapped[0]) if remapped is not None else None,
            "remapped_rows_uncorrectable": int(remapped[1]) if remapped is not None else None,
            "remapped_rows_pending": bool(remapped[2]) if remapped is not None else None,
            "remapped_rows_failure": bool(remapped[3]) if remapped is not None else None,
            "mig_mode_pending": self._mode_name(modes[1]) if modes is not None else None,
            "gpu_recovery_action": self._recovery_action(handle),
            "gpu_is_lost": False,  # read just now (a lost GPU: base.lost_gpu)
        }

    def _recovery_action(self, handle: Any) -> int | None:
        """NVIDIA's recovery action for the GPU (Xid 154's field, nvml.md §3 bulk fields):
        0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset (xid.yaml)."""
        nvml = self._nvml
        field_id = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230)
        values = self._optional("recovery_action", "nvmlDeviceGetFieldValues", handle, [field_id])
        if not values:
            return None
        value = values[0]
        if getattr(value, "nvmlReturn", 1) != getattr(nvml, "NVML_SUCCESS", 0):
            return None  # per-field NotSupported and friends come back here, not as exceptions
        return int(value.value.uiVal)

    def _attributes(self, handle: Any) -> dict[str, Any]:
        nvml = self._nvml
        serial = self._optional("serial", "nvmlDeviceGetSerial", handle)
        arch = self._optional("architecture", "nvmlDeviceGetArchitecture", handle)
        cc = self._optional("compute_capability", "nvmlDeviceGetCudaComputeCapability", handle)
        vbios = self._optional("vbios", "nvmlDeviceGetVbiosVersion", handle)
        limits = self._optional(
            "power_limits", "nvmlDeviceGetPowerManagementLimitConstraints", handle
        )
        return {
            "serial": _str(serial) if serial else None,
            "architecture": ARCHITECTURES.get(arch) if arch is not None else None,
            "compute_capability": f"{cc[0]}.{cc[1]}" if cc is not None else None,
            "vbios_version": _str(vbios) if vbios else None,
            "power_limit_mw": self._optional(
                "power_limit", "nvmlDeviceGetEnforcedPowerLimit", handle
            ),
            "power_limit_default_mw": self._optional(
                "power_limit_default", "nvmlDeviceGetPowerManagementDefaultLimit", handle
            ),
            "power_limit_max_mw": int(limits[1]) if limits is not None else None,
            "max_sm_clock_mhz": self._optional(
                "max_sm_clock",
                "nvmlDeviceGetMaxClockInfo",
                handle,
                getattr(nvml, "NVML_CLOCK_SM", 1),
            ),
            "max_memory_clock_mhz": self._optional(
                "max_mem_clock",
                "nvmlDeviceGetMaxClockInfo",
                handle,
                getattr(nvml, "NVML_CLOCK_MEM", 2),
            ),
            "nvlink_links_active": self._nvlink_links(handle),
        }

    def _nvlink_links(self, handle: Any) -> int | None:
        """Active NVLinks of a GPU: iterate links until NotSupported/InvalidArgument (§3)."""
        nvml = self._nvml
        fn = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
        if fn is None:
            return None
        active = 0
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if fn(handle, link) == getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                    active += 1
            except nvml.NVMLError as exc:
                if isinstance(exc, (nvml.NVMLError_GpuIsLost, *self._node_errors)):
                    raise
                if link == 0:
                    return None  # no NVLink on this GPU
                break
        return active

    def topology(self, handles: list[tuple[int, Any]]) -> dict[str, Any] | None:
        """The link matrix of the GPUs (see module docstring), or None when unknowable."""
        nvml = self._nvml
        p2p = getattr(nvml, "nvmlDeviceGetP2PStatus", None)
        ancestor = getattr(nvml, "nvmlDeviceGetTopologyCommonAncestor", None)
        if ancestor is None and p2p is None:
            return None
        n = len(handles)
        if n == 0 or [i for i, _ in handles] != list(range(n)):
            return None  # a lost GPU: the matrix would not match the host's indexes
        buses = []
        for _i, h in handles:
            pci = self._field("pci", nvml.nvmlDeviceGetPciInfo, h)
            buses.append(_str(pci.busId).lower() if pci is not None else None)
        links: list[list[str]] = [["X"] * n for _ in range(n)]
        for i, hi in handles:
            remote = self._remote_buses(hi)
            for j, hj in handles:
                if i == j:
                    continue
                cell = None
                if p2p is not None:
                    status = self._field(
                        "p2p_nvlink", p2p, hi, hj, getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 4)
                    )
                    if status is not None and status == getattr(nvml, "NVML_P2P_STATUS_OK", 0):
                        direct = sum(1 for bus in remote if bus and bus == buses[j])
                        cell = f"NV{direct or len(remote) or 1}"
                if cell is None and ancestor is not None:
                    level = self._field("topology", ancestor, hi, hj)
                    cell = NVML_LEVEL_TO_LINK.get(level) if level is not None else None
                if cell is None:
                    return None
                links[i][j] = cell
        return {"links": links}

    def _remote_buses(self, handle: Any) -> list[str | None]:
        """PCI bus ids at the far end of each active NVLink of ``handle``."""
        nvml = self._nvml
        state = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
        remote = getattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", None)
        if state is None or remote is None:
            return []
        out: list[str | None] = []
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if state(handle, link) != getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                    continue
                out.append(_str(remote(handle, link).busId).lower())
            except nvml.NVMLError as exc:
                if isinstance(exc, (nvml.NVMLError_GpuIsLost, *self._node_errors)):
                    raise
                break
        return out

    def _mig_mode(self, handle: Any) -> str | None:
        mode = self._field("mig_mode", self._nvml.nvmlDeviceGetMigMode, handle)
        if mode is None:
            return None
        current = mode[0]
        return "enabled" if current == self._nvml.NVML_DEVICE_MIG_ENABLE else "disabled"

    def _mig_handles(self, handle: Any) -> list[Any]:
        nvml = self._nvml
        count = self._field("max_mig_devices", nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        handles = []
        for i in range(count):
            try:
                handles.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
            except nvml.NVMLError_NotFound:
                continue  # empty slot (nvml.md §4)
            except self._field_errors:
                continue
        return handles

    def _mig_inventory(self, handle: Any) -> list[MigDeviceInventory]:
        nvml = self._nvml
        result: list[MigDeviceInventory] = []
        for mig in self._mig_handles(handle):
            uuid = self._field("mig_uuid", nvml.nvmlDeviceGetUUID, mig)
            memory = self._field("mig_memory", nvml.nvmlDeviceGetMemoryInfo, mig)
            attrs = self._field("mig_attributes", nvml.nvmlDeviceGetAttributes, mig)
            gi_id = self._field("gi_id", nvml.nvmlDeviceGetGpuInstanceId, mig)
            device = MigDeviceInventory(
                uuid=_str(uuid) if uuid is not None else None,
                gpu_instance_id=gi_id,
                compute_instance_id=self._field("ci_id", nvml.nvmlDeviceGetComputeInstanceId, mig),
                memory_total_bytes=int(memory.total) if memory is not None else None,
                multiprocessor_count=(
                    int(attrs.multiprocessorCount) if attrs is not None else None
                ),
            )
            device.update(self._mig_placement(handle, mig, gi_id))
            result.append(device)
        return result

    def _mig_placement(self, handle: Any, mig: Any, gi_id: int | None) -> dict[str, Any]:
        """``profile`` / ``placement_start`` / ``placement_size`` of a MIG device: the profile
        from the MIG device's NVML name (``"NVIDIA H100 80GB HBM3 MIG 1g.10gb"``, as
        ``nvidia-smi -L`` prints it), the placement from ``nvmlGpuInstanceGetInfo`` of its GPU
        instance (``nvmlDeviceGetGpuInstanceById``). Each is None where NVML refuses it (not
        verified on a MIG GPU on this project's machines: none has one)."""
        name = self._field("mig_name", self._nvml.nvmlDeviceGetName, mig)
        match = re.search(r"MIG (\S+)$", _str(name)) if name is not None else None
        start = size = None
        if gi_id is not None:
            instance = self._optional(
                "gpu_instance", "nvmlDeviceGetGpuInstanceById", handle, int(gi_id)
            )
            info = (
                self._optional("gpu_instance_info", "nvmlGpuInstanceGetInfo", instance)
                if instance is not None
                else None
            )
            placement = getattr(info, "placement", None)
            if placement is not None:
                start, size = int(placement.start), int(placement.size)
        return {
            "profile": match.group(1) if match else None,
            "placement_start": start,
            "placement_size": size,
        }

    # --- samples ------------------------------------------------------------------------------

    def collect(self, now: datetime) -> list[Sample]:
        """One sample per GPU and per MIG device, stamped ``now``; lost GPUs are left out."""
        ts = format_ts(now)
        samples: list[Sample] = []
        with self._round():
            for index, handle in self._handles():
                try:
                    samples.extend(self._gpu_samples(index, handle, ts))
                except _SkipGpu:
                    continue
        return samples

    def _gpu_samples(self, index: int, handle: Any, ts: str) -> list[Sample]:
        nvml = self._nvml
        with self._gpu(index):
            uuid = _str(nvml.nvmlDeviceGetUUID(handle))
            if self._known.get(index, {}).get("uuid") != uuid:  # named, should it be lost
                self._known[index] = GpuInventory(
                    uuid=uuid,
                    index=index,
                    name="",
                    pci_bus_id="",
                    memory_total_bytes=None,
                    mig_mode=None,
                    mig_devices=[],
                )
            sample = empty_sample(ts, uuid)
            utilization = self._field("utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
            if utilization is not None:
                sample["utilization_gpu_pct"] = float(utilization.gpu)
                sample["utilization_memory_pct"] = float(utilization.memory)
            memory = self._field("memory", nvml.nvmlDeviceGetMemoryInfo, handle)
            if memory is not None:
                sample["memory_used_bytes"] = int(memory.used)
                sample["memory_total_bytes"] = int(memory.total)
            sample["power_mw"] = self._field("power", nvml.nvmlDeviceGetPowerUsage, handle)
            sample["energy_mj"] = self._field(
                "energy", nvml.nvmlDeviceGetTotalEnergyConsumption, handle
            )
            temperature = self._field(
                "temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
            )
            sample["temperature_c"] = float(temperature) if temperature is not None else None
            sample["ecc_volatile_uncorrected"] = self._field(
                "ecc",
                nvml.nvmlDeviceGetTotalEccErrors,
                handle,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            )
            sample["ecc_volatile_corrected"] = self._optional(
                "ecc_corrected",
                "nvmlDeviceGetTotalEccErrors",
                handle,
                getattr(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0),
                nvml.NVML_VOLATILE_ECC,
            )
            sample["sm_clock_mhz"] = self._optional(
                "sm_clock", "nvmlDeviceGetClockInfo", handle, getattr(nvml, "NVML_CLOCK_SM", 1)
            )
            sample["memory_clock_mhz"] = self._optional(
                "mem_clock", "nvmlDeviceGetClockInfo", handle, getattr(nvml, "NVML_CLOCK_MEM", 2)
            )
            reasons_fn = (
                "nvmlDeviceGetCurrentClocksEventReasons"
                if hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons")
                else "nvmlDeviceGetCurrentClocksThrottleReasons"
            )
            sample["clocks_event_reasons"] = self._optional("clock_reasons", reasons_fn, handle)
            samples = [sample]
            if self._mig_mode(handle) == "enabled":
                for mig in self._mig_handles(handle):
                    gi = self._field("gi_id", nvml.nvmlDeviceGetGpuInstanceId, mig)
                    if gi is None:
                        continue
                    mig_sample = empty_sample(ts, uuid, int(gi))
                    mig_memory = self._field("mig_memory", nvml.nvmlDeviceGetMemoryInfo, mig)
                    if mig_memory is not None:
                        mig_sample["memory_used_bytes"] = int(mig_memory.used)
                        mig_sample["memory_total_bytes"] = int(mig_memory.total)
                    samples.append(mig_sample)
        return samples

    # --- events -------------------------------------------------------------------------------

    def events(self) -> list[Event]:
        """Drain the Xid events the listener thread has queued."""
        drained: list[Event] = []
        while True:
            try:
                drained.append(self._events.get_nowait())
            except queue.Empty:
                return drained

    def _start_xid_listener(self) -> None:
        nvml = self._nvml
        xid_bit = getattr(nvml, "nvmlEventTypeXidCriticalError", 0x8)
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.warning("Xid events unavailable: nvmlEventSetCreate failed: %s", exc)
            return
        registered = 0
        for index, handle in self._handles():
            try:
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
                if supported & xid_bit:
                    nvml.nvmlDeviceRegisterEvents(handle, xid_bit, event_set)
                    registered += 1
                else:
                    log.warning("GPU %d does not support Xid events", index)
            except nvml.NVMLError as exc:
                # NotSupported here means "device too old for health checks" (nvml.md §5).
                log.warning("GPU %d: cannot register Xid events: %s", index, exc)
        if not registered:
            nvml.nvmlEventSetFree(event_set)
            return
        self._event_set = event_set
        self._listener = threading.Thread(
            target=self._listen, args=(event_set, xid_bit), name="nvml-xid", daemon=True
        )
        self._listener.start()

    def _listen(self, event_set: Any, xid_bit: int) -> None:
        nvml = self._nvml
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(event_set, self._event_wait_ms)
            except nvml.NVMLError_Timeout:
                continue  # no event within the wait
            except nvml.NVMLError as exc:
                # GpuIsLost is raised here when a GPU falls off the bus (nvml.md §5).
                log.error("waiting for NVML events failed: %s", exc)
                self._stop.wait(self._event_wait_ms / 1000)
                continue
            if not data.eventType & xid_bit:
                continue
            self._events.put(self._xid_event(data))

    def _xid_event(self, data: Any) -> Event:
        nvml = self._nvml
        try:
            uuid = _str(nvml.nvmlDeviceGetUUID(data.device))
        except nvml.NVMLError as exc:
            log.error("Xid %d on a GPU whose UUID cannot be read: %s", data.eventData, exc)
            uuid = "unknown"
        xid = int(data.eventData)
        message = f"Xid {xid}" if xid != 999 else "Xid 999 (unknown Xid)"
        gi = getattr(data, "gpuInstanceId", _NOT_A_MIG_INSTANCE)
        ci = getattr(data, "computeInstanceId", _NOT_A_MIG_INSTANCE)
        if gi != _NOT_A_MIG_INSTANCE:
            message += f" on MIG GPU instance {gi}"
            if ci != _NOT_A_MIG_INSTANCE:
                message += f" compute instance {ci}"
        log.warning("Xid event", extra={"fields": {"gpu_uuid": uuid, "xid": xid}})
        return Event(
            ts=format_ts(datetime.now(UTC)),
            gpu_uuid=uuid,
            type="xid",
            xid=xid,
            message=message,
        )

    # --- scrub (nvke_agent.commands) -----------------------------------------------------------

    def scrub(self, command: dict[str, Any]) -> dict[str, Any]:
        """Tear down MIG, reset the GPU and check nothing is left on it (see commands.py).

        The GPU is found by UUID (NVML indexes can differ from the server's record); the steps
        stop at the first failure. Runs on the command thread: NVML is thread-safe.
        """
        nvml = self._nvml
        uuid = str(command.get("gpu_uuid"))
        steps: list[dict[str, Any]] = []
        index = None
        for i, handle in self._handles():
            try:
                if _str(nvml.nvmlDeviceGetUUID(handle)) == uuid:
                    index = i
                    break
            except nvml.NVMLError:
                continue
        ok = index is not None
        if index is None:
            steps.append({"step": "find_gpu", "status": "failed", "detail": f"{uuid} not found"})
        for step in command.get("steps") or [] if ok else []:
            if step == "mig_teardown":
                result = self._run_steps(
                    [
                        ["nvidia-smi", "mig", "-dci", "-i", str(index)],
                        ["nvidia-smi", "mig", "-dgi", "-i", str(index)],
                    ],
                    none_left=("not found", "no compute instance", "no gpu instance"),
                )
            elif step == "gpu_reset":
                result = self._run_steps([["nvidia-smi", "--gpu-reset", "-i", str(index)]])
            elif step == "memory_clear":
                result = self._memory_check(index)  # type: ignore[arg-type]
            else:
                result = ("skipped", f"unknown step {step!r}")
            steps.append({"step": step, "status": result[0], "detail": result[1][:500]})
            if result[0] == "failed":
                ok = False
                break
        return {
            "scrub_id": command["scrub_id"],
            "gpu_uuid": uuid,
            "ok": ok,
            "executor": "nvke-agent nvml",
            "steps": steps,
        }

    def _run_steps(
        self, commands: list[list[str]], none_left: tuple[str, ...] = ()
    ) -> tuple[str, str]:
        details = []
        for args in commands:
            try:
                done = self._runner(args)
            except (OSError, subprocess.SubprocessError) as exc:
                return "failed", f"{' '.join(args)}: {exc}"
            output = (done.stdout + done.stderr).strip()
            if done.returncode != 0 and not any(t in output.lower() for t in none_left):
                return "failed", f"{' '.join(args)} exited {done.returncode}: {output[-300:]}"
            details.append(f"{' '.join(args)}: {output[-120:] or 'ok'}")
        return "ok", "; ".join(details)

    def _memory_check(self, index: int) -> tuple[str, str]:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            processes = self._field("processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle)
            memory = self._field("memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        except nvml.NVMLError as exc:
            return "failed", f"NVML: {exc}"
        used = f"{int(memory.used) // 2**20} MiB used" if memory is not None else "memory N/A"
        if processes is None:
            return "failed", f"cannot list the processes on the GPU; {used}"
        if processes:
            pids = ", ".join(str(getattr(p, "pid", "?")) for p in processes)
            return "failed", f"processes still on the GPU: {pids}; {used}"
        return "ok", f"no process on the GPU; {used}"

    # --- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the Xid listener, free the event set and shut NVML down (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._listener is not None:
            self._listener.join(timeout=self._event_wait_ms / 1000 + 5)
        nvml = self._nvml
        try:
            if self._event_set is not None:
                nvml.nvmlEventSetFree(self._event_set)
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.warning("NVML shutdown: %s", exc)

    # --- helpers ------------------------------------------------------------------------------

    def _handles(self) -> list[tuple[int, Any]]:
        nvml = self._nvml
        handles = []
        for index in range(nvml.nvmlDeviceGetCount()):
            if index in self._lost:
                continue
            try:
                handles.append((index, nvml.nvmlDeviceGetHandleByIndex(index)))
            except nvml.NVMLError_GpuIsLost:
                self._mark_lost(index)
            except nvml.NVMLError as exc:
                if isinstance(exc, self._node_errors):
                    raise
                log.error("GPU %d: no handle: %s", index, exc)
        return handles

    def _round(self) -> _Round:
        return _Round(self._nvml, self._node_errors)

    def _gpu(self, index: int) -> _PerGpu:
        return _PerGpu(self, index)

    def _mark_lost(self, index: int) -> None:
        if index not in self._lost:
            self._lost.add(index)
            log.error(
                "GPU %d is lost (fallen off the bus or otherwise inaccessible); "
                "no longer sampled until the agent restarts",
                index,
                extra={"fields": {"gpu_index": index, "nvml_error": "GpuIsLost"}},
            )

    def _field(self, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """Call one NVML getter; an error of that field alone gives ``None``.

        ``NotSupported``/``NoPermission``/``FunctionNotFound`` are expected (logged once per
        field at INFO); other errors (``Unknown``, ``NoData`` …) are logged once per field as
        warnings. ``GpuIsLost`` and node-level errors propagate.
        """
        nvml = self._nvml
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            if isinstance(exc, (nvml.NVMLError_GpuIsLost, *self._node_errors)):
                raise
            key = (what, type(exc).__name__)
            if key not in self._warned:
                self._warned.add(key)
                level = logging.INFO if isinstance(exc, self._field_errors) else logging.WARNING
                log.log(level, "NVML %s: %s (reported as null)", what, exc)
            return None


class _Round:
    """Context manager: node-level NVML errors become :class:`SourceError`."""

    def __init__(self, nvml: Any, node_errors: tuple[type[BaseException], ...]) -> None:
        self._nvml = nvml
        self._node_errors = node_errors

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None and isinstance(exc, self._node_errors):
            code = next(
                (
                    code
                    for name, code in _NODE_ERROR_CODES.items()
                    if isinstance(exc, getattr(self._nvml, name, ()))
                ),
                None,
            )
            raise SourceError(f"NVML: {exc}", code=code) from exc


class _PerGpu:
    """Context manager for reading one GPU.

    ``GpuIsLost`` marks the GPU lost; it and any other GPU-level NVML error (its UUID cannot be
    read) raise :class:`_SkipGpu` so the other GPUs are still read. Node-level errors pass.
    """

    def __init__(self, source: NvmlSource, index: int) -> None:
        self._source = source
        self._index = index

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        source = self._source
        nvml = source._nvml
        if exc is None or not isinstance(exc, nvml.NVMLError):
            return
        if isinstance(exc, source._node_errors):
            return
        if isinstance(exc, nvml.NVMLError_GpuIsLost):
            source._mark_lost(self._index)
        else:
            log.error("GPU %d skipped this round: %s", self._index, exc)
        raise _SkipGpu() from exc


def _classes(nvml: Any, names: tuple[str, ...]) -> tuple[type[BaseException], ...]:
    # Older bindings may lack a class; getattr keeps us working with them (nvml.md §1).
    return tuple(cls for name in names if (cls := getattr(nvml, name, None)) is not None)


def _str(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(value: int | None) -> str | None:
    """``12040`` -> ``"12.4"`` (NVML_CUDA_DRIVER_VERSION_MAJOR/MINOR, nvml.md §2)."""
    if value is None:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"
