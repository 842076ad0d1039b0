"""The interface every telemetry source implements, and the wire shapes it produces.

The shapes below are the JSON the NVKE agent API accepts (``POST /api/v1/agent/reports``);
sources return them ready to send, so the rest of the agent is the same for every source
(DESIGN.md §5).

Units (NVML's own, nvml.md §3): memory in **bytes**, utilization in **percent** (0..100),
power in **milliwatts**, energy in **millijoules** since the driver was loaded, temperature in
**°C**, clocks in **MHz**, ECC as an error **count**, clock event reasons as NVML's bit mask.
A value the GPU cannot report is ``None`` (JSON ``null``), never 0. Timestamps are RFC 3339
UTC strings with microseconds (:func:`format_ts`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, NotRequired, Protocol, TypedDict, runtime_checkable

SOURCE_NAMES = ("nvml", "nvidia-smi-xml", "replay", "simulated")


class MigDeviceInventory(TypedDict):
    """A MIG device (GPU instance + compute instance) of a GPU."""

    uuid: str | None  # "MIG-…", None when the source does not know it
    gpu_instance_id: int | None
    compute_instance_id: int | None
    memory_total_bytes: int | None
    multiprocessor_count: int | None
    #: the GPU-instance profile (``1g.10gb``) and its placement (start memory slice, size in
    #: slices), where the source can tell (NVML ``nvmlGpuInstanceGetInfo``; ``simulated``)
    profile: NotRequired[str | None]
    placement_start: NotRequired[int | None]
    placement_size: NotRequired[int | None]


class GpuInventory(TypedDict):
    """A physical GPU as the wire's ``inventory.gpus[]`` item."""

    uuid: str  # "GPU-…"
    index: int  # NVML enumeration index
    name: str  # NVML name, e.g. "NVIDIA A100-SXM4-80GB"
    pci_bus_id: str  # 8-hex-digit domain, e.g. "00000000:01:00.0"
    memory_total_bytes: int | None
    mig_mode: str | None  # "enabled" | "disabled" | None (no MIG on this GPU)
    mig_devices: list[MigDeviceInventory]
    #: health facts (reset_required, ECC aggregate, retired pages, remapped rows, pending MIG
    #: mode …; see nvke_agent.smi_xml), None values for what the GPU does not report
    health: NotRequired[dict[str, Any]]
    #: static facts (serial, architecture, compute_capability, vbios_version, power limits in
    #: mW, max clocks in MHz, nvlink_links_active)
    attributes: NotRequired[dict[str, Any]]
    #: shared (hypervisor) hosts: completed memory clears of released GPU instances' slices,
    #: ``[{"scrub_id", "start", "size", "status": "ok" | "failed", "cleared_bytes",
    #: "finished_at", "method"}]`` — written by the host's slice-scrub tool (the simulated
    #: source reads them from the simulated host); the control plane frees an instance only when
    #: its scrub id is here and the instance is gone
    slice_scrubs: NotRequired[list[dict[str, Any]]]
    #: GPU fabric info (multi-node NVLink, :mod:`nvke_agent.fabric`): ``{"state", "status",
    #: "cluster_uuid", "clique_id"}``; absent where the source cannot tell
    fabric: NotRequired[dict[str, Any] | None]


class Inventory(TypedDict):
    """What :meth:`Source.inventory` returns: the GPU list plus the host's driver versions."""

    driver_version: str | None  # e.g. "535.54.03"
    cuda_version: str | None  # e.g. "12.2"
    gpus: list[GpuInventory]
    #: ``{"links": [[…]]}``: links[i][j] between GPU indexes i and j as ``nvidia-smi topo -m``
    #: names them (X, NV<n>, PIX, PXB, PHB, NODE, SYS); absent when the source cannot tell
    topology: NotRequired[dict[str, Any]]


