"""Agent report ingestion: idempotent on ``(host, seq)``, samples written with COPY.

A report (wire format in ``agent/README.md``) carries samples, events, sometimes the host's
inventory, and the results of commands. In one transaction:

1. ``INSERT … ON CONFLICT (host, seq) DO NOTHING`` claims the report: a duplicate answers the
   first acknowledgement again and writes nothing (the agent resends after a lost answer).
   The same seq with other content (:func:`content_digest`) is a second agent using the
   host's credential: flagged and kept as evidence (:func:`_record_identity_conflict`).
2. Samples are COPYed into a staging table and moved into ``fleet_gpusample`` with
   ``ON CONFLICT DO NOTHING`` (day partitions made on demand). What real
   fleets send is handled here, each case counted in ``rejections`` / the ack:

   * ``unknown_gpu``: a sample of a GPU that is not this host's is not stored. A MIG device
     UUID (``MIG-…``) of one of the host's GPUs is stored as that GPU with its GI id;
   * the agent's clock: its skew is ``sent_at`` against the receive time (never a sample's
     age: a spool replayed after an outage is old, not skewed); beyond
     ``NVKE_AGENT_CLOCK_SKEW_WARNING_S``, ahead or behind, every sample and Xid time of the
     report is re-dated by the measured offset (:func:`clock_correction`) and the host warned;
   * ``ts_in_future`` / ``ts_older_than_retention``: a timestamp (after that correction) more
     than ``NVKE_SAMPLE_MAX_FUTURE_S`` ahead of the server, or older than the retention
     period, is rejected (never clamped: a moved timestamp would put the reading in the wrong
     minute);
   * duplicates: the same ``(gpu, MIG GI, ts)`` twice in one report (a physical GPU printed once
     per MIG instance), or a sample already stored by an earlier report (data re-sent under a
     new seq), is stored once and counted in ``samples_deduplicated`` — samples are unique per
     ``(gpu, MIG GI, ts)`` in the table (:func:`store_samples`);
   * utilization ``null`` (MIG mode ``N/A``) stays null, never 0.
3. Xid events are stored and mapped to health (:func:`fleet.health.handle_xid`), the stored
   samples run through the health rules on sample signals (:func:`fleet.health.handle_samples`:
   ECC count increases, slowdown bits turning on); an Xid dated
   before the host's newest sample already received (any GPU) is ``late`` and credits from
   that sample (:func:`_flag_late_xids`). An Xid naming a GPU the host does not own refuses
   the whole report (400, field ``events[i].gpu_uuid``): nothing is stored.
4. The inventory is compared with the host: a GPU the agent no longer lists, or lists lost
   (``health.gpu_is_lost``: NVML_ERROR_GPU_IS_LOST, fallen off the bus; only its health is
   read), is flagged (``Gpu.missing_since``, a host warning, an unhealthy interval) — the
   host is never shrunk; health facts turning on (row remap, lost) are run through the
   health rules first (:func:`fleet.health.handle_flags`);
   a GPU it lists that the host does not have is a warning. NVML health facts re-verify the
   host (:func:`fleet.hygiene.check_from_inventory`); a topology fills ``Host.topology``.
5. Scrub results and DCGM diagnostics are applied; liveness, versions, the source's error
   (``source_error``: NVML does not initialise …, kept in ``Host.agent_source_error`` and
   shown as a host warning; with ``source_error_code`` an NVML init error, one
   ``nvml_init_failure`` occurrence on each of the host's GPUs for the health rules,
   :func:`fleet.health.handle_nvml_init_failure`, before the GPUs become unknown) and the
   inventory clock (``inventory_at``/``inventory_count``: reports that read the GPUs, or say
   why they could not; read by the observed-state gates) are updated last, so the host row
   is locked only for the end of the transaction.

The acknowledgement is ``{"seq", "duplicate", "samples_stored", "samples_rejected",
"samples_deduplicated", "rejections": {reason: count}, "commands": [...]}``; ``commands``
carries the pending scrubs of the host (:func:`fleet.hygiene.pending_scrub_commands`).
Two keys appear only when they apply: ``samples_redated`` (samples moved by the clock
correction) and ``identity_conflict: true`` (this seq was first received with other content).

A *status report* (``seq`` null, nothing produced, only ``agent_status``; see
:func:`is_status_report`) comes from an agent that cannot write its state dir and has nothing
spooled: it sets the host's warnings and is answered with ``seq`` null.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from django.db import connection, transaction
from django.utils import timezone

from nvke.validation import BadValue, to_utc

from . import (
    conf,
    formats,
    health,
    health_rules,
    host_warnings,
    hygiene,
    metrics,
    nvlink_domains,
    shared_hosts,
    topology,
)
from .choices import GpuHealth, HealthReason, HostEventKind, HostTenancy
from .models import Gpu, Host, HostEvent, XidEvent
from .partitions import ensure_partitions
from .signals import gpu_facts_changed

log = logging.getLogger(__name__)

SAMPLE_COLUMNS = (
    "ts",
    "host_id",
    "gpu_uuid",
    "mig_gpu_instance_id",
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "memory_used_bytes",
    "memory_total_bytes",
    "power_mw",
    "energy_mj",
    "temperature_c",
    "ecc_volatile_uncorrected",
    "ecc_volatile_corrected",
    "sm_clock_mhz",
    "memory_clock_mhz",
    "clocks_event_reasons",
    "report_seq",
)
#: (wire/column name, type) of the measurements, in SAMPLE_COLUMNS order
NUMERIC_FIELDS = (
    ("utilization_gpu_pct", float),
    ("utilization_memory_pct", float),
    ("memory_used_bytes", int),
    ("memory_total_bytes", int),
    ("power_mw", int),
    ("energy_mj", int),
    ("temperature_c", float),
    ("ecc_volatile_uncorrected", int),
    ("ecc_volatile_corrected", int),
    ("sm_clock_mhz", int),
    ("memory_clock_mhz", int),
    ("clocks_event_reasons", int),
)
_INT64 = 2**63 - 1
_INT4_MAX = 2**31 - 1
#: NVKE's ceiling on one GPU's power reading: 10 kW, 20x the highest power limit in the real
#: captures (A100-SXM4 500 W, shared/data/nvidia-smi-xml) and far above any data-center GPU's
#: board power; NVML's reading is an average that stays near the enforced limit.
MAX_POWER_MW = 10_000_000
#: the energy counter (mJ since the driver loaded, nvmlDeviceGetTotalEnergyConsumption) of a GPU
#: drawing MAX_POWER_MW for 100 years: 3.16e16 mJ, three orders below int8's end
MAX_ENERGY_MJ = MAX_POWER_MW * 100 * 31_557_600  # mW x s = mJ
#: NVML reports temperatures as an unsigned int in °C; every GPU shuts down near 100 °C (the
#: captures' gpu_temp_max_threshold: 92-98 °C), so 150 °C is no reading a running GPU gives
MAX_TEMPERATURE_C = 150.0
#: clocks: 3x the highest in the real captures (SM 3,105 MHz on RTX 4000 SFF Ada, memory
#: 7,001 MHz GDDR6) and above GDDR6X's 10,501 MHz
MAX_SM_CLOCK_MHZ = 10_000
MAX_MEMORY_CLOCK_MHZ = 20_000
#: the range of each measurement. Integers: what NVML can report (unsigned counters, bytes, mW,
#: mJ, MHz, a bitmask: never negative) within the column (SAMPLE_TYPES: int4 clocks, int8 the
#: rest; binary COPY would otherwise wrap it) and within physics (power, energy, clocks: the
#: ceilings above). Floats: percentages 0-100 (NVML utilization rates), temperatures 0-150 °C
#: (a 1e308 would also overflow the rollups' sums). A value outside is refused (400,
#: ``number_out_of_range``) and with it the report, like every malformed sample. Memory is
#: bounded by the GPU's own total (:func:`_check_memory`).
_BOUNDS: dict[str, tuple[float, float]] = {
    "utilization_gpu_pct": (0.0, 100.0),
    "utilization_memory_pct": (0.0, 100.0),
    "temperature_c": (0.0, MAX_TEMPERATURE_C),
    "power_mw": (0, MAX_POWER_MW),
    "energy_mj": (0, MAX_ENERGY_MJ),
    "sm_clock_mhz": (0, MAX_SM_CLOCK_MHZ),
    "memory_clock_mhz": (0, MAX_MEMORY_CLOCK_MHZ),
}
#: how far a sample's ``memory_total_bytes`` may exceed the GPU's recorded total (NVML's total
#: at import, else the catalog's ``memory_mib``): NVML's total moves by a few MiB between driver
#: versions (catalog: A100-40GB 40537 vs 40536 MiB), never by 1 %
MEMORY_TOTAL_SLACK = 0.01

UNKNOWN_GPU = "unknown_gpu"
TS_IN_FUTURE = "ts_in_future"
TS_TOO_OLD = "ts_older_than_retention"


class InvalidReport(ValueError):
    """The report body breaks the wire format; ``field`` names where, ``code`` says what
    (``invalid_report`` unless a more exact one applies: ``number_out_of_range``,
    ``datetime_out_of_range``, ``too_many_samples``, ``invalid_gpu_uuid`` …)."""

    def __init__(self, field: str, message: str, code: str = "invalid_report") -> None:
        self.field = field
        self.code = code
        super().__init__(message)


#: the most entries one report may carry (the agent sends at most 10,000 samples a report)
MAX_SAMPLES_PER_REPORT = 20_000
MAX_EVENTS_PER_REPORT = 1_000
MAX_SCRUB_RESULTS_PER_REPORT = 64
MAX_SCRUB_STEPS = 32


@dataclass(frozen=True)
class Ack:
    """What the agent gets back: it deletes the spooled batch on any Ack."""

    #: None for a status report (:func:`ingest_status`): nothing was produced under a seq
    seq: int | None
    duplicate: bool
    samples_stored: int
    samples_rejected: int
    samples_deduplicated: int = 0
    rejections: dict[str, int] = field(default_factory=dict)
    commands: list[dict[str, Any]] = field(default_factory=list)
    #: samples whose ``ts`` was moved by the measured clock offset (:func:`clock_correction`)
    samples_redated: int = 0
    #: this seq was first received with other content: a second agent uses the credential
    identity_conflict: bool = False

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "seq": self.seq,
            "duplicate": self.duplicate,
            "samples_stored": self.samples_stored,
            "samples_rejected": self.samples_rejected,
            "samples_deduplicated": self.samples_deduplicated,
            "rejections": self.rejections,
            "commands": self.commands,
        }
        # the conditions below are exceptional: their keys appear only when they happened
        if self.samples_redated:
            out["samples_redated"] = self.samples_redated
        if self.identity_conflict:
            out["identity_conflict"] = True
        return out


@dataclass
class _Parsed:
    rows: list[tuple]
    rejections: dict[str, int]
    deduplicated: int
    min_ts: datetime | None
    max_ts: datetime | None


def ingest_report(host: Host, body: dict[str, Any], now: datetime | None = None) -> Ack:
    """Store one agent report for ``host``. Idempotent on ``(host, seq)``.

    Raises InvalidReport for a body that breaks the wire format (nothing is stored).
    """
    now = now or timezone.now()
    if body.get("seq") is None and is_status_report(body):
        return ingest_status(host, body, now)
    seq = _seq(body)
    if str(body.get("host_id", host.id)) != str(host.id):
        raise InvalidReport("host_id", "host_id does not match the credential's host")
    inventory = body.get("inventory")
    gpus = _host_gpus(host, fresh=isinstance(inventory, dict))
    _check_batches(body, inventory, gpus)
    skew = _clock_skew(body.get("sent_at"), now)
    shift = clock_correction(skew)
    parsed = _sample_rows(host, seq, body.get("samples") or [], gpus, now, shift)
    events = _events(host, seq, body.get("events") or [], gpus, now, shift)
    rejected = sum(parsed.rejections.values())
    digest, instance_id = content_digest(body), _instance_id(body)

    with transaction.atomic():
        report_id = _claim_report(
            host, seq, parsed, rejected, len(events), skew, now, digest, instance_id
        )
        if report_id is None:
            duplicate, first = _first_ack(host, seq)
            if first.content_sha256 and first.content_sha256 != digest:
                _record_identity_conflict(host, seq, body, first, digest, instance_id, now)
                return replace(duplicate, identity_conflict=True)
            metrics.REPORTS.labels(outcome="duplicate").inc()
            return duplicate
        if events:  # before this report's samples are stored: they never make its Xids late
            _flag_late_xids(host, events)
        stored = len(parsed.rows)
        if parsed.rows:
            ensure_partitions({row[0].date() for row in parsed.rows})
            stored = store_samples(parsed.rows)
            if stored != len(parsed.rows):  # samples already stored (resent under a new seq)
                parsed.deduplicated += len(parsed.rows) - stored
                _count_stored(report_id, stored, parsed.deduplicated)
        if events:
            XidEvent.objects.bulk_create(events)
            health.handle_xids(host, events, now)
        if stored:  # the health rules on sample signals (ECC counts, slowdowns)
            health.handle_samples(host, seq, {row[2] for row in parsed.rows}, now)
        warnings: dict[str, str | None] = {}
        inventoried = isinstance(inventory, dict) and isinstance(inventory.get("gpus"), list)
        if inventoried:
            warnings.update(_apply_inventory(host, inventory, gpus, now))
            _GPU_CACHE.pop(host.id, None)  # MIG devices or missing flags may have changed
            _signal_driver_change(host, body, gpus.uuids)
        if body.get("scrub_results"):
            hygiene.apply_scrub_results(host, body["scrub_results"], now)
        if body.get("diagnostics"):
            hygiene.record_dcgm_diagnostics(host, body["diagnostics"], now)
        if skew is not None:
            warnings[host_warnings.AGENT_CLOCK] = _clock_warning(skew, shift)
        source_error = body.get("source_error")
        source_error = str(source_error)[:300] if source_error else ""
        warnings[host_warnings.AGENT_SOURCE] = (
            f"{host_warnings.AGENT_SOURCE} {source_error}" if source_error else None
        )
        if isinstance(body.get("agent_status"), dict):
            warnings[host_warnings.AGENT_SPOOL] = _spool_warning(body["agent_status"])
        host_warnings.set_host_warnings(host.id, warnings)
        if source_error and body.get("source_error_code") in health_rules.NVML_INIT_ERROR_CODES:
            # before apply_source_health: a rule's firing is evidence, the rest is unknown
            health.handle_nvml_init_failure(host, gpus.uuids, now)
        scrubs_pending = _update_host(
            host,
            body,
            seq,
            now,
            source_error=source_error,
            inventory=inventoried or bool(source_error),
        )
        health.host_reported(host, now)
        health.apply_source_health(host, source_error, now)
        commands = hygiene.pending_scrub_commands(host, now) if scrubs_pending else []
    metrics.REPORTS.labels(outcome="stored").inc()
    metrics.SAMPLES.labels(outcome="stored").inc(stored)
    if rejected:
        metrics.SAMPLES.labels(outcome="rejected").inc(rejected)
    return Ack(
        seq,
        False,
        stored,
        rejected,
        parsed.deduplicated,
        parsed.rejections,
        commands,
        samples_redated=len(parsed.rows) if shift else 0,
    )


#: what a report produces; a status report carries none of them
PRODUCED_FIELDS = ("samples", "events", "inventory", "scrub_results", "diagnostics")


def is_status_report(body: dict[str, Any]) -> bool:
    """A status report: ``seq`` null, nothing produced, an ``agent_status`` object.

    The agent sends one when it cannot write its state dir and has nothing spooled left to
    carry its ``agent_status`` (issue 29: a full disk was otherwise invisible to the server).
    """
    return isinstance(body.get("agent_status"), dict) and not any(
        body.get(name) for name in PRODUCED_FIELDS
    )


def ingest_status(host: Host, body: dict[str, Any], now: datetime) -> Ack:
    """Apply a status report (:func:`is_status_report`): the host's ``agent spool:`` and
    ``agent clock:`` warnings only. Nothing is stored under a seq and the host is not marked
    as reporting — without samples it still goes NOT_READY after its timeout, now with the
    reason on the console. Answers an :class:`Ack` with ``seq`` None.

    Raises InvalidReport when ``host_id`` names another host.
    """
    if str(body.get("host_id", host.id)) != str(host.id):
        raise InvalidReport("host_id", "host_id does not match the credential's host")
    warnings = {host_warnings.AGENT_SPOOL: _spool_warning(body["agent_status"])}
    skew = _clock_skew(body.get("sent_at"), now)
    if skew is not None:
        warnings[host_warnings.AGENT_CLOCK] = _clock_warning(skew, clock_correction(skew))
    host_warnings.set_host_warnings(host.id, warnings)
    metrics.REPORTS.labels(outcome="status").inc()
    return Ack(None, False, 0, 0)


# --- parsing ------------------------------------------------------------------------------------


def _seq(body: dict[str, Any]) -> int:
    seq = body.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 1 <= seq <= _INT64:
        raise InvalidReport("seq", "seq must be an integer >= 1")
    return seq


def _parse_ts(value: Any, field: str) -> datetime:
    try:
        ts = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        ts = None
    if ts is None or ts.tzinfo is None:
        raise InvalidReport(field, "timestamps must be RFC 3339 with a UTC offset")
    try:
        return to_utc(ts)
    except BadValue as exc:
        raise InvalidReport(field, str(exc), exc.code) from exc


@dataclass(frozen=True)
class _HostGpus:
    uuids: frozenset[str]
    #: MIG device UUID -> (parent GPU UUID, GPU instance id)
    mig_uuids: dict[str, tuple[str, int]]
    rows: list[dict[str, Any]]
    #: GPU UUID -> the most bytes a sample of it may say it has (:func:`_check_memory`)
    memory_limits: dict[str, int] = field(default_factory=dict)


#: host id -> (monotonic time read, its GPUs): the GPU set of a host only changes at import,
#: so a report can validate its samples against a copy a few seconds old; the inventory path
#: (which changes MIG devices and missing flags) always reads afresh and refreshes the copy.
_GPU_CACHE: dict[Any, tuple[float, _HostGpus]] = {}
GPU_CACHE_TTL_S = 10.0


def _host_gpus(host: Host, *, fresh: bool = False) -> _HostGpus:
    now = time.monotonic()
    cached = _GPU_CACHE.get(host.id)
    if not fresh and cached is not None and now - cached[0] < GPU_CACHE_TTL_S:
        return cached[1]
    gpus = _read_host_gpus(host)
    if len(_GPU_CACHE) > 10_000:
        _GPU_CACHE.clear()
    _GPU_CACHE[host.id] = (now, gpus)
    return gpus


def _read_host_gpus(host: Host) -> _HostGpus:
    rows = list(
        Gpu.objects.filter(host=host).values(
            "id",
            "uuid",
            "index",
            "mig_devices",
            "missing_since",
            "health",
            "health_reason",
            "memory_total_bytes",
            "gpu_model__memory_mib",
        )
    )
    limits = {}
    for row in rows:
        total = row["memory_total_bytes"] or (row["gpu_model__memory_mib"] or 0) * 2**20
        if total:
            limits[row["uuid"]] = int(total * (1 + MEMORY_TOTAL_SLACK))
    mig: dict[str, tuple[str, int]] = {}
    for row in rows:
        for device in row["mig_devices"] or []:
            gi = device.get("gpu_instance_id") if isinstance(device, dict) else None
            if isinstance(device.get("uuid") if gi is not None else None, str) and (
                type(gi) is int
            ):
                mig[device["uuid"]] = (row["uuid"], gi)
    return _HostGpus(frozenset(r["uuid"] for r in rows), mig, rows, limits)


_NAMES = tuple(name for name, _kind in NUMERIC_FIELDS)
_KINDS = tuple(kind for _name, kind in NUMERIC_FIELDS)
_LOWS = tuple(_BOUNDS.get(name, (0, _INT64))[0] for name in _NAMES)
_HIGHS = tuple(_BOUNDS.get(name, (0, _INT64))[1] for name in _NAMES)


def _number(value: Any, kind: type, where: str, name: str, low: float, high: float) -> int | float:
    """The slow path of :func:`_sample_rows`: convert or refuse one measurement."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidReport(where, f"{name} must be a finite number or null", "invalid_number")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidReport(where, f"{name} must be a finite number or null", "invalid_number")
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise InvalidReport(where, f"{name} must be an integer", "invalid_number")
    if not low <= value <= high:
        raise InvalidReport(
            where, f"{name} is out of its range [{low:g}, {high:g}]", "number_out_of_range"
        )
    return kind(value)


