"""The ``nvml`` source against a simulated GPU.

This machine has no GPU, so these tests hand :class:`NvmlSource` a *simulated* ``pynvml``:
a module-shaped object implementing the handful of NVML functions the agent calls, backed by
in-memory GPUs, and raising the **real** exception classes of nvidia-ml-py
(``pynvml.NVMLError_NotSupported``, ``NVMLError_GpuIsLost`` …) exactly where NVML documents
them (shared/catalog/nvml.md). This simulates the GPU, not our code: every line of
``nvke_agent.sources.nvml`` runs as it would on a host. The last test runs the CLI with the
real pynvml on this GPU-less machine.
"""

from __future__ import annotations

import ctypes
import os
import queue
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from nvke_agent.sources.base import SourceError, SourceUnavailable, format_ts
from nvke_agent.sources.nvml import NvmlSource

MiB = 2**20
NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


@dataclass
class SimMig:
    gi: int
    ci: int
    uuid: str
    total: int
    used: int
    sm_count: int
    #: the GPU instance's profile and placement (memory slices), as nvidia-smi mig -lgi says
    profile: str = "1g.20gb"
    start: int = 0
    size: int = 2


@dataclass
class SimGpu:
    """One simulated GPU. A value that is an exception class is raised by its getter."""

    uuid: str
    name: str
    bus_id: str
    total: int
    used: int
    utilization: tuple[int, int] | type[Exception] = (0, 0)
    power_mw: int | type[Exception] = 100_000
    energy_mj: int | type[Exception] = 5_000_000
    temperature_c: int | type[Exception] = 40
    ecc: int | type[Exception] = 0
    mig: bool | type[Exception] = pynvml.NVMLError_NotSupported  # no MIG on this GPU
    mig_slots: list[SimMig | None] = field(default_factory=list)
    lost: bool = False
    calls: int = 0
    # facts added for the inventory's health / attributes and the samples' extra fields
    ecc_corrected: int | type[Exception] = 3
    ecc_aggregate: int | type[Exception] = 0
    serial: str | type[Exception] = pynvml.NVMLError_NotSupported
    architecture: int | type[Exception] = 7  # NVML_DEVICE_ARCH_AMPERE
    compute_capability: tuple[int, int] | type[Exception] = (8, 0)
    vbios: str | type[Exception] = "92.00.36.00.02"
    power_limit_mw: int | type[Exception] = 400_000
    power_limit_constraints: tuple[int, int] | type[Exception] = (100_000, 400_000)
    clocks: dict[int, int] = field(default_factory=lambda: {1: 1410, 2: 1593})  # SM, MEM MHz
    max_clocks: dict[int, int] = field(default_factory=lambda: {1: 1410, 2: 1593})
    clock_reasons: int | type[Exception] = 0x1  # GpuIdle
    retired_pages: list[int] | type[Exception] = pynvml.NVMLError_NotSupported  # Ampere: rows
    retired_pending: int | type[Exception] = pynvml.NVMLError_NotSupported
    remapped_rows: tuple[int, int, int, int] | type[Exception] = (0, 0, 0, 0)
    #: PCI bus id at the far end of each active NVLink (empty: the GPU has no NVLink)
    nvlinks: list[str] = field(default_factory=list)
    recovery_action: int | None = 0  # NVML field 230; None: the field returns NotSupported