class Sample(TypedDict):
    """One telemetry sample of a GPU, or of one MIG device when ``mig_gpu_instance_id`` is set."""

    ts: str
    gpu_uuid: str
    mig_gpu_instance_id: int | None
    utilization_gpu_pct: float | None
    utilization_memory_pct: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_mw: int | None
    energy_mj: int | None
    temperature_c: float | None
    ecc_volatile_uncorrected: int | None
    ecc_volatile_corrected: int | None
    sm_clock_mhz: int | None
    memory_clock_mhz: int | None
    clocks_event_reasons: int | None


class Event(TypedDict):
    """A GPU event; ``type`` is ``"xid"`` with the Xid code in ``xid``."""

    ts: str
    gpu_uuid: str
    type: str
    xid: int
    message: str


SAMPLE_FIELDS: tuple[str, ...] = tuple(Sample.__annotations__)
EVENT_FIELDS: tuple[str, ...] = tuple(Event.__annotations__)


class SourceUnavailable(RuntimeError):
    """The source cannot start at all (no NVML library, no driver, XML file missing …).

    ``str(err)`` is the underlying message (for NVML: NVML's own error string, e.g.
    ``"NVML Shared Library Not Found"``); the CLI prints it and exits with status 2.
    """


class SourceError(RuntimeError):
    """A collection round failed as a whole (e.g. the driver is being upgraded); try again later.

    ``code``: the failure as NVML names its return code (``NVML_ERROR_DRIVER_NOT_LOADED`` …)
    where the source knows it, else None; the agent sends it as ``source_error_code``."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


@runtime_checkable
class Source(Protocol):
    """A place GPU facts come from.

    * ``name`` is the wire's ``source`` value.
    * ``inventory()`` returns the current inventory, or ``None`` when the source has none
      (a replay file without an inventory line).
    * ``collect(now)`` returns the samples due at ``now`` (an aware UTC datetime).
    * ``events()`` drains the events seen since the last call.
    * ``exhausted`` becomes true when a finite source (replay) has returned everything.
    * ``close()`` releases the source (threads, NVML handles); it is idempotent.
    """

    name: str

    @property
    def exhausted(self) -> bool: ...

    def inventory(self) -> Inventory | None: ...

    def collect(self, now: datetime) -> list[Sample]: ...

    def events(self) -> list[Event]: ...

    def close(self) -> None: ...


def format_ts(moment: datetime) -> str:
    """RFC 3339 UTC with microseconds: ``2024-05-01T12:00:00.000000Z``."""
    if moment.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_ts(text: str) -> datetime:
    """Parse an RFC 3339 timestamp (``Z`` or an offset) into an aware UTC datetime."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"timestamp without a timezone: {text!r}")
    return value.astimezone(UTC)


def lost_gpu(known: GpuInventory) -> GpuInventory:
    """A GPU NVML calls lost (``NVML_ERROR_GPU_IS_LOST``: fallen off the bus) as the inventory
    lists it: the UUID, index, name, PCI bus id and memory read before it was lost (``known``),
    no MIG devices, and ``health`` ``{"gpu_is_lost": true}`` — nothing else can be read (the
    server reads only the UUID and the health of a lost GPU)."""
    return GpuInventory(
        uuid=known["uuid"],
        index=known["index"],
        name=known.get("name", ""),
        pci_bus_id=known.get("pci_bus_id", ""),
        memory_total_bytes=known.get("memory_total_bytes"),
        mig_mode=None,
        mig_devices=[],
        health={"gpu_is_lost": True},
    )


def empty_sample(ts: str, gpu_uuid: str, mig_gpu_instance_id: int | None = None) -> Sample:
    """A sample with every measurement ``None``; sources fill in what they can read."""
    return Sample(
        ts=ts,
        gpu_uuid=gpu_uuid,
        mig_gpu_instance_id=mig_gpu_instance_id,
        utilization_gpu_pct=None,
        utilization_memory_pct=None,
        memory_used_bytes=None,
        memory_total_bytes=None,
        power_mw=None,
        energy_mj=None,
        temperature_c=None,
        ecc_volatile_uncorrected=None,
        ecc_volatile_corrected=None,
        sm_clock_mhz=None,
        memory_clock_mhz=None,
        clocks_event_reasons=None,
    )
