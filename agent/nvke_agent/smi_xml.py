"""Parser for ``nvidia-smi -q -x`` reports (the ``nvidia_smi_log`` XML document).

The NVKE server imports this module too (to import hosts from a report), so the public API
(:class:`NotAnNvidiaSmiReport`, :class:`SmiMigDevice`, :class:`SmiGpu`, :class:`SmiReport`,
:func:`parse_nvidia_smi_xml`) is a contract: change it only together with the server.

Facts the parser relies on (checked against real captures in ``shared/data/nvidia-smi-xml``:
A100-SXM4-80GB v12 DTD with MIG on, A10G and Tesla T4 v11 DTD, RTX 4000 SFF Ada v13 DTD):

* Reports start with ``<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_vNN.dtd">``. That line is
  accepted; entity declarations and external references are refused (defusedxml defaults,
  DESIGN.md §5), so "billion laughs" and XXE documents raise :class:`NotAnNvidiaSmiReport`.
* Values carry units as text: memory ``"81920 MiB"`` (MiB = 2**20 bytes), power ``"67.03 W"``,
  temperature ``"27 C"``, utilization ``"0 %"``. Unavailable values are printed as ``N/A``
  (e.g. utilization on a MIG-enabled GPU — NVML returns NotSupported there, nvml.md §3),
  ``[N/A]``, ``[Not Supported]`` or ``Requested functionality has been deprecated``; all of these
  and missing elements become ``None`` (never 0).
* Power is ``<gpu_power_readings><power_draw>`` (v12) or ``<power_readings><power_draw>`` (v11);
  the v13 DTD replaced ``power_draw`` with ``instant_power_draw`` and ``average_power_draw``
  (instant is preferred, like v12's instantaneous reading).
* Volatile uncorrectable ECC counters are ``<ecc_errors><volatile>`` children whose name contains
  ``uncorrectable`` (v11/v12: ``sram_uncorrectable``, ``dram_uncorrectable``; v13 splits SRAM
  into ``sram_uncorrectable_parity`` and ``sram_uncorrectable_secded``); older DTDs use
  ``<volatile><double_bit><total>``.
* MIG device UUIDs are not printed in v12 captures; when absent they are ``None``.
* Health facts (:attr:`SmiGpu.health`): ``<gpu_reset_status>`` (v12+), ``<retired_pages>``
  (pre-Ampere page retirement: counts, ``pending_retirement``), ``<remapped_rows>`` (Ampere+:
  ``remapped_row_corr/unc/pending/failure``; the whole element is ``N/A`` with MIG on, nvml.md
  §3), ``<ecc_errors><aggregate>`` (lifetime counts), ``<mig_mode><pending_mig>``.
* Clock event reasons are ``<clocks_event_reasons>`` (v12+) or ``<clocks_throttle_reasons>``
  (v11), one child per reason saying ``Active``/``Not Active``; they become NVML's bit mask
  (``nvmlClocksEventReason*`` constants of nvidia-ml-py: GpuIdle 0x1 … DisplayClockSetting
  0x100).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

import defusedxml.ElementTree as DefusedET
from defusedxml import DefusedXmlException

from nvke_agent.fabric import fabric_from_smi

__all__ = [
    "NotAnNvidiaSmiReport",
    "SmiGpu",
    "SmiMigDevice",
    "SmiReport",
    "parse_nvidia_smi_xml",
]

ROOT_TAG = "nvidia_smi_log"

# Texts nvidia-smi prints instead of a value (with or without square brackets).
_UNAVAILABLE = frozenset(
    {
        "",
        "n/a",
        "none",
        "not supported",
        "unknown error",
        "insufficient permissions",
        "requested functionality has been deprecated",
        "gpu requires reset",
        "not available",
    }
)

_BYTES_PER_UNIT = {
    "B": 1,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}

MAX_BYTES = 2**63 - 1  # the largest size NVKE stores (int8 columns)
#: ASCII digits only: ``\d`` alone would read Arabic-Indic "80 MiB" as 80 MiB
_NUMBER_WITH_UNIT = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([A-Za-z%]*)\s*$", re.ASCII)

#: nvmlClocksEventReason* bits by the reason's element suffix (nvidia-ml-py constants)
CLOCK_EVENT_REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}


class NotAnNvidiaSmiReport(ValueError):
    """XML that is not an `nvidia-smi -q -x` report, is malformed, or carries entity declarations / external references (refused)."""  # noqa: E501


@dataclass(frozen=True)
class SmiMigDevice:
    """One MIG device (``<mig_device>``) of a MIG-enabled GPU.

    ``index`` is the MIG device index within its GPU; ``gpu_instance_id`` / ``compute_instance_id``
    are the GI/CI ids (``nvidia-smi mig -lgi`` ids); memory in bytes; ``uuid`` is ``MIG-…`` when
    the report prints it (v12 reports do not).
    """

    index: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    uuid: str | None
    multiprocessor_count: int | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None


@dataclass(frozen=True)
class SmiGpu:
    """One physical GPU (``<gpu>`` element).

    Units: memory in bytes, utilization in percent (0..100, ``None`` when N/A — e.g. MIG mode,
    never 0), power in milliwatts, temperature in °C, ECC as an error count.
    """

    index: int  # position of the <gpu> element in the report (NVML enumeration order)
    pci_bus_id: str
    minor_number: int | None
    uuid: str
    product_name: str
    product_architecture: str | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    mig_mode: str | None  # "enabled" | "disabled" | None when N/A (GPU without MIG)
    mig_devices: tuple[SmiMigDevice, ...]
    utilization_gpu_pct: float | None  # None for "N/A" (MIG mode), never 0
    utilization_memory_pct: float | None
    power_draw_mw: int | None  # <power_draw> or v13 <instant_power_draw>/<average_power_draw>
    temperature_c: float | None
    ecc_volatile_uncorrected: int | None  # sum of volatile uncorrectable counters, else None
    ecc_volatile_corrected: int | None = None  # sum of volatile correctable counters
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    clocks_event_reasons: int | None = None  # NVML bit mask, None when not printed
    #: health facts, the wire's ``inventory.gpus[].health`` (keys in module docstring)
    health: dict = field(default_factory=dict)
    #: static facts, the wire's ``inventory.gpus[].attributes``
    attributes: dict = field(default_factory=dict)
    #: the ``<fabric>`` section (multi-node NVLink) as the wire's ``inventory.gpus[].fabric``
    #: (:mod:`nvke_agent.fabric`); None when absent or ``N/A``
    fabric: dict | None = None


@dataclass(frozen=True)
class SmiReport:
    """A whole ``nvidia-smi -q -x`` report.

    ``attached_gpus`` is what nvidia-smi says is attached; it can differ from ``len(gpus)``
    (trimmed captures, or GPUs hidden by ``CUDA_VISIBLE_DEVICES``/cgroups).
    """

    timestamp: str | None
    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None
    gpus: tuple[SmiGpu, ...]


def parse_nvidia_smi_xml(data: bytes | str) -> SmiReport:
    """Parse the output of ``nvidia-smi -q -x``.

    Raises :class:`NotAnNvidiaSmiReport` for malformed XML, XML with entity declarations or
    external references, a root element other than ``<nvidia_smi_log>``, or a ``<gpu>`` without
    a UUID, product name or PCI bus id.
    """
    root = _parse_safely(data)
    if root.tag != ROOT_TAG:
        raise NotAnNvidiaSmiReport(
            f"not an nvidia-smi -q -x report: root element is <{root.tag}>, expected <{ROOT_TAG}>"
        )
    gpus = tuple(_parse_gpu(index, el) for index, el in enumerate(root.findall("gpu")))
    return SmiReport(
        timestamp=_text(root, "timestamp"),
        driver_version=_text(root, "driver_version"),
        cuda_version=_text(root, "cuda_version"),
        attached_gpus=_int(_text(root, "attached_gpus")),
        gpus=gpus,
    )


# --- XML -----------------------------------------------------------------------------------


def _parse_safely(data: bytes | str) -> ET.Element:
    # defusedxml defaults: forbid_dtd=False (the report's DOCTYPE line is fine),
    # forbid_entities=True, forbid_external=True.
    try:
        root: ET.Element = DefusedET.fromstring(data)
    except DefusedXmlException as exc:
        raise NotAnNvidiaSmiReport(
            f"refused XML with entity declarations or external references: {exc!r}"
        ) from exc
    except ET.ParseError as exc:
        raise NotAnNvidiaSmiReport(f"malformed XML: {exc}") from exc
    return root


def _text(parent: ET.Element, path: str) -> str | None:
    """Stripped text at ``path``, or ``None`` if missing or an "unavailable" marker."""
    el = parent.find(path)
    if el is None or el.text is None:
        return None
    text = el.text.strip()
    if text.strip("[]").strip().lower() in _UNAVAILABLE:
        return None
    return text


def _number(text: str | None, unit: str) -> Decimal | None:
    if text is None:
        return None
    match = _NUMBER_WITH_UNIT.match(text)
    if match is None or match.group(2) != unit:
        return None
    try:
        return Decimal(match.group(1))
    except InvalidOperation:  # pragma: no cover - the regex only admits valid numbers
        return None


def _int(text: str | None) -> int | None:
    value = _number(text, "")
    if value is None or value != value.to_integral_value():
        return None
    return int(value)


def _bytes(text: str | None) -> int | None:
    """``"81920 MiB"`` -> 85899345920 (binary units, as nvidia-smi prints them)."""
    if text is None:
        return None
    match = _NUMBER_WITH_UNIT.match(text)
    if match is None or match.group(2) not in _BYTES_PER_UNIT:
        return None
    value = int(Decimal(match.group(1)) * _BYTES_PER_UNIT[match.group(2)])
    # a negative size, or one past any 64-bit counter NVML has, is not a reading
    return value if 0 <= value <= MAX_BYTES else None


def _percent(text: str | None) -> float | None:
    value = _number(text, "%")
    return None if value is None else float(value)


def _milliwatts(text: str | None) -> int | None:
    """``"67.03 W"`` -> 67030 (exact: decimal arithmetic, rounded to the milliwatt)."""
    value = _number(text, "W")
    return None if value is None else int((value * 1000).to_integral_value())


def _celsius(text: str | None) -> float | None:
    value = _number(text, "C")
    return None if value is None else float(value)


# --- elements ------------------------------------------------------------------------------


def _parse_gpu(index: int, gpu: ET.Element) -> SmiGpu:
    uuid = _text(gpu, "uuid")
    product_name = _text(gpu, "product_name")
    pci_bus_id = _text(gpu, "pci/pci_bus_id") or (gpu.get("id") or "").strip() or None
    missing = [
        name
        for name, value in (
            ("uuid", uuid),
            ("product_name", product_name),
            ("pci_bus_id", pci_bus_id),
        )
        if value is None
    ]
    if missing:
        raise NotAnNvidiaSmiReport(f"<gpu> #{index} has no {', '.join(missing)}")
    assert uuid is not None and product_name is not None and pci_bus_id is not None
    return SmiGpu(
        index=index,
        pci_bus_id=pci_bus_id,
        minor_number=_int(_text(gpu, "minor_number")),
        uuid=uuid,
        product_name=product_name,
        product_architecture=_text(gpu, "product_architecture"),
        memory_total_bytes=_bytes(_text(gpu, "fb_memory_usage/total")),
        memory_used_bytes=_bytes(_text(gpu, "fb_memory_usage/used")),
        mig_mode=_mig_mode(_text(gpu, "mig_mode/current_mig")),
        mig_devices=tuple(
            _parse_mig_device(position, el)
            for position, el in enumerate(gpu.findall("mig_devices/mig_device"))
        ),
        utilization_gpu_pct=_percent(_text(gpu, "utilization/gpu_util")),
        utilization_memory_pct=_percent(_text(gpu, "utilization/memory_util")),
        power_draw_mw=_power_draw_mw(gpu),
        temperature_c=_celsius(_text(gpu, "temperature/gpu_temp")),
        ecc_volatile_uncorrected=_ecc_volatile_uncorrected(gpu),
        ecc_volatile_corrected=_ecc_sum(gpu.find("ecc_errors/volatile"), "correctable"),
        sm_clock_mhz=_mhz(_text(gpu, "clocks/sm_clock")),
        memory_clock_mhz=_mhz(_text(gpu, "clocks/mem_clock")),
        clocks_event_reasons=_clock_event_reasons(gpu),
        health=_health(gpu),
        attributes=_attributes(gpu),
        fabric=fabric_from_smi(
            _text(gpu, "fabric/state"),
            _text(gpu, "fabric/status"),
            _text(gpu, "fabric/cliqueId"),
            _text(gpu, "fabric/clusterUuid"),
        ),
    )


def _parse_mig_device(position: int, el: ET.Element) -> SmiMigDevice:
    index = _int(_text(el, "index"))
    return SmiMigDevice(
        index=index if index is not None else position,
        gpu_instance_id=_int(_text(el, "gpu_instance_id")),
        compute_instance_id=_int(_text(el, "compute_instance_id")),
        uuid=_text(el, "uuid"),
        multiprocessor_count=_int(_text(el, "device_attributes/shared/multiprocessor_count")),
        memory_total_bytes=_bytes(_text(el, "fb_memory_usage/total")),
        memory_used_bytes=_bytes(_text(el, "fb_memory_usage/used")),
    )


def _mig_mode(text: str | None) -> str | None:
    if text is None:
        return None
    lowered = text.lower()
    return lowered if lowered in ("enabled", "disabled") else None


def _power_draw_mw(gpu: ET.Element) -> int | None:
    # <gpu_power_readings> (v12, v13) or <power_readings> (v11); never <module_power_readings>.
    for section in ("gpu_power_readings", "power_readings"):
        for name in ("power_draw", "instant_power_draw", "average_power_draw"):
            value = _milliwatts(_text(gpu, f"{section}/{name}"))
            if value is not None:
                return value
    return None


def _mhz(text: str | None) -> int | None:
    value = _number(text, "MHz")
    return None if value is None else int(value)


def _yes_no(text: str | None) -> bool | None:
    if text is None:
        return None
    lowered = text.strip().lower()
    return True if lowered == "yes" else False if lowered == "no" else None


def _ecc_sum(section: ET.Element | None, kind: str) -> int | None:
    """Sum of the leaf counters of an ECC section whose name ends in ``_<kind>`` (or contains
    ``<kind>_``): ``correctable`` or ``uncorrectable``; None when none is printed."""
    if section is None:
        return None
    counts = [
        _int(_text(section, child.tag))
        for child in section
        if len(child) == 0
        and (child.tag.endswith(kind) or f"{kind}_" in child.tag)
        and not (kind == "correctable" and "uncorrectable" in child.tag)
    ]
    known = [count for count in counts if count is not None]
    return sum(known) if known else None


def _clock_event_reasons(gpu: ET.Element) -> int | None:
    for section, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        el = gpu.find(section)
        if el is None:
            continue
        mask, seen = 0, False
        for child in el:
            bit = CLOCK_EVENT_REASON_BITS.get(child.tag.removeprefix(prefix))
            state = (child.text or "").strip().lower()
            if bit is None or state not in ("active", "not active"):
                continue
            seen = True
            if state == "active":
                mask |= bit
        return mask if seen else None
    return None


def _health(gpu: ET.Element) -> dict:
    """The health facts of a ``<gpu>`` (None for what it does not print)."""
    return {
        "reset_required": _yes_no(_text(gpu, "gpu_reset_status/reset_required")),
        "drain_and_reset_recommended": _yes_no(
            _text(gpu, "gpu_reset_status/drain_and_reset_recommended")
        ),
        "ecc_volatile_uncorrected": _ecc_volatile_uncorrected(gpu),
        "ecc_aggregate_uncorrected": _ecc_sum(gpu.find("ecc_errors/aggregate"), "uncorrectable"),
        "retired_pages_sbe": _int(
            _text(gpu, "retired_pages/multiple_single_bit_retirement/retired_count")
        ),
        "retired_pages_dbe": _int(_text(gpu, "retired_pages/double_bit_retirement/retired_count")),
        "retired_pages_pending": _yes_no(_text(gpu, "retired_pages/pending_retirement")),
        "remapped_rows_correctable": _int(_text(gpu, "remapped_rows/remapped_row_corr")),
        "remapped_rows_uncorrectable": _int(_text(gpu, "remapped_rows/remapped_row_unc")),
        "remapped_rows_pending": _yes_no(_text(gpu, "remapped_rows/remapped_row_pending")),
        "remapped_rows_failure": _yes_no(_text(gpu, "remapped_rows/remapped_row_failure")),
        "mig_mode_pending": _mig_mode(_text(gpu, "mig_mode/pending_mig")),
        "gpu_recovery_action": None,  # not printed by nvidia-smi -q -x in the captures seen
    }


def _attributes(gpu: ET.Element) -> dict:
    """Static facts of a ``<gpu>``: serial, architecture, VBIOS, power limits (mW), max clocks."""
    limit = None
    for path in (
        "gpu_power_readings/current_power_limit",
        "power_readings/enforced_power_limit",
        "power_readings/power_limit",
    ):
        limit = _milliwatts(_text(gpu, path))
        if limit is not None:
            break
    section = (
        "gpu_power_readings" if gpu.find("gpu_power_readings") is not None else "power_readings"
    )
    serial = _text(gpu, "serial")
    return {
        "serial": serial if serial and serial.strip("0") and serial != "REDACTED" else None,
        "architecture": _text(gpu, "product_architecture"),
        "compute_capability": None,
        "vbios_version": _text(gpu, "vbios_version"),
        "power_limit_mw": limit,
        "power_limit_default_mw": _milliwatts(_text(gpu, f"{section}/default_power_limit")),
        "power_limit_max_mw": _milliwatts(_text(gpu, f"{section}/max_power_limit")),
        "max_sm_clock_mhz": _mhz(_text(gpu, "max_clocks/sm_clock")),
        "max_memory_clock_mhz": _mhz(_text(gpu, "max_clocks/mem_clock")),
        "nvlink_links_active": None,
    }


def _ecc_volatile_uncorrected(gpu: ET.Element) -> int | None:
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None
    counts = [
        _int(_text(volatile, child.tag))
        for child in volatile
        if "uncorrectable" in child.tag and len(child) == 0
    ]
    known = [count for count in counts if count is not None]
    if known:
        return sum(known)
    return _int(_text(volatile, "double_bit/total"))