def _check_memory(used: Any, total: Any, limit: int | None, i: int) -> None:
    """A sample's memory within its GPU: ``memory_total_bytes`` at most the GPU's recorded
    total (``limit``: NVML's total at import or the catalog's, plus MEMORY_TOTAL_SLACK; a MIG
    GPU instance's total is a part of it), ``memory_used_bytes`` at most the sample's total
    (else the GPU's). InvalidReport ``memory_total_exceeds_gpu`` /
    ``memory_used_exceeds_total`` naming ``samples[i]``'s field."""
    if total is not None and limit is not None and total > limit:
        raise InvalidReport(
            f"samples[{i}].memory_total_bytes",
            f"memory_total_bytes {total} is more than the GPU has ({limit} bytes)",
            "memory_total_exceeds_gpu",
        )
    ceiling = total if total is not None else limit
    if used is not None and ceiling is not None and used > ceiling:
        raise InvalidReport(
            f"samples[{i}].memory_used_bytes",
            f"memory_used_bytes {used} is more than the memory total ({ceiling} bytes)",
            "memory_used_exceeds_total",
        )


def _sample_rows(
    host: Host, seq: int, samples: Any, gpus: _HostGpus, now: datetime, shift: timedelta
) -> _Parsed:
    if not isinstance(samples, list):
        raise InvalidReport("samples", "samples must be a list")
    oldest = now - timedelta(days=conf.sample_retention_days())
    newest = now + timedelta(seconds=conf.sample_max_future_s())
    rows: list[tuple] = []
    rejections: dict[str, int] = {}
    seen: set[tuple[str, int | None, datetime]] = set()
    deduplicated = 0
    host_id = host.id
    known, mig_uuids, memory_limits = gpus.uuids, gpus.mig_uuids, gpus.memory_limits
    min_ts = max_ts = None
    for i, sample in enumerate(samples):
        # The hot loop of ingestion (every sample of every report): type checks first, the
        # conversions and error messages only for what is not already the right type.
        if type(sample) is not dict:
            raise InvalidReport(f"samples[{i}]", "each sample must be an object")
        get = sample.get
        raw_ts = get("ts")
        try:
            ts = datetime.fromisoformat(raw_ts) if type(raw_ts) is str else None
        except ValueError:
            ts = None
        if ts is None or ts.tzinfo is None:
            raise InvalidReport(f"samples[{i}].ts", "timestamps must be RFC 3339 with a UTC offset")
        if ts.utcoffset():
            try:
                ts = ts.astimezone(UTC)
            except OverflowError:  # year 1 or 9999 with an offset: outside any window
                reason = TS_TOO_OLD if ts.year < 2000 else TS_IN_FUTURE
                rejections[reason] = rejections.get(reason, 0) + 1
                continue
        if shift:  # the agent's clock is off: the sample happened at ts + shift server time
            try:
                ts = ts + shift
            except OverflowError:
                reason = TS_TOO_OLD if ts.year < 2000 else TS_IN_FUTURE
                rejections[reason] = rejections.get(reason, 0) + 1
                continue
        uuid = get("gpu_uuid")
        if type(uuid) is not str:
            raise InvalidReport(
                f"samples[{i}].gpu_uuid", "must be a GPU or MIG device UUID", "invalid_gpu_uuid"
            )
        gi = get("mig_gpu_instance_id")
        if gi is not None and (type(gi) is not int or not 0 <= gi <= _INT4_MAX):
            raise InvalidReport(
                f"samples[{i}].mig_gpu_instance_id",
                "must be an integer in [0, 2147483647] or null",
                "number_out_of_range" if type(gi) is int else "invalid_report",
            )
        values = [get(name) for name in _NAMES]
        for j, value in enumerate(values):
            if value is None:
                continue
            kind = _KINDS[j]
            # in range (finite bounds: NaN and infinities fail the comparison)
            if type(value) is kind and _LOWS[j] <= value <= _HIGHS[j]:
                continue
            values[j] = _number(
                value, kind, f"samples[{i}].{_NAMES[j]}", _NAMES[j], _LOWS[j], _HIGHS[j]
            )
        if uuid not in known:
            parent = mig_uuids.get(uuid)
            if parent is None:
                rejections[UNKNOWN_GPU] = rejections.get(UNKNOWN_GPU, 0) + 1
                continue
            uuid, gi = parent
        if values[2] is not None or values[3] is not None:
            _check_memory(values[2], values[3], memory_limits.get(uuid), i)
        if ts > newest:
            rejections[TS_IN_FUTURE] = rejections.get(TS_IN_FUTURE, 0) + 1
            continue
        if ts < oldest:
            rejections[TS_TOO_OLD] = rejections.get(TS_TOO_OLD, 0) + 1
            continue
        key = (uuid, gi, ts)
        if key in seen:
            deduplicated += 1
            continue
        seen.add(key)
        if min_ts is None or ts < min_ts:
            min_ts = ts
        if max_ts is None or ts > max_ts:
            max_ts = ts
        rows.append((ts, host_id, uuid, gi, *values, seq))
    return _Parsed(rows, rejections, deduplicated, min_ts, max_ts)


