"""SIMULATED INFRASTRUCTURE: the hardware state of simulated GPU hosts.

The ``simulated`` provider does not tell NVKE what NVKE asked it to do. It acts on a simulated
host — this module — exactly as a real provider acts on a real machine: MIG Manager applies a
mig-parted config (MIG mode, GPU instances at the catalog's real placements), the driver
container installs a driver, the machine reboots, a GPU is reset. What NVKE then believes comes
only from the host's agent (``nvke-agent run --source simulated --sim-state FILE``), which reads
this state like NVML reads a GPU and reports it through the normal agent API.

One JSON file per host, ``$NVKE_SIMULATED_HOSTS_DIR/<host id>.json`` (shape below), written
atomically (temp file + rename) under an exclusive ``flock`` of ``<host id>.lock``, so two
workers never lose each other's change and an agent never reads half a file::

    {"simulated": "...", "host_id", "hostname", "gpu_model", "driver_version", "cuda_version",
     "nvml_error": "" (NVML initialises) | NVML's message, "nvml_error_code": NVML's name of
     that error ("NVML_ERROR_LIB_RM_VERSION_MISMATCH" …, "" when none; written with the file
     from :data:`NVML_ERROR_CODES`), "boot_count", "faults": [names],
     "kubelet": {node_id: version},
     "gpus": [{"uuid", "index", "name", "pci_bus_id", "memory_total_bytes", "architecture",
               "compute_capability", "mig_capable", "lost": true (fallen off the bus:
               :func:`lose_gpu`; absent otherwise),
               "mig_mode": "enabled" | "disabled" | null, "mig_mode_pending",
               "instances": [{"profile", "start", "size", "gpu_instance_id", "uuid",
                              "memory_total_bytes"}],
               "slice_scrubs": [{"scrub_id", "start", "size", "status", "cleared_bytes",
                                 "finished_at", "method"}]  (shared hosts),
               "health": {"remapped_rows_pending", "remapped_rows_failure",
                          "ecc_volatile_uncorrected", "ecc_aggregate_uncorrected", …},
               "fabric": {"state", "status", "cluster_uuid_hex", "clique_id"} (only on hosts
                          of a multi-node NVLink domain: NVML's nvmlGpuFabricInfo_t numbers,
                          state 3 = completed, the cluster UUID's 16 bytes in hex)}],
     "events": [{"id", "ts", "gpu_uuid", "type": "xid", "xid", "message"}], "next_event_id"}

Hardware rules simulated: a pending row remap survives everything but a GPU reset (a reboot
resets the GPUs, unless the fault ``reboot-leaves-remap-pending``); volatile ECC counters
clear on a reset or reboot, aggregate ones never; a MIG mode change made while the GPU is
busy is *pending* until a reset. Injectable faults (:data:`FAULTS`) make the host disobey.

Hosts with no registered agent process (unit tests, hosts imported without one) get their
agent report in-process: :func:`report_in_process` runs the agent's own ``simulated`` source
over the same file and hands its report to the same ingestion function the API uses
(:func:`fleet.ingest.ingest_report`). Either way the control plane reads agent facts only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import uuid as uuidlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings

#: injectable faults: name -> what the simulated host then does wrong
FAULTS = {
    "mig-manager-wedged": "MIG Manager is wedged: a new MIG config is not applied, the GPUs "
    "keep their old layout (while the GPU Operator label says success)",
    "mig-stays-enabled": "disabling MIG does not take: the GPUs stay MIG-enabled (whole-GPU "
    "pools get MIG-mode GPUs)",
    "driver-not-taken": "a driver upgrade is not taken: the old driver stays loaded",
    "driver-breaks-nvml": "after a driver install NVML no longer initialises "
    "(driver/library version mismatch)",
    "nvml-init-fails": "NVML does not initialise on this host",
    "reboot-leaves-remap-pending": "a reboot does not reset the GPUs: a pending row remap "
    "stays pending",
    "gi-destroy-fails": "destroying a released MIG GPU instance fails (in use): the instance "
    "stays and its memory is not cleared (a shared host's GPU instance is never freed)",
}
NVML_MISMATCH = "Driver/library version mismatch (simulated)"
NVML_FAILS = "Driver Not Loaded (simulated: NVML does not initialise)"
#: the simulated NVML errors as NVML names them (the agent's ``source_error_code``)
NVML_ERROR_CODES = {
    NVML_MISMATCH: "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    NVML_FAILS: "NVML_ERROR_DRIVER_NOT_LOADED",
}
SIMULATED_NOTE = "SIMULATED HOST: not real hardware (clusters/providers/simhosts.py)"
#: report seqs of in-process agent reports start here, far above any agent process's own
IN_PROCESS_SEQ_BASE = 2**62


class UnknownFault(ValueError):
    """A fault name not in :data:`FAULTS`."""


def hosts_dir() -> Path:
    """Where the state files live (``NVKE_SIMULATED_HOSTS_DIR``), created on demand."""
    path = Path(settings.NVKE_SIMULATED_HOSTS_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def state_path(host_id: Any) -> Path:
    return hosts_dir() / f"{host_id}.json"


def read(host_id: Any) -> dict[str, Any] | None:
    """The host's state, or None when it was never simulated."""
    try:
        return json.loads(state_path(host_id).read_text())
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def _locked(host_id: Any) -> Iterator[None]:
    with open(hosts_dir() / f"{host_id}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write(host_id: Any, state: dict[str, Any]) -> None:
    # the error's NVML name follows its message, whoever set it
    state["nvml_error_code"] = NVML_ERROR_CODES.get(state.get("nvml_error") or "", "")
    path = state_path(host_id)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{host_id}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(state, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


def initial_state(host: Any) -> dict[str, Any]:
    """The hardware of a fleet host as its import recorded it (a ``fleet.models.Host``):
    its GPUs (UUIDs, MIG mode without instances), driver and CUDA version, no fault; on a host
    imported with an NVLink domain (a simulated GB200 NVL72 tray) every GPU's fabric
    registration is complete in that domain (the rack is wired as the operator said)."""
    fabric = None
    if host.nvlink_cluster_uuid is not None and host.nvlink_clique_id is not None:
        fabric = {
            "state": 3,  # NVML_GPU_FABRIC_STATE_COMPLETED
            "status": 0,  # NVML_SUCCESS
            "cluster_uuid_hex": uuidlib.UUID(str(host.nvlink_cluster_uuid)).hex,
            "clique_id": int(host.nvlink_clique_id),
        }
    gpus = []
    for gpu in host.gpus.select_related("gpu_model").order_by("index"):
        capable = bool(gpu.gpu_model.mig_capable)
        mode = (gpu.mig_mode or "disabled") if capable else None
        gpus.append(
            {
                "uuid": gpu.uuid,
                "index": gpu.index,
                "name": gpu.product_name,
                "pci_bus_id": gpu.pci_bus_id,
                "memory_total_bytes": gpu.memory_total_bytes,
                # what NVML's nvmlDeviceGetArchitecture / GetCudaComputeCapability answer
                "architecture": _nvml_architecture(gpu.gpu_model.architecture),
                "compute_capability": gpu.gpu_model.compute_capability or None,
                "mig_capable": capable,
                "mig_mode": mode,
                "mig_mode_pending": mode,
                "instances": [],
                "health": _clean_health(),
                **({"fabric": dict(fabric)} if fabric else {}),
            }
        )
    return {
        "simulated": SIMULATED_NOTE,
        "host_id": str(host.id),
        "hostname": host.hostname,
        "gpu_model": host.gpu_model_id,
        "driver_version": host.driver_version or "",
        "cuda_version": host.cuda_version or "",
        "nvml_error": "",
        "boot_count": 0,
        "faults": [],
        "kubelet": {},
        "gpus": gpus,
        "events": [],
        "next_event_id": 1,
    }


def _nvml_architecture(catalog_name: str) -> str | None:
    """The catalog's architecture (``hopper``, ``ada``) as NVML's agent source names it
    (``Hopper``, ``Ada Lovelace``: ``nvke_agent.sources.nvml.ARCHITECTURES``)."""
    if not catalog_name:
        return None
    return {"ada": "Ada Lovelace"}.get(catalog_name.lower(), catalog_name.title())


def _clean_health() -> dict[str, Any]:
    return {
        "reset_required": False,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "retired_pages_pending": None,
        "ecc_volatile_uncorrected": 0,
        "ecc_aggregate_uncorrected": 0,
    }


def change(host: Any, fn: Callable[[dict[str, Any]], Any]) -> Any:
    """Apply ``fn(state)`` to the host's state under its lock (created from the fleet record
    on first use) and write it back; returns what ``fn`` returned."""
    with _locked(host.id):
        state = read(host.id) or initial_state(host)
        result = fn(state)
        _write(host.id, state)
    return result


def ensure(host: Any) -> dict[str, Any]:
    """The host's state, created from the fleet record when it does not exist yet."""
    return change(host, lambda state: state)


def _gpus(state: dict[str, Any], uuids: Any = None) -> list[dict[str, Any]]:
    wanted = set(uuids) if uuids is not None else None
    return [g for g in state["gpus"] if wanted is None or g["uuid"] in wanted]


# --- what the provider does to a host ------------------------------------------------------------


def apply_mig(
    state: dict[str, Any], gpu_uuids: Any, enabled: bool, placements: list[dict[str, int]]
) -> None:
    """MIG Manager applies a mig-parted entry to the GPUs: MIG mode, then the GPU instances
    (``placements``: ``[{"profile", "start", "size"}]`` per GPU, in creation order).

    Faults: ``mig-manager-wedged`` (nothing changes), ``mig-stays-enabled`` (disabling MIG
    destroys the instances but the mode stays enabled). GPUs without MIG are left alone.
    """
    if "mig-manager-wedged" in state["faults"]:
        return
    for gpu in _gpus(state, gpu_uuids):
        if not gpu.get("mig_capable"):
            continue
        gpu["instances"] = []
        if not enabled:
            if "mig-stays-enabled" not in state["faults"]:
                gpu["mig_mode"] = gpu["mig_mode_pending"] = "disabled"
            continue
        gpu["mig_mode"] = gpu["mig_mode_pending"] = "enabled"
        per_slice = (gpu.get("memory_total_bytes") or 0) // 8
        for number, p in enumerate(placements, start=1):
            gpu["instances"].append(
                {
                    "profile": p["profile"],
                    "start": int(p["start"]),
                    "size": int(p["size"]),
                    # NVML numbers GPU instances itself; the simulation numbers them in order
                    "gpu_instance_id": number,
                    "uuid": f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, gpu['uuid'] + str(p))}",
                    "memory_total_bytes": per_slice * int(p["size"]) or None,
                }
            )


