"""Formats and bounds of what hosts tell NVKE (an imported ``nvidia-smi -q -x`` report, an
agent's inventory): checked before anything is written, so a bad value is a 400 naming it
instead of a database error, a wrapped integer or a row no later report can get past.

Sources: NVML ``nvmlDeviceGetUUID`` prints ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (hex);
MIG devices ``MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (R470+) or, on R450 drivers,
``MIG-GPU-<gpu uuid>/<gi>/<ci>`` (shared/catalog/nvml.md; the real captures in
``fleet/captures/`` all match). Simulated hosts (``GPU-sim-…``) are made in the database by the
test fixtures and the simulated provider, never through these paths.
"""

from __future__ import annotations

import re
from typing import Any

from nvke.validation import INT4

_HEX_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
GPU_UUID = re.compile(rf"GPU-{_HEX_UUID}")
MIG_UUID = re.compile(rf"MIG-{_HEX_UUID}|MIG-GPU-{_HEX_UUID}/[0-9]{{1,3}}/[0-9]{{1,3}}")

#: the most GPUs one host may have (NVIDIA's largest systems have 16; this leaves room)
MAX_GPUS_PER_HOST = 64
#: the most MIG devices one GPU may list (an A100/H100 has at most 7 GPU instances; a GPU
#: instance may hold several compute instances)
MAX_MIG_DEVICES_PER_GPU = 56
#: column lengths of fleet_gpu / fleet_host the reports fill
MAX_LENGTHS = {
    "pci_bus_id": 32,
    "product_name": 128,
    "serial": 64,
    "mig_mode": 16,
    "driver_version": 32,
    "cuda_version": 16,
}
#: JSON objects stored verbatim (``attributes``, ``health`` counters): entries and their size
MAX_OBJECT_ENTRIES = 64
MAX_OBJECT_TEXT = 256

SMALLINT = (0, 32767)
#: rows of an ``nvidia-smi topo -m`` matrix (GPUs, NICs, NVSwitches)
MAX_TOPOLOGY_ROWS = 256


class FormatError(ValueError):
    """A value breaks a format; ``field`` names it, ``code`` is stable for programs."""

    def __init__(self, field: str, code: str, message: str) -> None:
        self.field = field
        self.code = code
        super().__init__(message)


def check_gpu_uuid(value: Any, field: str) -> str:
    if not isinstance(value, str) or not GPU_UUID.fullmatch(value):
        raise FormatError(
            field,
            "invalid_gpu_uuid",
            f"{str(value)[:80]!r} is not an NVML GPU UUID "
            "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
        )
    return value