def _events(
    host: Host, seq: int, events: Any, gpus: _HostGpus, now: datetime, shift: timedelta
) -> list[XidEvent]:
    """Xid events of the report. An Xid names the GPU it happened on: one of the host's GPUs
    (or a MIG device of one, stored as its GPU). A GPU the host does not own is refused —
    ``InvalidReport("events[i].gpu_uuid")``, so the whole report is refused and nothing is
    stored: an Xid must never mark (or credit) a GPU of another host, nor the whole host for a
    GPU it does not have."""
    if not isinstance(events, list):
        raise InvalidReport("events", "events must be a list")
    out = []
    newest = now + timedelta(seconds=conf.sample_max_future_s())
    for i, event in enumerate(events):
        if not isinstance(event, dict) or event.get("type") != "xid":
            continue
        xid = event.get("xid")
        if not isinstance(xid, int) or isinstance(xid, bool) or not 0 <= xid < 2**31:
            raise InvalidReport(f"events[{i}].xid", "xid must be a non-negative integer")
        ts = _parse_ts(event.get("ts"), f"events[{i}].ts")
        if shift:
            try:
                ts = ts + shift
            except OverflowError as exc:
                raise InvalidReport(
                    f"events[{i}].ts", "out of range", "datetime_out_of_range"
                ) from exc
        gpu_uuid = event.get("gpu_uuid")
        if isinstance(gpu_uuid, str) and gpu_uuid in gpus.mig_uuids:
            gpu_uuid = gpus.mig_uuids[gpu_uuid][0]
        if not isinstance(gpu_uuid, str) or gpu_uuid not in gpus.uuids:
            raise InvalidReport(
                f"events[{i}].gpu_uuid",
                f"GPU {str(gpu_uuid)[:80]!r} is not a GPU of host {host.hostname}; "
                "the report is refused and nothing of it is stored",
            )
        out.append(
            XidEvent(
                host=host,
                gpu_uuid=gpu_uuid,
                ts=min(ts, newest),
                xid=xid,
                message=str(event.get("message", ""))[:2000],
                report_seq=seq,
            )
        )
    return out