def create_instances(state: dict[str, Any], holder: Any, instances: list[dict[str, Any]]) -> None:
    """On a shared host: create a tenant node's GPU instances (``[{"gpu_uuid", "profile",
    "start", "size"}]``) beside the other tenants' (``nvidia-smi mig -cgi <profile>:<start>``),
    enabling MIG mode first where it is off. NVML gives each the lowest free GPU-instance id.
    Idempotent: an instance already at that start is left as it is."""
    for item in instances:
        for gpu in _gpus(state, [item["gpu_uuid"]]):
            if not gpu.get("mig_capable"):
                continue
            gpu["mig_mode"] = gpu["mig_mode_pending"] = "enabled"
            current = gpu.setdefault("instances", [])
            if any(int(i["start"]) == int(item["start"]) for i in current):
                continue
            used = {int(i["gpu_instance_id"]) for i in current}
            number = next(n for n in range(1, 64) if n not in used)
            per_slice = (gpu.get("memory_total_bytes") or 0) // 8
            key = f"{gpu['uuid']}/{item['profile']}@{item['start']}/{holder}"
            current.append(
                {
                    "profile": item["profile"],
                    "start": int(item["start"]),
                    "size": int(item["size"]),
                    "gpu_instance_id": number,
                    "uuid": f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, key)}",
                    "memory_total_bytes": per_slice * int(item["size"]) or None,
                }
            )