class SimulatedNvml:
    """A ``pynvml``-shaped module over :class:`SimGpu` objects (handles are the objects)."""

    def __init__(self, gpus: list[SimGpu], *, init_error: type[Exception] | None = None) -> None:
        # The real error classes and constants of nvidia-ml-py.
        for name in dir(pynvml):
            if name.startswith(("NVMLError", "NVML_", "nvmlEventType", "nvmlClocks")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.init_error = init_error
        self.count_error: type[Exception] | None = None
        self.events: queue.Queue[Any] = queue.Queue()
        self.registered: list[tuple[SimGpu, int]] = []
        self.shutdown_called = False
        self.event_set_freed = False

    # lifecycle
    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error()

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    # devices
    def nvmlDeviceGetCount(self) -> int:
        if self.count_error:
            raise self.count_error()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimGpu:
        return self.gpus[index]

    def _gpu(self, handle: SimGpu) -> SimGpu:
        handle.calls += 1
        if handle.lost:
            raise pynvml.NVMLError_GpuIsLost()
        return handle

    @staticmethod
    def _value(value: Any) -> Any:
        if isinstance(value, type) and issubclass(value, Exception):
            raise value()
        return value

    def nvmlDeviceGetUUID(self, handle: SimGpu | SimMig) -> str:
        if isinstance(handle, SimMig):
            return handle.uuid
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: SimGpu | SimMig) -> str:
        if isinstance(handle, SimMig):  # NVML names a MIG device "<GPU name> MIG <profile>"
            return f"NVIDIA A100-SXM4-80GB MIG {handle.profile}"
        return self._gpu(handle).name

    def nvmlDeviceGetGpuInstanceById(self, handle: SimGpu, gi: int) -> SimMig:
        for slot in self._gpu(handle).mig_slots:
            if slot is not None and slot.gi == gi:
                return slot
        raise pynvml.NVMLError_NotFound()

    def nvmlGpuInstanceGetInfo(self, instance: SimMig) -> Any:
        return SimpleNamespace(placement=SimpleNamespace(start=instance.start, size=instance.size))

    def nvmlDeviceGetPciInfo(self, handle: SimGpu) -> Any:
        return SimpleNamespace(busId=self._gpu(handle).bus_id.encode())  # bytes, as ctypes gives

    def nvmlDeviceGetMemoryInfo(self, handle: SimGpu | SimMig) -> Any:
        if isinstance(handle, SimMig):
            return SimpleNamespace(
                total=handle.total, used=handle.used, free=handle.total - handle.used
            )
        gpu = self._gpu(handle)
        return SimpleNamespace(total=gpu.total, used=gpu.used, free=gpu.total - gpu.used)

    def nvmlDeviceGetUtilizationRates(self, handle: SimGpu) -> Any:
        gpu_pct, mem_pct = self._value(self._gpu(handle).utilization)
        return SimpleNamespace(gpu=gpu_pct, memory=mem_pct)

    def nvmlDeviceGetPowerUsage(self, handle: SimGpu) -> int:
        return self._value(self._gpu(handle).power_mw)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: SimGpu) -> int:
        return self._value(self._gpu(handle).energy_mj)

    def nvmlDeviceGetTemperature(self, handle: SimGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._value(self._gpu(handle).temperature_c)

    def nvmlDeviceGetTotalEccErrors(self, handle: SimGpu, error_type: int, counter: int) -> int:
        gpu = self._gpu(handle)
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            assert counter == pynvml.NVML_VOLATILE_ECC
            return self._value(gpu.ecc_corrected)
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        if counter == pynvml.NVML_AGGREGATE_ECC:
            return self._value(gpu.ecc_aggregate)
        assert counter == pynvml.NVML_VOLATILE_ECC
        return self._value(gpu.ecc)

    # static facts and health counters
    def nvmlDeviceGetSerial(self, handle: SimGpu) -> str:
        return self._value(self._gpu(handle).serial)

    def nvmlDeviceGetArchitecture(self, handle: SimGpu) -> int:
        return self._value(self._gpu(handle).architecture)

    def nvmlDeviceGetCudaComputeCapability(self, handle: SimGpu) -> tuple[int, int]:
        return self._value(self._gpu(handle).compute_capability)

    def nvmlDeviceGetVbiosVersion(self, handle: SimGpu) -> str:
        return self._value(self._gpu(handle).vbios)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: SimGpu) -> int:
        return self._value(self._gpu(handle).power_limit_mw)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: SimGpu) -> int:
        return self._value(self._gpu(handle).power_limit_mw)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: SimGpu) -> tuple[int, int]:
        return self._value(self._gpu(handle).power_limit_constraints)

    def nvmlDeviceGetClockInfo(self, handle: SimGpu, clock: int) -> int:
        return self._gpu(handle).clocks[clock]

    def nvmlDeviceGetMaxClockInfo(self, handle: SimGpu, clock: int) -> int:
        return self._gpu(handle).max_clocks[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: SimGpu) -> int:
        return self._value(self._gpu(handle).clock_reasons)

    def nvmlDeviceGetRetiredPages(self, handle: SimGpu, cause: int) -> list[int]:
        return self._value(self._gpu(handle).retired_pages)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: SimGpu) -> int:
        return self._value(self._gpu(handle).retired_pending)

    def nvmlDeviceGetRemappedRows(self, handle: SimGpu) -> tuple[int, int, int, int]:
        return self._value(self._gpu(handle).remapped_rows)

    def nvmlDeviceGetFieldValues(self, handle: SimGpu, field_ids: list[int]) -> list[Any]:
        assert field_ids == [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        gpu = self._gpu(handle)
        status = (
            pynvml.NVML_SUCCESS
            if gpu.recovery_action is not None
            else pynvml.NVML_ERROR_NOT_SUPPORTED
        )
        value = SimpleNamespace(uiVal=gpu.recovery_action or 0)
        return [SimpleNamespace(fieldId=field_ids[0], nvmlReturn=status, value=value)]

    # NVLink and topology (nvml.md §3)
    def nvmlDeviceGetNvLinkState(self, handle: SimGpu, link: int) -> int:
        gpu = self._gpu(handle)
        if not gpu.nvlinks:
            raise pynvml.NVMLError_NotSupported()
        if link >= len(gpu.nvlinks):
            raise pynvml.NVMLError_InvalidArgument()
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: SimGpu, link: int) -> Any:
        return SimpleNamespace(busId=self._gpu(handle).nvlinks[link].encode())

    def nvmlDeviceGetP2PStatus(self, a: SimGpu, b: SimGpu, index: int) -> int:
        assert index == pynvml.NVML_P2P_CAPS_INDEX_NVLINK
        joined = b.bus_id in self._gpu(a).nvlinks or (a.nvlinks and a.nvlinks[0] == "switch")
        return pynvml.NVML_P2P_STATUS_OK if joined else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetTopologyCommonAncestor(self, a: SimGpu, b: SimGpu) -> int:
        return pynvml.NVML_TOPOLOGY_SYSTEM

    # MIG
    def nvmlDeviceGetMigMode(self, handle: SimGpu) -> list[int]:
        enabled = self._value(self._gpu(handle).mig)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: SimGpu) -> int:
        return len(self._gpu(handle).mig_slots)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: SimGpu, index: int) -> SimMig:
        slot = self._gpu(handle).mig_slots[index]
        if slot is None:
            raise pynvml.NVMLError_NotFound()
        return slot

    def nvmlDeviceGetGpuInstanceId(self, mig: SimMig) -> int:
        return mig.gi

    def nvmlDeviceGetComputeInstanceId(self, mig: SimMig) -> int:
        return mig.ci

    def nvmlDeviceGetAttributes(self, mig: SimMig) -> Any:
        return SimpleNamespace(multiprocessorCount=mig.sm_count)

    # events
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, handle: SimGpu) -> int:
        return pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError

    def nvmlDeviceRegisterEvents(self, handle: SimGpu, mask: int, event_set: str) -> None:
        self.registered.append((handle, mask))

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError_Timeout() from None

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.event_set_freed = True

    # test helpers
    def raise_xid(self, gpu: SimGpu, xid: int, gi: int = 0xFFFFFFFF, ci: int = 0xFFFFFFFF) -> None:
        self.events.put(
            SimpleNamespace(
                device=gpu,
                eventType=pynvml.nvmlEventTypeXidCriticalError,
                eventData=xid,
                gpuInstanceId=gi,
                computeInstanceId=ci,
            )
        )