def _clock_skew(sent_at: Any, now: datetime) -> float | None:
    """``sent_at`` minus ``now`` in seconds (None when absent, unreadable or absurd).

    The agent stamps ``sent_at`` when the request leaves, so this is its clock's offset from
    the server's (plus the request's transit time, a fraction of a second). Never a sample's
    age: a spool replayed after an outage carries old samples and a fresh ``sent_at``."""
    if not isinstance(sent_at, str):
        return None
    try:
        ts = to_utc(datetime.fromisoformat(sent_at))
    except (ValueError, OverflowError):  # BadValue is a ValueError
        return None
    return (ts - now).total_seconds()


def clock_correction(skew: float | None) -> timedelta:
    """What to add to the report's sample and event timestamps: ``-skew`` when the agent's
    clock is further off than ``NVKE_AGENT_CLOCK_SKEW_WARNING_S`` (either way: ahead or
    behind), else nothing. An agent 600 s behind had its samples dated before the allocation
    began (utilization left them out); one 600 s ahead had all of them refused as
    ``ts_in_future``: both are now stored at the server's time of the reading."""
    if skew is None or abs(skew) <= conf.clock_skew_warning_s():
        return timedelta(0)
    return timedelta(seconds=-skew)


def _clock_warning(skew: float, shift: timedelta) -> str | None:
    """The host's ``agent clock:`` warning (None: the clock is within the allowed skew). The
    offset is rounded to 10 s so that a steady skew does not rewrite the warning each report."""
    if not shift:
        return None
    rounded = round(skew, -1)
    way = "ahead of" if skew > 0 else "behind"
    return (
        f"{host_warnings.AGENT_CLOCK} about {abs(rounded):.0f} s {way} the server's (its sent_at "
        f"against the receive time); its sample and Xid times are re-dated by {-rounded:+.0f} s "
        f"(allowed skew {conf.clock_skew_warning_s():.0f} s): fix the host's NTP"
    )