def scrub_instances(state: dict[str, Any], scrubs: list[dict[str, Any]]) -> None:
    """On a shared host: for each released GPU instance (``[{"gpu_uuid", "start", "size",
    "scrub_id"}]``) destroy the GPU instance on it (``nvidia-smi mig -dci / -dgi``), then clear
    the memory of its slices (a scratch instance at the same placement, its memory overwritten with
    zeros, destroyed again) and record the clear, which the agent reports as the GPU's
    ``slice_scrubs``. Fault ``gi-destroy-fails``: the instance stays and nothing is cleared."""
    if "gi-destroy-fails" in state["faults"]:
        return
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    for item in scrubs:
        start, size = int(item["start"]), int(item["size"])
        for gpu in _gpus(state, [item["gpu_uuid"]]):
            slices = set(range(start, start + size))
            gpu["instances"] = [
                i
                for i in gpu.get("instances") or []
                if not slices & set(range(int(i["start"]), int(i["start"]) + int(i["size"])))
            ]
            per_slice = (gpu.get("memory_total_bytes") or 0) // 8
            record = {
                "scrub_id": str(item["scrub_id"]),
                "start": start,
                "size": size,
                "status": "ok",
                "cleared_bytes": per_slice * size,
                "finished_at": now,
                "method": "simulated: zero-fill through a scratch GPU instance at the same slices",
            }
            gpu["slice_scrubs"] = [*(gpu.get("slice_scrubs") or [])[-31:], record]