def a100_with_mig() -> SimGpu:
    slots: list[SimMig | None] = [
        SimMig(
            gi,
            0,
            f"MIG-0000000{gi}-aaaa-bbbb-cccc-dddddddddddd",
            19968 * MiB,
            12 * MiB,
            14,
            start=2 * (gi - 3),  # A100-80GB 1g.20gb sits at memory slices 0, 2, 4, 6
        )
        for gi in (3, 4, 5, 6)
    ]
    return SimGpu(
        uuid="GPU-513536b6-7d19-9063-b049-1e69664bb298",
        name="NVIDIA A100-SXM4-80GB",
        bus_id="00000000:01:00.0",
        total=81920 * MiB,
        used=50 * MiB,
        utilization=pynvml.NVMLError_NotSupported,  # not supported on a MIG-enabled GPU
        power_mw=67_030,
        mig=True,
        mig_slots=[*slots, None, None, None],  # 7 slots, 3 empty
    )


def t4(uuid: str = "GPU-d37e67a5-91dd-3774-a5cb-99096249601a", **kwargs: Any) -> SimGpu:
    values: dict[str, Any] = {
        "name": "Tesla T4",
        "bus_id": "00000000:00:1E.0",
        "total": 15360 * MiB,
        "used": 1032 * MiB,
        "utilization": (35, 12),
        "power_mw": 26_780,
        "energy_mj": 123_456_789,
        "temperature_c": 40,
        "ecc": 0,
    }
    values.update(kwargs)
    return SimGpu(uuid=uuid, **values)