def _spool_warning(status: dict[str, Any]) -> str | None:
    """The host's ``agent spool:`` warning from the report's ``agent_status`` (stamped by the
    agent at send time): set while the agent cannot write its state dir, else None."""
    error = status.get("spool_error")
    if not error:
        return None
    reports, samples = status.get("dropped_reports"), status.get("dropped_samples")
    return (
        f"{host_warnings.AGENT_SPOOL} the agent cannot write its state dir ({str(error)[:200]}): "
        f"it delivers what is spooled but makes no new reports; "
        f"{reports if isinstance(reports, int) else '?'} report(s) / "
        f"{samples if isinstance(samples, int) else '?'} sample(s) dropped so far"
    )


#: report fields the agent stamps when it sends (each retry anew), not when it produces
SEND_TIME_FIELDS = frozenset({"sent_at", "host_id", "agent_status"})


def content_digest(body: dict[str, Any]) -> str:
    """SHA-256 (hex) of what the agent produced under this seq: the body without
    :data:`SEND_TIME_FIELDS`, as canonical JSON (sorted keys). A resend of the same batch —
    after a lost answer or a restart — has the same digest; another agent's batch under the
    same seq (a copied state dir) differs, if only by its ``instance_id``."""
    content = {k: v for k, v in body.items() if k not in SEND_TIME_FIELDS}
    try:
        return hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()
    except TypeError:  # an integer beyond 64 bits (validated later): digest the text form
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _instance_id(body: dict[str, Any]) -> str:
    value = body.get("instance_id")
    return value[:64] if isinstance(value, str) else ""


@dataclass(frozen=True)
class _FirstReport:
    content_sha256: str
    instance_id: str
    received_at: datetime


