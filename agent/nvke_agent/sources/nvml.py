"""``nvml`` source: live GPU facts through NVML (``import pynvml``, package nvidia-ml-py).

Calls, units and errors follow shared/catalog/nvml.md (rows cited as "nvml.md §N"):

* Lifecycle (§1): ``nvmlInit`` loads ``libnvidia-ml.so.1``; failure (``NVMLError_LibraryNotFound``,
  ``DriverNotLoaded``, ``LibRmVersionMismatch`` …) becomes :class:`SourceUnavailable` carrying
  NVML's own message (``str(err)``, e.g. "NVML Shared Library Not Found").
* Inventory (§2, §4): ``nvmlDeviceGetCount``, ``…GetHandleByIndex``, ``…GetUUID``, ``…GetName``,
  ``…GetPciInfo().busId``, ``…GetMemoryInfo().total`` (bytes), ``…GetMigMode()[0]`` (current
  mode; ``NotSupported`` -> ``None``), MIG devices by ``…GetMaxMigDeviceCount`` +
  ``…GetMigDeviceHandleByIndex`` (``NotFound`` = empty slot, skipped), ``…GetGpuInstanceId``,
  ``…GetComputeInstanceId``, ``…GetAttributes().multiprocessorCount``, MIG ``UUID`` and memory.
* Samples (§3): ``…GetUtilizationRates`` (%; ``NotSupported`` on a MIG-enabled GPU -> ``None``),
  ``…GetMemoryInfo().used`` (bytes), ``…GetPowerUsage`` (mW), ``…GetTotalEnergyConsumption``
  (mJ since driver load), ``…GetTemperature(h, NVML_TEMPERATURE_GPU)`` (°C),
  ``…GetTotalEccErrors(h, UNCORRECTED, VOLATILE)`` (count); plus one sample per MIG device with
  its GI id and its own memory (utilization ``None``: NVML has none per MIG device).
* Every field call is wrapped: ``NotSupported``/``NoPermission`` (and ``FunctionNotFound``,
  an older driver, §1) give ``None`` for that field only. ``GpuIsLost`` ("fallen off the bus",
  §1) omits that GPU's sample, is logged, and the GPU is not polled again (it needs a reset);
  the other GPUs are still sampled. Node-level errors (``Uninitialized``, ``DriverNotLoaded``,
  ``LibRmVersionMismatch``, §1) abort the round with :class:`SourceError`.
* Xid events (§5): a daemon thread registers ``nvmlEventTypeXidCriticalError`` where
  ``nvmlDeviceGetSupportedEventTypes`` allows it and loops on ``nvmlEventSetWait_v2(set, ms)``;
  ``NVMLError_Timeout`` means no event. ``eventData`` is the Xid code; the GI/CI ids are
  ``0xFFFFFFFF`` when the event is not attributable to a MIG instance.

The ``pynvml`` module can be injected (``NvmlSource(nvml=module)``) so tests can run the real
code against a simulated GPU; production passes nothing and the real module is imported.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from types import ModuleType
from typing import Any, TypeVar

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
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# NVML leaves gpuInstanceId/computeInstanceId at 0xFFFFFFFF for events of a whole GPU (§5).
_NOT_A_MIG_INSTANCE = 0xFFFFFFFF

# Field-level errors: the feature is absent or hidden from us; store null, not 0 (nvml.md §1).
_FIELD_ERROR_NAMES = (
    "NVMLError_NotSupported",
    "NVMLError_NoPermission",
    "NVMLError_FunctionNotFound",
)
# Node-level errors: nothing on this host can be read right now (nvml.md §1, agent guidance).
_NODE_ERROR_NAMES = (
    "NVMLError_Uninitialized",
    "NVMLError_DriverNotLoaded",
    "NVMLError_LibRmVersionMismatch",
    "NVMLError_LibraryNotFound",
)


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
    ) -> None:
        """Initialise NVML; raises :class:`SourceUnavailable` with NVML's message on failure."""
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        self._field_errors = _classes(nvml, _FIELD_ERROR_NAMES)
        self._node_errors = _classes(nvml, _NODE_ERROR_NAMES)
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise SourceUnavailable(str(exc)) from exc
        self._closed = False
        self._lost: set[int] = set()  # indexes of GPUs that raised GpuIsLost
        self._warned: set[tuple[str, str]] = set()
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._event_wait_ms = event_wait_ms
        self._event_set: Any = None
        self._listener: threading.Thread | None = None
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
        """Current GPUs (lost ones left out) plus driver and CUDA driver versions."""
        nvml = self._nvml
        gpus: list[GpuInventory] = []
        with self._round():
            for index, handle in self._handles():
                try:
                    gpus.append(self._gpu_inventory(index, handle))
                except _SkipGpu:
                    continue
            driver = self._field("driver_version", nvml.nvmlSystemGetDriverVersion)
            cuda = self._field("cuda_version", nvml.nvmlSystemGetCudaDriverVersion)
        return Inventory(
            driver_version=_str(driver) if driver is not None else None,
            cuda_version=_cuda_version(cuda),
            gpus=gpus,
        )

    def _gpu_inventory(self, index: int, handle: Any) -> GpuInventory:
        nvml = self._nvml
        with self._gpu(index):
            uuid = _str(nvml.nvmlDeviceGetUUID(handle))
            name = self._field("name", nvml.nvmlDeviceGetName, handle)
            pci = self._field("pci", nvml.nvmlDeviceGetPciInfo, handle)
            memory = self._field("memory", nvml.nvmlDeviceGetMemoryInfo, handle)
            mig_mode = self._mig_mode(handle)
            migs = self._mig_inventory(handle) if mig_mode == "enabled" else []
        return GpuInventory(
            uuid=uuid,
            index=index,
            name=_str(name) if name is not None else "",
            pci_bus_id=_str(pci.busId) if pci is not None else "",
            memory_total_bytes=int(memory.total) if memory is not None else None,
            mig_mode=mig_mode,
            mig_devices=migs,
        )

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
            result.append(
                MigDeviceInventory(
                    uuid=_str(uuid) if uuid is not None else None,
                    gpu_instance_id=self._field("gi_id", nvml.nvmlDeviceGetGpuInstanceId, mig),
                    compute_instance_id=self._field(
                        "ci_id", nvml.nvmlDeviceGetComputeInstanceId, mig
                    ),
                    memory_total_bytes=int(memory.total) if memory is not None else None,
                    multiprocessor_count=(
                        int(attrs.multiprocessorCount) if attrs is not None else None
                    ),
                )
            )
        return result

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
            raise SourceError(f"NVML: {exc}") from exc


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