def open_source(sim: SimulatedNvml, **kwargs: Any) -> NvmlSource:
    kwargs.setdefault("event_wait_ms", 50)
    return NvmlSource(nvml=sim, **kwargs)


def test_nvml_init_failure_carries_nvmls_own_message() -> None:
    sim = SimulatedNvml([], init_error=pynvml.NVMLError_LibraryNotFound)
    with pytest.raises(SourceUnavailable, match=r"^NVML Shared Library Not Found$"):
        NvmlSource(nvml=sim)


def test_inventory_lists_gpus_and_mig_devices_skipping_empty_slots() -> None:
    sim = SimulatedNvml([a100_with_mig(), t4()])
    source = open_source(sim, xid_events=False)
    inventory = source.inventory()
    assert inventory["driver_version"] == "550.54.15"
    assert inventory["cuda_version"] == "12.4"  # 12040
    a100, tesla = inventory["gpus"]
    assert a100["uuid"] == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert a100["index"] == 0
    assert a100["name"] == "NVIDIA A100-SXM4-80GB"
    assert a100["pci_bus_id"] == "00000000:01:00.0"  # decoded from bytes
    assert a100["memory_total_bytes"] == 85899345920
    assert a100["mig_mode"] == "enabled"
    assert [m["gpu_instance_id"] for m in a100["mig_devices"]] == [3, 4, 5, 6]
    assert a100["mig_devices"][0] == {
        "uuid": "MIG-00000003-aaaa-bbbb-cccc-dddddddddddd",
        "gpu_instance_id": 3,
        "compute_instance_id": 0,
        "memory_total_bytes": 19968 * MiB,
        "multiprocessor_count": 14,
        "profile": "1g.20gb",
        "placement_start": 0,
        "placement_size": 2,
    }
    assert [m["placement_start"] for m in a100["mig_devices"]] == [0, 2, 4, 6]
    assert tesla["index"] == 1
    assert tesla["mig_mode"] is None  # nvmlDeviceGetMigMode raises NotSupported on a T4
    assert tesla["mig_devices"] == []
    source.close()


def test_on_a_shared_host_the_clear_tools_slice_scrub_records_are_reported(tmp_path) -> None:
    """``--slice-scrub-dir``: one record per clear, ``<dir>/<GPU UUID>/<scrub id>.json``;
    a half-written (malformed) file and records of other GPUs are not reported."""
    import json

    gpu = "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    folder = tmp_path / gpu
    folder.mkdir()
    record = {"scrub_id": "8ec4d399", "start": 4, "size": 2, "status": "ok", "extra": "dropped"}
    (folder / "8ec4d399.json").write_text(json.dumps(record))
    (folder / "partial.json").write_text('{"scrub_id": ')
    (tmp_path / "GPU-other").mkdir()
    (tmp_path / "GPU-other" / "x.json").write_text(json.dumps({**record, "scrub_id": "x"}))
    source = open_source(
        SimulatedNvml([a100_with_mig(), t4()]), xid_events=False, slice_scrub_dir=str(tmp_path)
    )
    a100, tesla = source.inventory()["gpus"]
    assert a100["slice_scrubs"] == [{"scrub_id": "8ec4d399", "start": 4, "size": 2, "status": "ok"}]
    assert tesla["slice_scrubs"] == []
    source.close()
    plain = open_source(SimulatedNvml([t4()]), xid_events=False)
    assert "slice_scrubs" not in plain.inventory()["gpus"][0]  # not a shared host
    plain.close()