def _record_identity_conflict(
    host: Host,
    seq: int,
    body: dict[str, Any],
    first: _FirstReport,
    digest: str,
    instance_id: str,
    now: datetime,
) -> None:
    """``seq`` came again with other content: two agents use this host's credential (a copied
    state dir). Keeps the evidence — the second body whole, both digests and instance ids —
    in a host event, flags the host (``agent identity:`` warning, shown on the console) and
    counts it (``nvke_agent_reports_total{outcome="identity_conflict"}``). The first report
    stays the stored one; nothing of the second is stored as telemetry."""
    other = instance_id or "(none)"
    HostEvent.objects.create(
        host=host,
        ts=now,
        kind=HostEventKind.IDENTITY,
        actor="agent",
        message=(
            f"report seq {seq} received again with other content (agent instance {other}; "
            f"first from {first.instance_id or '(none)'}): two agents use this host's credential"
        )[:500],
        data={
            "seq": seq,
            "first": {
                "instance_id": first.instance_id,
                "content_sha256": first.content_sha256,
                "received_at": first.received_at.isoformat(),
            },
            "again": {"instance_id": instance_id, "content_sha256": digest},
            "body": body,
        },
    )
    host_warnings.set_host_warning(
        host.id,
        host_warnings.AGENT_IDENTITY,
        f"{host_warnings.AGENT_IDENTITY} two agents report as this host (agent instances "
        f"{first.instance_id or '(none)'} and {other} both sent seq {seq}, with different "
        "content): stop the copy, then re-issue the bootstrap token and register the host again",
    )
    metrics.REPORTS.labels(outcome="identity_conflict").inc()
    log.error(
        "host %s: report seq %d received again with other content (instance %s, first %s)",
        host.hostname,
        seq,
        other,
        first.instance_id or "(none)",
    )


def _flag_late_xids(host: Host, events: list[XidEvent]) -> None:
    """Mark the Xids dated before the host's newest sample already stored — of any of its GPUs,
    from earlier reports (this runs before this report's samples are stored) — as ``late``,
    with ``credit_from`` that sample's time, so their SLA credit starts there. A host could
    otherwise post, 91 s into an allocation, an Xid dated 1 s into it and be credited 99 % of
    it; and the newest sample of the Xid's own GPU is not enough: a host that keeps reporting
    its other GPUs and withholds that one's samples would make any back-dated Xid on it look
    on time. An agent samples all its GPUs in each report, and an Xid reaches the report after
    the one whose samples precede it, so an honest Xid is never older than the host's newest
    sample. A spool replayed after an outage is not late: its reports come in seq order and no
    newer sample had been received."""
    oldest = min(event.ts for event in events)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT MAX(ts) FROM fleet_gpusample WHERE host_id = %s AND ts > %s",
            [host.id, oldest],
        )
        (seen,) = cursor.fetchone()
    for event in events:
        if seen is not None and event.ts < seen:
            event.late, event.credit_from = True, seen


#: ``source_error_code``: a return code's name as NVML spells it (``NVML_ERROR_UNINITIALIZED``)
_ERROR_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")


def _check_batches(body: dict[str, Any], inventory: Any, gpus: _HostGpus) -> None:
    """Types and bounds of the report's collections, before anything is written: a
    malformed inventory is refused whole (never half applied), so nothing stored can make
    the host's later, good reports fail."""
    for key, limit, code in (
        ("samples", MAX_SAMPLES_PER_REPORT, "too_many_samples"),
        ("events", MAX_EVENTS_PER_REPORT, "too_many_events"),
        ("scrub_results", MAX_SCRUB_RESULTS_PER_REPORT, "too_many_scrub_results"),
    ):
        value = body.get(key)
        if isinstance(value, list) and len(value) > limit:
            raise InvalidReport(key, f"at most {limit} {key} per report", code)
    if body.get("scrub_results") is not None:
        results = body["scrub_results"]
        if not isinstance(results, list):
            raise InvalidReport("scrub_results", "scrub_results must be a list")
        for i, result in enumerate(results):
            where = f"scrub_results[{i}]"
            if not isinstance(result, dict):
                raise InvalidReport(where, "each scrub result is an object")
            scrub_id = result.get("scrub_id")
            if isinstance(scrub_id, bool) or not isinstance(scrub_id, int):
                raise InvalidReport(f"{where}.scrub_id", "scrub_id must be an integer")
            if not 1 <= scrub_id <= _INT64:
                raise InvalidReport(f"{where}.scrub_id", "out of range", "number_out_of_range")
            executor = result.get("executor")
            if executor is not None and (not isinstance(executor, str) or len(executor) > 100):
                raise InvalidReport(f"{where}.executor", "a string of at most 100 characters")
            steps = result.get("steps")
            if steps is not None and (not isinstance(steps, list) or len(steps) > MAX_SCRUB_STEPS):
                raise InvalidReport(f"{where}.steps", f"a list of at most {MAX_SCRUB_STEPS}")
    for key in ("driver_version", "cuda_version", "agent_version", "sent_at"):
        value = body.get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidReport(key, f"{key} must be a string")
    code = body.get("source_error_code")
    if code is not None and not (isinstance(code, str) and _ERROR_CODE.fullmatch(code)):
        raise InvalidReport(
            "source_error_code", "an NVML return code name (NVML_ERROR_…, at most 64) or null"
        )
    if inventory is not None:
        try:
            formats.check_inventory(inventory, known_uuids=gpus.uuids)
        except formats.FormatError as exc:
            raise InvalidReport(exc.field, str(exc), exc.code) from exc


# --- writing ------------------------------------------------------------------------------------


def _claim_report(
    host: Host,
    seq: int,
    parsed: _Parsed,
    rejected: int,
    events: int,
    skew: float | None,
    now: datetime,
    digest: str,
    instance_id: str,
) -> int | None:
    """Insert the ``(host, seq)`` row; None when it exists (a duplicate)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO fleet_agentreport
                (host_id, seq, received_at, samples_stored, samples_rejected,
                 samples_deduplicated, events_stored, rejections, min_ts, max_ts, clock_skew_s,
                 content_sha256, instance_id)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s)
            ON CONFLICT (host_id, seq) DO NOTHING
            RETURNING id
            """,
            [
                host.id,
                seq,
                now,
                len(parsed.rows),
                rejected,
                parsed.deduplicated,
                events,
                json.dumps(parsed.rejections),
                parsed.min_ts,
                parsed.max_ts,
                skew,
                digest,
                instance_id,
            ],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def _count_stored(report_id: int, stored: int, deduplicated: int) -> None:
    """The report's counts once the staging move said how many samples were new."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE fleet_agentreport SET samples_stored = %s, samples_deduplicated = %s"
            " WHERE id = %s",
            [stored, deduplicated, report_id],
        )


def _first_ack(host: Host, seq: int) -> tuple[Ack, _FirstReport]:
    """The acknowledgement the first report of ``seq`` got, and what identifies it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT samples_stored, samples_rejected, samples_deduplicated, rejections, "
            "content_sha256, instance_id, received_at "
            "FROM fleet_agentreport WHERE host_id = %s AND seq = %s",
            [host.id, seq],
        )
        stored, rejected, deduplicated, rejections, digest, instance, received = cursor.fetchone()
    if isinstance(rejections, str):
        rejections = json.loads(rejections)
    first = _FirstReport(digest or "", instance or "", received)
    ack = Ack(seq, True, stored, rejected, deduplicated, rejections or {}, [])
    return ack, first