def install_driver(state: dict[str, Any], version: str) -> None:
    """The driver container installs ``version`` (a release, or a branch ``R580``, for which it
    loads the branch's newest release the catalog knows, ``580.95.05``:
    :func:`catalog.services.newest_known_release`; ``580.0.0`` only for a branch the catalog
    names no release of) and reloads the driver, which resets volatile ECC counters; the host
    then reports the CUDA version that driver supports (``13.0`` for 580.95.05:
    :func:`catalog.services.cuda_of_driver`; unchanged where the catalog cannot tell).
    Faults: ``driver-not-taken`` (the old driver stays), ``driver-breaks-nvml``."""
    from catalog.services import cuda_of_driver, newest_known_release

    if not version or "driver-not-taken" in state["faults"]:
        return
    text = version.strip()
    if text[:1] in "Rr":
        text = newest_known_release(int(text[1:])) or f"{text[1:]}.0.0"
    state["driver_version"] = text
    state["cuda_version"] = cuda_of_driver(text) or state.get("cuda_version") or ""
    for gpu in state["gpus"]:
        gpu["health"]["ecc_volatile_uncorrected"] = 0
    if "driver-breaks-nvml" in state["faults"]:
        state["nvml_error"] = NVML_MISMATCH


def set_kubelet(state: dict[str, Any], node_id: Any, version: str) -> None:
    """The node's kubelet now runs ``version`` (an in-place node upgrade)."""
    if version:
        state["kubelet"][str(node_id)] = version


def reset_gpus(state: dict[str, Any], gpu_uuids: Any) -> None:
    """``nvidia-smi --gpu-reset``: pending row remaps are applied (no longer pending), volatile
    ECC counters clear, a pending MIG mode takes effect. Nothing else changes."""
    for gpu in _gpus(state, gpu_uuids):
        gpu["health"]["remapped_rows_pending"] = False
        gpu["health"]["reset_required"] = False
        gpu["health"]["ecc_volatile_uncorrected"] = 0
        gpu["mig_mode"] = gpu.get("mig_mode_pending", gpu.get("mig_mode"))


def reboot(state: dict[str, Any]) -> None:
    """The machine restarts: the driver reloads (NVML initialises again unless the fault
    ``nvml-init-fails`` or ``driver-breaks-nvml`` holds) and the GPUs are reset — except with
    ``reboot-leaves-remap-pending``, where pending row remaps stay pending."""
    state["boot_count"] = int(state.get("boot_count", 0)) + 1
    faults = state["faults"]
    broken = "nvml-init-fails" in faults or "driver-breaks-nvml" in faults
    state["nvml_error"] = state["nvml_error"] if broken else ""
    for gpu in state["gpus"]:
        gpu.pop("lost", None)  # a GPU that fell off the bus is back after a reboot
        pending = gpu["health"]["remapped_rows_pending"]
        reset_gpus(state, [gpu["uuid"]])
        if "reboot-leaves-remap-pending" in faults:
            gpu["health"]["remapped_rows_pending"] = pending


def lose_gpu(state: dict[str, Any], gpu_uuid: str) -> None:
    """The GPU falls off the bus (NVML_ERROR_GPU_IS_LOST, often with Xid 79): the agent can no
    longer read it and lists it as lost (``nvke_agent.sources.simulated``) until the machine
    reboots (:func:`reboot`)."""
    for gpu in _gpus(state, [gpu_uuid]):
        gpu["lost"] = True


def set_fault(state: dict[str, Any], name: str, on: bool = True) -> None:
    """Inject (or clear) a fault; ``nvml-init-fails`` takes effect at once."""
    if name not in FAULTS:
        raise UnknownFault(f"unknown fault {name!r}; known: {', '.join(sorted(FAULTS))}")
    faults = [f for f in state["faults"] if f != name]
    if on:
        faults.append(name)
    state["faults"] = sorted(faults)
    if name == "nvml-init-fails":
        state["nvml_error"] = NVML_FAILS if on else ""