def test_mig_gpu_has_null_utilization_and_one_sample_per_mig_device() -> None:
    sim = SimulatedNvml([a100_with_mig()])
    source = open_source(sim, xid_events=False)
    gpu, *migs = source.collect(NOW)
    assert gpu["ts"] == format_ts(NOW) == "2024-05-01T12:00:00.000000Z"
    assert gpu["mig_gpu_instance_id"] is None
    assert gpu["utilization_gpu_pct"] is None
    assert gpu["utilization_memory_pct"] is None
    assert gpu["power_mw"] == 67_030
    assert gpu["memory_used_bytes"] == 50 * MiB
    assert gpu["temperature_c"] == 40.0
    assert [m["mig_gpu_instance_id"] for m in migs] == [3, 4, 5, 6]
    for mig in migs:
        assert mig["gpu_uuid"] == gpu["gpu_uuid"]
        assert mig["memory_total_bytes"] == 19968 * MiB
        assert mig["memory_used_bytes"] == 12 * MiB
        assert mig["utilization_gpu_pct"] is None
        assert mig["power_mw"] is None
    source.close()


def test_unsupported_or_forbidden_fields_are_null_and_the_rest_is_kept() -> None:
    sim = SimulatedNvml(
        [
            t4(
                power_mw=pynvml.NVMLError_NotSupported,
                energy_mj=pynvml.NVMLError_NoPermission,
                ecc=pynvml.NVMLError_Unknown,
            )
        ]
    )
    source = open_source(sim, xid_events=False)
    [sample] = source.collect(NOW)
    assert sample["power_mw"] is None
    assert sample["energy_mj"] is None
    assert sample["ecc_volatile_uncorrected"] is None
    assert sample["utilization_gpu_pct"] == 35.0
    assert sample["utilization_memory_pct"] == 12.0
    assert sample["memory_used_bytes"] == 1032 * MiB
    assert sample["memory_total_bytes"] == 15360 * MiB
    assert sample["temperature_c"] == 40.0
    source.close()


def test_a_lost_gpu_is_reported_lost_under_its_uuid_and_the_others_are_still_sampled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    healthy_before, lost, healthy_after = t4("GPU-a"), t4("GPU-b"), t4("GPU-c")
    sim = SimulatedNvml([healthy_before, lost, healthy_after])
    source = open_source(sim, xid_events=False)
    assert [g["health"]["gpu_is_lost"] for g in source.inventory()["gpus"]] == [False] * 3
    assert [s["gpu_uuid"] for s in source.collect(NOW)] == ["GPU-a", "GPU-b", "GPU-c"]

    lost.lost = True  # falls off the bus: every NVML call on it raises GpuIsLost
    with caplog.at_level("ERROR", logger="nvke_agent"):
        samples = source.collect(NOW)
    assert [s["gpu_uuid"] for s in samples] == ["GPU-a", "GPU-c"]
    assert "GPU 1 is lost" in caplog.text

    calls = lost.calls
    assert [s["gpu_uuid"] for s in source.collect(NOW)] == ["GPU-a", "GPU-c"]
    gpus = source.inventory()["gpus"]
    assert lost.calls == calls  # not polled again, not even for the inventory
    # still listed, under the UUID (and the name, bus, memory) read before it was lost
    assert [g["uuid"] for g in gpus] == ["GPU-a", "GPU-b", "GPU-c"]
    assert gpus[1] == {
        "uuid": "GPU-b",
        "index": 1,
        "name": "Tesla T4",
        "pci_bus_id": "00000000:00:1E.0",
        "memory_total_bytes": 15360 * MiB,
        "mig_mode": None,
        "mig_devices": [],
        "health": {"gpu_is_lost": True},
    }
    assert gpus[0]["health"]["gpu_is_lost"] is False
    source.close()


def test_a_gpu_lost_before_any_inventory_is_listed_lost_by_the_uuid_its_samples_read() -> None:
    flaky = t4("GPU-b")
    sim = SimulatedNvml([t4("GPU-a"), flaky])
    source = open_source(sim, xid_events=False)
    assert len(source.collect(NOW)) == 2  # its UUID is read here
    flaky.lost = True
    assert [s["gpu_uuid"] for s in source.collect(NOW)] == ["GPU-a"]
    lost = source.inventory()["gpus"][1]
    assert (lost["uuid"], lost["index"], lost["health"]) == ("GPU-b", 1, {"gpu_is_lost": True})
    source.close()


