"""Agent report ingestion: idempotent on ``(host, seq)``, samples written with COPY.

A report (wire format in ``agent/README.md``) carries the host's inventory (sometimes),
samples and events. In one transaction: the ``(host, seq)`` row is inserted (a duplicate
answers the first ack and writes nothing), the host's liveness and versions are updated, the
inventory is compared with the host (a GPU missing from the report is flagged, the host is
never shrunk), samples of GPUs that belong to the host and whose timestamps are plausible are
COPYed into ``fleet_gpusample``, and Xid events are stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from .choices import HostState
from .models import AgentReport, Gpu, Host, XidEvent
from .partitions import ensure_partitions

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
    "report_seq",
)
_NUMERIC_FIELDS = (
    ("utilization_gpu_pct", float),
    ("utilization_memory_pct", float),
    ("memory_used_bytes", int),
    ("memory_total_bytes", int),
    ("power_mw", int),
    ("energy_mj", int),
    ("temperature_c", float),
    ("ecc_volatile_uncorrected", int),
)


class InvalidReport(ValueError):
    """The report body breaks the wire format; ``field`` names where."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class Ack:
    """What the agent gets back: it deletes the spooled batch on any Ack."""

    seq: int
    duplicate: bool
    samples_stored: int
    samples_rejected: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "duplicate": self.duplicate,
            "samples_stored": self.samples_stored,
            "samples_rejected": self.samples_rejected,
        }


def ingest_report(host: Host, body: dict[str, Any], now: datetime | None = None) -> Ack:
    """Store one agent report for ``host``. Idempotent on ``(host, seq)``.

    Raises InvalidReport for a body that breaks the wire format (nothing is stored).
    """
    now = now or timezone.now()
    seq = _seq(body)
    if str(body.get("host_id", host.id)) != str(host.id):
        raise InvalidReport("host_id", "host_id does not match the credential's host")
    gpu_uuids = set(Gpu.objects.filter(host=host).values_list("uuid", flat=True))
    rows, rejected = _sample_rows(host, seq, body.get("samples") or [], gpu_uuids, now)
    events = _events(host, seq, body.get("events") or [], gpu_uuids, now)

    with transaction.atomic():
        report, created = AgentReport.objects.get_or_create(host=host, seq=seq)
        if not created:
            return Ack(seq, True, report.samples_stored, report.samples_rejected)
        _update_host(host, body, seq, gpu_uuids, now)
        if rows:
            ensure_partitions({row[0].date() for row in rows})
            _copy_samples(rows)
        if events:
            XidEvent.objects.bulk_create(events)
        report.samples_stored = len(rows)
        report.samples_rejected = rejected
        report.events_stored = len(events)
        report.save(update_fields=["samples_stored", "samples_rejected", "events_stored"])
    return Ack(seq, False, len(rows), rejected)


def _seq(body: dict[str, Any]) -> int:
    seq = body.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise InvalidReport("seq", "seq must be an integer >= 1")
    return seq


def _parse_ts(value: Any, field: str) -> datetime:
    ts = parse_datetime(value) if isinstance(value, str) else None
    if ts is None or ts.tzinfo is None:
        raise InvalidReport(field, "timestamps must be RFC 3339 with a UTC offset")
    return ts


def _sample_rows(
    host: Host, seq: int, samples: Any, gpu_uuids: set[str], now: datetime
) -> tuple[list[tuple], int]:
    if not isinstance(samples, list):
        raise InvalidReport("samples", "samples must be a list")
    oldest = now - timedelta(days=settings.NVKE_SAMPLE_RETENTION_DAYS)
    newest = now + timedelta(seconds=settings.NVKE_SAMPLE_MAX_FUTURE_S)
    rows: list[tuple] = []
    rejected = 0
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict):
            raise InvalidReport(f"samples[{i}]", "each sample must be an object")
        ts = _parse_ts(sample.get("ts"), f"samples[{i}].ts")
        uuid = sample.get("gpu_uuid")
        if uuid not in gpu_uuids or not (oldest <= ts <= newest):
            rejected += 1  # another host's GPU, or a clock far off: never stored
            continue
        values = []
        for name, kind in _NUMERIC_FIELDS:
            value = sample.get(name)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise InvalidReport(f"samples[{i}].{name}", f"{name} must be a number or null")
                value = kind(value)
            values.append(value)
        gi = sample.get("mig_gpu_instance_id")
        if gi is not None and (not isinstance(gi, int) or isinstance(gi, bool)):
            raise InvalidReport(f"samples[{i}].mig_gpu_instance_id", "must be an integer or null")
        rows.append((ts, host.id, uuid, gi, *values, seq))
    return rows, rejected


def _events(
    host: Host, seq: int, events: Any, gpu_uuids: set[str], now: datetime
) -> list[XidEvent]:
    if not isinstance(events, list):
        raise InvalidReport("events", "events must be a list")
    out = []
    for i, event in enumerate(events):
        if not isinstance(event, dict) or event.get("type") != "xid":
            continue
        xid = event.get("xid")
        if not isinstance(xid, int) or xid < 0:
            raise InvalidReport(f"events[{i}].xid", "xid must be a non-negative integer")
        out.append(
            XidEvent(
                host=host,
                gpu_uuid=str(event.get("gpu_uuid", ""))[:64],
                ts=_parse_ts(event.get("ts"), f"events[{i}].ts"),
                xid=xid,
                message=str(event.get("message", ""))[:2000],
                report_seq=seq,
            )
        )
    return out


def _update_host(
    host: Host, body: dict[str, Any], seq: int, gpu_uuids: set[str], now: datetime
) -> None:
    fields: dict[str, Any] = {"last_seen_at": now}
    if seq > host.last_report_seq:
        fields["last_report_seq"] = seq
    for key in ("driver_version", "cuda_version", "agent_version"):
        value = body.get(key)
        if isinstance(value, str) and value:
            fields[key] = value[:32]
    inventory = body.get("inventory")
    if isinstance(inventory, dict) and isinstance(inventory.get("gpus"), list):
        reported = {g.get("uuid") for g in inventory["gpus"] if isinstance(g, dict)}
        missing = sorted(gpu_uuids - reported)
        unknown = sorted(u for u in reported - gpu_uuids if u)
        warnings = [w for w in host.warnings if not w.startswith("agent inventory:")]
        if missing:
            warnings.append(f"agent inventory: GPU(s) not reported: {', '.join(missing)}")
        if unknown:
            warnings.append(f"agent inventory: GPU(s) not in the host record: {', '.join(unknown)}")
        fields["warnings"] = warnings
    Host.objects.filter(pk=host.pk).update(**fields)
    if host.state == HostState.NOT_READY:
        held = Gpu.objects.filter(host=host, holder_id__isnull=False).exists()
        Host.objects.filter(pk=host.pk, state=HostState.NOT_READY).update(
            state=HostState.ALLOCATED if held else HostState.AVAILABLE
        )


def _copy_samples(rows: list[tuple]) -> None:
    columns = ", ".join(SAMPLE_COLUMNS)
    with connection.cursor() as cursor:
        raw = cursor.cursor  # the psycopg 3 cursor under Django's wrapper
        with raw.copy(f"COPY fleet_gpusample ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