def add_xid(
    state: dict[str, Any],
    gpu_uuid: str,
    xid: int,
    *,
    message: str = "",
    remap_pending: bool = False,
    at: datetime | None = None,
) -> dict[str, Any]:
    """The driver logs an Xid on a GPU (and, for a memory error, marks a row remap pending);
    the host's agent reports it as an event. Returns the event."""
    event = {
        "id": int(state.get("next_event_id", 1)),
        "ts": (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "gpu_uuid": gpu_uuid,
        "type": "xid",
        "xid": int(xid),
        "message": message or f"NVRM: Xid (simulated): {xid}",
    }
    state["next_event_id"] = event["id"] + 1
    state["events"] = [*state["events"][-99:], event]
    if remap_pending:
        for gpu in _gpus(state, [gpu_uuid]):
            gpu["health"]["remapped_rows_pending"] = True
    return event


# --- the agent of a host without an agent process -------------------------------------------------


def simulated_report(host: Any, seq: int, *, events_after: int | None = None) -> dict[str, Any]:
    """The agent report (the ``POST /api/v1/agent/reports`` body) that the agent's own
    ``simulated`` source makes from this host's state file, as sequence number ``seq``: faults
    show exactly as a running agent would show them. ``events_after``: the host's Xid events
    with a larger id are included (default: none)."""
    from nvke_agent.sources.base import SourceError
    from nvke_agent.sources.simulated import SimulatedSource

    ensure(host)
    source = SimulatedSource(state_path(host.id), events_after=events_after)
    error = code = None
    try:
        inventory = source.inventory()
        events = source.events()
    except SourceError as exc:
        inventory, events, error, code = None, [], str(exc), exc.code
    return {
        "host_id": str(host.id),
        "seq": seq,
        "agent_version": "in-process (simulated)",
        "source": source.name,
        "driver_version": inventory["driver_version"] if inventory else None,
        "cuda_version": inventory["cuda_version"] if inventory else None,
        "inventory": {"gpus": inventory["gpus"]} if inventory else None,
        "samples": [],
        "events": events if events_after is not None else [],
        "source_error": error,
        **({"source_error_code": code} if code else {}),
    }


def report_in_process(host: Any, *, events_after: int | None = None) -> bool:
    """Run the host's agent report in-process when no agent process is registered for it.

    The report is :func:`simulated_report`, stored by :func:`fleet.ingest.ingest_report`, the
    function behind ``POST /api/v1/agent/reports``. Hosts with a registered agent are left to
    it (returns False).
    """
    from fleet.ingest import ingest_report
    from fleet.models import Host

    if not settings.NVKE_SIMULATED_IN_PROCESS_AGENT:
        return False
    row = Host.objects.filter(pk=host.pk).values("registered_at", "last_report_seq").first()
    if row is None or row["registered_at"] is not None:
        return False
    seq = max(int(row["last_report_seq"]), IN_PROCESS_SEQ_BASE) + 1
    ingest_report(
        Host.objects.get(pk=host.pk), simulated_report(host, seq, events_after=events_after)
    )
    return True


def create_simulated_host(
    *,
    hostname: str,
    zone: str,
    gpu_model: str,
    gpus: int,
    nvlink_domain: tuple[Any, int] | None = None,
) -> Any:
    """A fleet host that exists only in the simulation (no capture to import it from): its
    GPUs get UUIDs ``GPU-sim-…`` derived from the hostname (so a re-run finds the same ones),
    its state file is written at once. Idempotent: an existing host is returned as it is.
    ``nvlink_domain`` (fabric cluster UUID, clique id) makes it a tray of a simulated
    multi-node NVLink system (GB200 NVL72), as an operator's import would say."""
    from catalog.models import GpuModel
    from fleet.models import Gpu, Host, region_of_zone

    existing = Host.objects.filter(hostname=hostname).first()
    if existing is not None:
        ensure(existing)
        return existing
    model = GpuModel.objects.get(slug=gpu_model)
    host = Host.objects.create(
        hostname=hostname,
        zone=zone,
        region=region_of_zone(zone),
        gpu_model=model,
        gpu_count=gpus,
        driver_version="570.172.08",
        cuda_version="12.8",
        nvlink_cluster_uuid=nvlink_domain[0] if nvlink_domain else None,
        nvlink_clique_id=nvlink_domain[1] if nvlink_domain else None,
        warnings=[f"{SIMULATED_NOTE}: created by the demo, not imported from a capture"],
    )
    Gpu.objects.bulk_create(
        [
            Gpu(
                uuid=f"GPU-sim-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'{hostname}/{i}')}",
                host=host,
                index=i,
                pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
                gpu_model=model,
                product_name=(model.product_names or [model.name])[0],
                memory_total_bytes=(model.memory_mib or 0) * 2**20 or None,
                mig_mode="disabled" if model.mig_capable else None,
            )
            for i in range(gpus)
        ]
    )
    ensure(host)
    return host