def check_mig_uuid(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not MIG_UUID.fullmatch(value):
        raise FormatError(field, "invalid_mig_uuid", f"{str(value)[:80]!r} is not a MIG UUID")
    return value


def check_length(value: Any, name: str, field: str) -> None:
    if isinstance(value, str) and len(value) > MAX_LENGTHS[name]:
        raise FormatError(
            field, "value_too_long", f"{name} is longer than {MAX_LENGTHS[name]} characters"
        )


def check_int(value: Any, field: str, bounds: tuple[int, int], *, nullable: bool = True) -> None:
    if value is None and nullable:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(field, "invalid_type", "must be an integer")
    if not bounds[0] <= value <= bounds[1]:
        raise FormatError(
            field, "number_out_of_range", f"must be an integer in [{bounds[0]}, {bounds[1]}]"
        )


def check_flat_object(value: Any, field: str) -> None:
    """A small JSON object of scalars (``attributes``, health counters)."""
    if not isinstance(value, dict):
        raise FormatError(field, "invalid_type", "must be an object")
    if len(value) > MAX_OBJECT_ENTRIES:
        raise FormatError(field, "too_many_entries", f"at most {MAX_OBJECT_ENTRIES} entries")
    for key, item in value.items():
        where = f"{field}.{key}"
        if len(str(key)) > MAX_OBJECT_TEXT:
            raise FormatError(where, "value_too_long", "key too long")
        if isinstance(item, str):
            if len(item) > MAX_OBJECT_TEXT:
                raise FormatError(where, "value_too_long", f"longer than {MAX_OBJECT_TEXT}")
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            check_int(item, where, (-(2**63), 2**63 - 1))
        elif isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                raise FormatError(where, "invalid_number", "must be finite")
        else:
            raise FormatError(where, "invalid_type", "values are strings, numbers or null")


#: ``inventory.gpus[].health``: the health facts the agent's sources send (agent/README.md;
#: ``nvke_agent.sources.nvml._health``, ``nvke_agent.smi_xml._health``, the simulated state's
#: ``health``), each ``null`` when the GPU does not report it. Flags are NVML's yes/no facts
#: (reset status, pending page retirement, remapped-row pending/failure), counts are NVML's
#: unsigned counters (ECC errors, retired pages, remapped rows; int8 like every stored counter),
#: ``mig_mode_pending`` is NVML's pending MIG mode and ``gpu_recovery_action`` NVML field 230
#: (``NVML_GPU_RECOVERY_ACTION_NONE`` 0 .. ``…_DRAIN_AND_RESET`` 4, catalog/xid.yaml). Anything
#: else would be stored verbatim and read by the health checks (``fleet.hygiene.gpu_findings``
#: tests ``is True``: a string ``"yes"`` would silently pass a GPU that needs a reset).
HEALTH_FLAGS = frozenset(
    {
        "reset_required",
        "drain_and_reset_recommended",
        "retired_pages_pending",
        "remapped_rows_pending",
        "remapped_rows_failure",
        "gpu_is_lost",  # NVML_ERROR_GPU_IS_LOST: fallen off the bus (agent/README.md)
    }
)
HEALTH_COUNTS = frozenset(
    {
        "ecc_volatile_uncorrected",
        "ecc_aggregate_uncorrected",
        "retired_pages_sbe",
        "retired_pages_dbe",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
    }
)
MIG_MODES = ("enabled", "disabled")
RECOVERY_ACTIONS = (0, 4)
_HEALTH_OTHER = frozenset({"mig_mode_pending", "gpu_recovery_action"})


def check_health(value: Any, field: str) -> None:
    """One GPU's ``health`` object of an agent inventory: only the keys in
    :data:`HEALTH_FLAGS` / :data:`HEALTH_COUNTS`, ``mig_mode_pending`` and
    ``gpu_recovery_action``, each of its type or ``null``. FormatError names the key:
    ``unknown_health_fact`` (a key no source sends), ``invalid_type`` (a flag that is not a
    boolean, a count that is not an integer, a MIG mode that is not ``enabled``/``disabled``),
    ``number_out_of_range`` (a negative or int8-overflowing count, a recovery action outside
    0..4)."""
    if not isinstance(value, dict):
        raise FormatError(field, "invalid_type", "health must be an object")
    for key, item in value.items():
        where = f"{field}.{str(key)[:64]}"
        if key not in HEALTH_FLAGS and key not in HEALTH_COUNTS and key not in _HEALTH_OTHER:
            raise FormatError(
                where,
                "unknown_health_fact",
                "not a health fact the agent sends (agent/README.md lists them)",
            )
        if item is None:
            continue
        if key in HEALTH_FLAGS:
            if not isinstance(item, bool):
                raise FormatError(where, "invalid_type", "must be true, false or null")
        elif key in HEALTH_COUNTS:
            check_int(item, where, (0, 2**63 - 1))
        elif key == "mig_mode_pending":
            if item not in MIG_MODES:
                raise FormatError(where, "invalid_type", "must be enabled, disabled or null")
        else:  # gpu_recovery_action
            check_int(item, where, RECOVERY_ACTIONS)


def check_smi_report(report: Any) -> None:
    """An imported ``nvidia-smi -q -x`` report (``SmiReport``) fits the fleet tables.

    Raises FormatError (field ``nvidia_smi_xml`` plus the GPU's position): ``too_many_gpus``,
    ``invalid_gpu_uuid``, ``invalid_mig_uuid``, ``duplicate_gpu_uuid``, ``value_too_long``,
    ``number_out_of_range``, ``too_many_mig_devices``.
    """
    field = "nvidia_smi_xml"
    if len(report.gpus) > MAX_GPUS_PER_HOST:
        raise FormatError(
            field,
            "too_many_gpus",
            f"the report lists {len(report.gpus)} GPUs; a host has at most {MAX_GPUS_PER_HOST}",
        )
    check_length(report.driver_version, "driver_version", field)
    check_length(report.cuda_version, "cuda_version", field)
    seen: set[str] = set()
    for gpu in report.gpus:
        where = f"{field}.gpu[{gpu.index}]"
        check_gpu_uuid(gpu.uuid, f"{where}.uuid")
        if gpu.uuid.lower() in seen:
            raise FormatError(f"{where}.uuid", "duplicate_gpu_uuid", f"{gpu.uuid} is listed twice")
        seen.add(gpu.uuid.lower())
        check_int(gpu.index, f"{where}.index", SMALLINT, nullable=False)
        check_int(gpu.minor_number, f"{where}.minor_number", SMALLINT)
        for name in ("pci_bus_id", "product_name", "mig_mode"):
            check_length(getattr(gpu, name), name, f"{where}.{name}")
        check_length(gpu.attributes.get("serial"), "serial", f"{where}.serial")
        if len(gpu.mig_devices) > MAX_MIG_DEVICES_PER_GPU:
            raise FormatError(f"{where}.mig_devices", "too_many_mig_devices", "too many")
        for j, device in enumerate(gpu.mig_devices):
            check_mig_uuid(device.uuid, f"{where}.mig_devices[{j}].uuid")
            check_int(device.gpu_instance_id, f"{where}.mig_devices[{j}].gpu_instance_id", INT4)


def _check_mig_geometry(gpu: dict, devices: list, where: str) -> None:
    """The MIG devices of one GPU must be able to exist together: none while MIG is disabled,
    each GPU instance within the 8 memory slices (start + size <= 8), one placement per GPU
    instance id (its compute instances share it), and no two GPU instances overlapping
    (NVIDIA MIG user guide: a GPU instance owns its memory slices). FormatError names the
    device."""
    if gpu.get("mig_mode") == "disabled" and devices:
        raise FormatError(
            f"{where}.mig_devices", "invalid_value", "MIG devices listed while mig_mode is disabled"
        )
    placed: dict[int, tuple[int, int]] = {}
    for j, device in enumerate(devices):
        start, size = device.get("placement_start"), device.get("placement_size")
        if start is None or size is None:
            continue
        at = f"{where}.mig_devices[{j}]"
        if start + size > 8:
            raise FormatError(
                f"{at}.placement_size", "number_out_of_range", "start + size must be at most 8"
            )
        gi = device.get("gpu_instance_id")
        if gi in placed:
            if placed[gi] != (start, size):
                raise FormatError(
                    f"{at}.placement_start",
                    "invalid_value",
                    f"GPU instance {gi} is listed at two placements",
                )
            continue
        for other, (o_start, o_size) in placed.items():
            if start < o_start + o_size and o_start < start + size:
                raise FormatError(
                    f"{at}.placement_start",
                    "overlapping_mig_devices",
                    f"overlaps GPU instance {other} (slices {o_start}-{o_start + o_size - 1})",
                )
        placed[gi if gi is not None else -1 - j] = (start, size)


def check_inventory(inventory: Any, known_uuids: frozenset[str] | set[str] = frozenset()) -> None:
    """An agent report's ``inventory`` (wire format in agent/README.md), whole: a malformed
    one is refused before anything is applied (and never stored), so the host's next good
    report is accepted. A GPU UUID is in NVML's format or one the host already has
    (``known_uuids``: simulated hosts' ``GPU-sim-…``). Raises FormatError with the path inside
    the report (``inventory.gpus[2].mig_devices[0].gpu_instance_id``)."""
    if not isinstance(inventory, dict):
        raise FormatError("inventory", "invalid_type", "inventory must be an object")
    topo = inventory.get("topology")
    if topo is not None:
        links = topo.get("links") if isinstance(topo, dict) else None
        if (
            not isinstance(topo, dict)
            or not isinstance(links, list)
            or len(links) > MAX_TOPOLOGY_ROWS
            or not all(
                isinstance(row, list)
                and len(row) <= MAX_TOPOLOGY_ROWS
                and all(isinstance(c, str) and len(c) <= 16 for c in row)
                for row in links
            )
        ):
            raise FormatError(
                "inventory.topology.links",
                "invalid_type",
                f"links is a matrix (at most {MAX_TOPOLOGY_ROWS} rows) of link names",
            )
    gpus = inventory.get("gpus")
    if gpus is None:
        return
    if not isinstance(gpus, list):
        raise FormatError("inventory.gpus", "invalid_type", "gpus must be a list")
    if len(gpus) > MAX_GPUS_PER_HOST:
        raise FormatError("inventory.gpus", "too_many_gpus", f"at most {MAX_GPUS_PER_HOST}")
    seen: set[str] = set()
    for i, gpu in enumerate(gpus):
        where = f"inventory.gpus[{i}]"
        if not isinstance(gpu, dict):
            raise FormatError(where, "invalid_type", "each GPU is an object")
        uuid = gpu.get("uuid")
        if not isinstance(uuid, str) or len(uuid) > 64 or uuid not in known_uuids:
            check_gpu_uuid(uuid, f"{where}.uuid")
        if gpu["uuid"] in seen:
            raise FormatError(f"{where}.uuid", "duplicate_gpu_uuid", "listed twice")
        seen.add(gpu["uuid"])
        if "mig_mode" in gpu and gpu["mig_mode"] not in ("enabled", "disabled", None):
            raise FormatError(f"{where}.mig_mode", "invalid_value", "enabled, disabled or null")
        devices = gpu.get("mig_devices")
        if devices is not None:
            if not isinstance(devices, list) or len(devices) > MAX_MIG_DEVICES_PER_GPU:
                raise FormatError(
                    f"{where}.mig_devices", "invalid_type", "a list of at most 56 MIG devices"
                )
            for j, device in enumerate(devices):
                at = f"{where}.mig_devices[{j}]"
                if not isinstance(device, dict):
                    raise FormatError(at, "invalid_type", "each MIG device is an object")
                check_mig_uuid(device.get("uuid"), f"{at}.uuid")
                for key in ("gpu_instance_id", "compute_instance_id", "index"):
                    check_int(device.get(key), f"{at}.{key}", (0, INT4[1]))  # NVML: unsigned
                for key in ("memory_total_bytes", "memory_used_bytes", "multiprocessor_count"):
                    check_int(device.get(key), f"{at}.{key}", (0, 2**63 - 1))
                # a GPU instance starts at a memory slice 0-7 and spans 1-8 (NVIDIA MIG user
                # guide, placements: 8 memory slices on every MIG-capable GPU)
                check_int(device.get("placement_start"), f"{at}.placement_start", (0, 7))
                check_int(device.get("placement_size"), f"{at}.placement_size", (1, 8))
                for key, longest in (("profile", 32), ("name", 128)):
                    text = device.get(key)
                    if text is not None and (not isinstance(text, str) or len(text) > longest):
                        raise FormatError(
                            f"{at}.{key}", "invalid_type", f"a string of at most {longest} or null"
                        )
                if len(device) > MAX_OBJECT_ENTRIES:
                    raise FormatError(at, "too_many_entries", f"at most {MAX_OBJECT_ENTRIES}")
            _check_mig_geometry(gpu, devices, where)
        scrubs = gpu.get("slice_scrubs")
        if scrubs is not None:
            if not isinstance(scrubs, list) or len(scrubs) > MAX_MIG_DEVICES_PER_GPU:
                raise FormatError(
                    f"{where}.slice_scrubs", "invalid_type", "a list of at most 56 slice scrubs"
                )
            for j, scrub in enumerate(scrubs):
                check_flat_object(scrub, f"{where}.slice_scrubs[{j}]")
                for key in ("start", "size"):
                    check_int(scrub.get(key), f"{where}.slice_scrubs[{j}].{key}", (0, 64))
        if gpu.get("health") is not None:
            check_health(gpu["health"], f"{where}.health")
        if gpu.get("attributes") is not None:
            check_flat_object(gpu["attributes"], f"{where}.attributes")
        serial = (gpu.get("attributes") or {}).get("serial")
        if serial is not None and not isinstance(serial, str):
            raise FormatError(f"{where}.attributes.serial", "invalid_type", "a string")
        if "fabric" in gpu:
            from .nvlink_domains import check_fabric  # it imports this module

            check_fabric(gpu["fabric"], f"{where}.fabric")