#: PostgreSQL types of SAMPLE_COLUMNS, for binary COPY
SAMPLE_TYPES = (
    "timestamptz",
    "uuid",
    "varchar",
    "int4",
    "float8",
    "float8",
    "int8",
    "int8",
    "int8",
    "int8",
    "float8",
    "int8",
    "int8",
    "int4",
    "int4",
    "int8",
    "int8",
)


def copy_samples(rows: list[tuple], table: str = "fleet_gpusample") -> None:
    """COPY rows (in :data:`SAMPLE_COLUMNS` order) into ``table`` (raw: a duplicate of a stored
    sample breaks the unique index; ingestion goes through :func:`store_samples`).

    Binary COPY with the column types declared (psycopg 3's C row writer): the fastest path
    psycopg offers, and no text escaping to get wrong.
    """
    columns = ", ".join(SAMPLE_COLUMNS)
    with connection.cursor() as cursor:
        raw = cursor.cursor  # the psycopg 3 cursor under Django's wrapper
        with raw.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(SAMPLE_TYPES)
            write_row = copy.write_row
            for row in rows:
                write_row(row)


#: the per-transaction staging table of :func:`store_samples`
STAGING = "nvke_staging_gpusample"
_COLUMNS = ", ".join(SAMPLE_COLUMNS)
_CREATE_STAGING = (
    f"CREATE TEMP TABLE IF NOT EXISTS {STAGING} ON COMMIT DROP AS "
    f"SELECT {_COLUMNS} FROM fleet_gpusample WITH NO DATA"
)
# one statement empties the staging table and inserts what is new; the unique index
# fleet_gpusample_sample_uniq (gpu, ts, MIG GI; NULLS NOT DISTINCT) decides what is a duplicate
_MOVE_STAGED = (
    f"WITH staged AS (DELETE FROM {STAGING} RETURNING {_COLUMNS}) "
    f"INSERT INTO fleet_gpusample ({_COLUMNS}) SELECT {_COLUMNS} FROM staged "
    "ON CONFLICT DO NOTHING"
)


def store_samples(rows: list[tuple]) -> int:
    """Store rows (in :data:`SAMPLE_COLUMNS` order) once each; returns how many were new.

    Samples are unique per (GPU, MIG GPU-instance id, timestamp) — the unique index of
    migration ``fleet.0006`` — so a sample an agent sends again under a new report seq (it
    lost its state and registered again, or resent a batch) is not stored twice. COPY cannot
    skip conflicts, so the rows are COPYed (binary, as before) into a temporary staging table
    of this transaction (``ON COMMIT DROP``: safe with any connection pooling) and moved with
    ``INSERT … ON CONFLICT DO NOTHING``. Must run inside a transaction.
    """
    if not rows:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(_CREATE_STAGING)
        copy_samples(rows, table=STAGING)
        cursor.execute(_MOVE_STAGED)
        return cursor.rowcount


def _apply_inventory(
    host: Host, inventory: dict[str, Any], gpus: _HostGpus, now: datetime
) -> list[str]:
    """Compare the agent's inventory with the host; returns the changes of the host's
    warnings (``{prefix: text or None}``, for :func:`fleet.host_warnings.set_host_warnings`)."""
    listed = [
        g for g in inventory["gpus"] if isinstance(g, dict) and isinstance(g.get("uuid"), str)
    ]
    reported = {g["uuid"] for g in listed}
    # A GPU NVML calls lost (health ``gpu_is_lost``: fallen off the bus) is listed under the
    # UUID read before, but only that and its health are facts: it is missing like a GPU the
    # agent no longer lists (one truth: never present and healthy), its other facts are left
    # as they were, and its gpu_is_lost turn-on is a fallen_off_bus occurrence for the rules
    lost = sorted(
        g["uuid"]
        for g in listed
        if g["uuid"] in gpus.uuids and (g.get("health") or {}).get("gpu_is_lost") is True
    )
    missing = sorted(gpus.uuids - reported)
    unknown = sorted(u for u in reported - gpus.uuids if isinstance(u, str) and u)
    problems = []
    if missing:
        problems.append(f"GPU(s) not reported: {', '.join(missing)}")
    if lost:
        problems.append(f"GPU(s) lost (NVML: fallen off the bus): {', '.join(lost)}")
    if unknown:
        problems.append(f"GPU(s) not in the host record: {', '.join(unknown)}")
    warnings: dict[str, str | None] = {
        host_warnings.AGENT_INVENTORY: (
            f"{host_warnings.AGENT_INVENTORY} {'; '.join(problems)}" if problems else None
        )
    }
    by_uuid = {r["uuid"]: r for r in gpus.rows}
    for uuid in missing:
        _mark_missing(host, by_uuid[uuid], now, lost=False)
    for uuid in sorted((gpus.uuids & reported) - set(lost)):
        row = by_uuid[uuid]
        if row["missing_since"] is not None:
            Gpu.objects.filter(pk=row["id"]).update(missing_since=None)
            HostEvent.objects.create(
                host=host,
                ts=now,
                kind=HostEventKind.INVENTORY,
                actor="agent",
                message=f"GPU {uuid} is back in the agent's inventory",
                data={"gpu_uuid": uuid},
            )
            if row["health"] == GpuHealth.UNHEALTHY:
                health.close_unhealthy(
                    Gpu.objects.get(pk=row["id"]),
                    at=now,
                    ended_by="listed by the agent again",
                    reasons={HealthReason.GPU_MISSING},
                )
    # Facts of the GPUs the host has: MIG devices, health counters, static attributes. Only
    # a fact that changed is written: an UPDATE of fleet_gpu also rewrites (and row-locks
    # until commit) the host's summary row through the summary trigger (migration 0003), and
    # writing 8 unchanged GPUs at every report made placement's claims on the same host wait
    # (the reconcile benchmark, issue 33: 7,880 such UPDATEs for 985 reports)
    stored = {
        r["uuid"]: r
        for r in Gpu.objects.filter(host=host).values(
            "uuid",
            "mig_devices",
            "mig_mode",
            "slice_scrubs",
            "health_counters",
            "attributes",
            "serial",
        )
    }
    mig_changed = []
    turned_on: list[tuple[str, str]] = []
    for g in listed:
        uuid = g.get("uuid")
        if uuid not in gpus.uuids:
            continue
        fields: dict[str, Any] = {}
        current = stored.get(uuid, {})
        if uuid in lost:  # only its health is read (above), laid over the facts read before
            g = {"health": {**(current.get("health_counters") or {}), **g["health"]}}
        if isinstance(g.get("mig_devices"), list):
            fields["mig_devices"] = [d for d in g["mig_devices"] if isinstance(d, dict)]
        if g.get("mig_mode") in ("enabled", "disabled", None) and "mig_mode" in g:
            fields["mig_mode"] = g["mig_mode"]
        if isinstance(g.get("slice_scrubs"), list):
            fields["slice_scrubs"] = [d for d in g["slice_scrubs"] if isinstance(d, dict)]
        if isinstance(g.get("health"), dict):
            fields["health_counters"] = g["health"]
        if isinstance(g.get("attributes"), dict):
            fields["attributes"] = g["attributes"]
            serial = g["attributes"].get("serial")
            if isinstance(serial, str) and serial:
                fields["serial"] = serial[:64]
        if "health_counters" in fields:  # flags turning on: row remap, lost (fleet.health_rules)
            turned_on += [
                (uuid, s)
                for s in health_rules.flag_turned_on(
                    current.get("health_counters"), fields["health_counters"]
                )
            ]
        fields = {k: v for k, v in fields.items() if current.get(k, object()) != v}
        if fields:
            Gpu.objects.filter(host=host, uuid=uuid).update(**fields)
        if "mig_mode" in fields or "mig_devices" in fields:
            mig_changed.append(uuid)
    # a host's first inventory changes nothing anyone compared: no node on it is READY or in
    # its cluster's API before a report (the observed-state gate waits for one, and its pool
    # polls), so its GPUs' first MIG facts are not a change to announce; announced, they
    # woke every pool placed on the host for a step with nothing to do (the reconcile
    # benchmark: 125 first reports, ~330 of its 2,846 steps)
    if mig_changed and host.inventory_at is not None:
        host_id = host.pk
        transaction.on_commit(
            lambda: gpu_facts_changed.send(sender=Gpu, host_id=host_id, gpu_uuids=mig_changed)
        )
    health.handle_flags(host, turned_on, now)  # before the check: a rule's interval wins
    for uuid in lost:
        _mark_missing(host, by_uuid[uuid], now, lost=True)
    listed = [g for g in listed if g["uuid"] not in lost]  # the GPUs read this round
    hygiene.check_from_inventory(host, listed, now)
    if host.tenancy == HostTenancy.SHARED:  # released instances the agent confirms scrubbed
        shared_hosts.confirm_scrubs(host, now=now)
    warnings.update(
        nvlink_domains.apply_reported_fabric(host, [g for g in listed if g["uuid"] in gpus.uuids])
    )
    topo = topology.from_agent(inventory.get("topology"), host.gpu_count)
    if topo is not None and topo.get("links") != (host.topology or {}).get("links"):
        islands = topology.island_of(topo)
        Host.objects.filter(pk=host.pk).update(topology=topo)
        for row in gpus.rows:
            Gpu.objects.filter(pk=row["id"]).update(nvlink_island=islands.get(row["index"]))
        host.topology = topo
    return warnings