def test_a_gpu_lost_before_its_uuid_was_ever_read_cannot_be_named_and_is_left_out() -> None:
    flaky = t4("GPU-b")
    flaky.lost = True
    sim = SimulatedNvml([t4("GPU-a"), flaky])
    source = open_source(sim, xid_events=False)
    assert [g["uuid"] for g in source.inventory()["gpus"]] == ["GPU-a"]
    source.close()


def test_gpu_lost_in_the_middle_of_a_sample_drops_only_that_gpu() -> None:
    flaky = t4("GPU-b", power_mw=pynvml.NVMLError_GpuIsLost)
    sim = SimulatedNvml([t4("GPU-a"), flaky])
    source = open_source(sim, xid_events=False)
    assert [s["gpu_uuid"] for s in source.collect(NOW)] == ["GPU-a"]
    source.close()


def test_a_node_level_error_fails_the_round_not_the_agent() -> None:
    sim = SimulatedNvml([t4()])
    source = open_source(sim, xid_events=False)
    sim.count_error = pynvml.NVMLError_DriverNotLoaded
    with pytest.raises(SourceError, match="Driver Not Loaded") as failed:
        source.collect(NOW)
    # NVML's name of the error: the report's source_error_code (an NVML init failure)
    assert failed.value.code == "NVML_ERROR_DRIVER_NOT_LOADED"
    sim.count_error = pynvml.NVMLError_LibRmVersionMismatch
    with pytest.raises(SourceError) as failed:
        source.inventory()
    assert failed.value.code == "NVML_ERROR_LIB_RM_VERSION_MISMATCH"
    sim.count_error = None
    assert len(source.collect(NOW)) == 1
    source.close()


def test_xid_events_are_queued_by_the_listener_thread() -> None:
    gpu_a, gpu_b = a100_with_mig(), t4("GPU-b")
    sim = SimulatedNvml([gpu_a, gpu_b])
    source = open_source(sim)
    assert [(gpu.uuid, mask) for gpu, mask in sim.registered] == [
        (gpu_a.uuid, pynvml.nvmlEventTypeXidCriticalError),
        ("GPU-b", pynvml.nvmlEventTypeXidCriticalError),
    ]
    sim.raise_xid(gpu_b, 79)
    sim.raise_xid(gpu_a, 94, gi=3, ci=0)
    events: list[Any] = []
    deadline = time.monotonic() + 5
    while len(events) < 2 and time.monotonic() < deadline:
        events += source.events()
        time.sleep(0.01)
    assert [(e["gpu_uuid"], e["type"], e["xid"]) for e in events] == [
        ("GPU-b", "xid", 79),
        (gpu_a.uuid, "xid", 94),
    ]
    assert events[0]["message"] == "Xid 79"
    assert events[1]["message"] == "Xid 94 on MIG GPU instance 3 compute instance 0"
    assert events[0]["ts"].endswith("Z")
    assert source.events() == []
    source.close()
    assert sim.event_set_freed
    assert sim.shutdown_called


def test_close_is_idempotent_and_stops_the_listener() -> None:
    sim = SimulatedNvml([t4()])
    source = open_source(sim)
    listener = source._listener
    assert listener is not None and listener.is_alive()
    source.close()
    source.close()
    assert not listener.is_alive()


def _nvml_library_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_nvml_library_present(), reason="this machine has an NVIDIA driver")
def test_record_with_real_nvml_on_a_gpu_less_machine_fails_with_nvmls_message(
    tmp_path: Path,
) -> None:
    agent_dir = Path(__file__).resolve().parents[2] / "agent"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(agent_dir), os.environ.get("PYTHONPATH", "")]),
    }
    script = Path(sys.executable).with_name("nvke-agent")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "nvke_agent"]
    result = subprocess.run(
        [
            *command,
            "record",
            "--source",
            "nvml",
            "--out",
            str(tmp_path / "out.jsonl"),
            "--duration",
            "1",
            "--interval",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2
    assert "NVML Shared Library Not Found" in result.stderr