def _mark_missing(host: Host, row: dict[str, Any], now: datetime, *, lost: bool) -> None:
    """The host's GPU ``row`` is not read by the agent (no longer listed, or listed ``lost``):
    the first time, ``Gpu.missing_since``, a host event and a ``gpu_missing`` interval (no
    operator needed; a rule's interval already open stays the GPU's)."""
    if row["missing_since"] is not None:
        return
    uuid = row["uuid"]
    Gpu.objects.filter(pk=row["id"]).update(missing_since=now)
    what = (
        "is lost (NVML_ERROR_GPU_IS_LOST: fallen off the bus)"
        if lost
        else "is not in the agent's inventory"
    )
    HostEvent.objects.create(
        host=host,
        ts=now,
        kind=HostEventKind.INVENTORY,
        actor="agent",
        message=f"GPU {uuid} (index {row['index']}) {what}",
        data={"gpu_uuid": uuid, **({"lost": True} if lost else {})},
    )
    health.open_unhealthy(
        Gpu.objects.get(pk=row["id"]),
        reason=HealthReason.GPU_MISSING,
        at=now,
        needs_operator=False,
        detail=(
            "NVML reports the GPU lost (NVML_ERROR_GPU_IS_LOST: fallen off the bus)"
            if lost
            else "the agent no longer sees this GPU (NVML lists fewer GPUs)"
        ),
    )


def _signal_driver_change(host: Host, body: dict[str, Any], uuids: Any) -> None:
    """A host that had a driver reports another one (``host`` is the row as loaded, before
    this report's UPDATE): ``gpu_facts_changed`` for all its GPUs after commit, as for new MIG
    facts, so the nodes on it are compared again (their Nodes' driver labels, the pools'
    drift condition)."""
    driver = body.get("driver_version")
    if not (isinstance(driver, str) and driver and host.driver_version):
        return
    if driver[:32] == host.driver_version:
        return
    host_id, changed = host.pk, sorted(uuids)
    transaction.on_commit(
        lambda: gpu_facts_changed.send(sender=Gpu, host_id=host_id, gpu_uuids=changed)
    )


def _update_host(
    host: Host,
    body: dict[str, Any],
    seq: int,
    now: datetime,
    *,
    source_error: str = "",
    inventory: bool = False,
) -> bool:
    """Liveness, versions, the source's error and the inventory clock of the host (its warnings
    have one writer, :mod:`fleet.host_warnings`), in one UPDATE that also answers whether a
    scrub of its GPUs is waiting for the agent (so most
    reports need no extra query)."""
    sets = [
        "last_seen_at = %s",
        "last_report_seq = GREATEST(last_report_seq, %s)",
        "agent_source_error = %s",
    ]
    params: list[Any] = [now, seq, source_error]
    if inventory:
        sets += ["inventory_at = %s", "inventory_count = inventory_count + 1"]
        params.append(now)
    for key in ("driver_version", "cuda_version", "agent_version"):
        value = body.get(key)
        limit = 16 if key == "cuda_version" else 32
        if isinstance(value, str) and value and value[:limit] != getattr(host, key):
            sets.append(f"{key} = %s")
            params.append(value[:limit])
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE fleet_host SET {', '.join(sets)} WHERE id = %s RETURNING EXISTS ("
            "SELECT 1 FROM fleet_gpuscrub WHERE host_id = %s AND status = 'PENDING')",
            [*params, host.id, host.id],
        )
        row = cursor.fetchone()
    return bool(row and row[0])
