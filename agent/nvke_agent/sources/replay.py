"""``replay`` source: plays back a recorded file (JSON lines) as if it were live.

File format (what ``nvke-agent record`` writes), one JSON object per line:

* ``{"kind": "inventory", "driver_version": str|null, "cuda_version": str|null, "gpus": [...]}``
  — optional, first line; ``gpus`` items are the wire's inventory GPUs.
* ``{"kind": "sample", "ts": RFC3339, "gpu_uuid": str, ...}`` — the wire's sample fields;
  missing measurement fields are ``null`` (so a ``null`` utilization stays ``null``).
* ``{"kind": "event", "ts": RFC3339, "gpu_uuid": str, "type": "xid", "xid": int, "message": str}``

Time: by default timestamps are *rebased*: the earliest record's ``ts`` maps to ``start`` (the
agent's start time; when not given, the time of the first ``collect``) and every other record
keeps its distance from it, so intervals are preserved. ``collect(now)`` returns the samples
whose rebased ``ts <= now`` (events due by then are handed out by the next ``events()``).
With ``rebase=False`` the original timestamps are kept (everything in the past is due at
once). When every record has been returned the source is ``exhausted``; with ``loop=True`` it
starts over instead, each pass shifted after the previous one by the file's span plus its
smallest sample step, so no ``(gpu_uuid, ts)`` repeats.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from nvke_agent.sources.base import (
    SAMPLE_FIELDS,
    Event,
    Inventory,
    Sample,
    SourceUnavailable,
    empty_sample,
    format_ts,
    parse_ts,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Record:
    ts: datetime
    kind: str  # "sample" | "event"
    payload: dict[str, Any]


class ReplaySource:
    """Source over a recorded JSON-lines file (see module docstring)."""

    name = "replay"

    def __init__(
        self,
        path: str | Path,
        *,
        start: datetime | None = None,
        rebase: bool = True,
        loop: bool = False,
    ) -> None:
        """Load the whole file; raises :class:`SourceUnavailable` if it is missing or invalid."""
        if loop and not rebase:
            raise ValueError("loop needs rebasing: without it every pass would repeat timestamps")
        self._path = Path(path)
        self._inventory, self._records = _load(self._path)
        self._loop = loop
        self._cursor = 0
        self._due_events: list[Event] = []
        self._offset = timedelta(0)
        self._anchored = not (self._records and rebase)
        if not self._anchored and start is not None:
            self._anchor(start)
        self._pass_shift = _pass_shift(self._records)

    def _anchor(self, start: datetime) -> None:
        self._offset = start - self._records[0].ts
        self._anchored = True

    @property
    def exhausted(self) -> bool:
        """True once every record was returned (never when looping over a non-empty file)."""
        if self._loop and self._records:
            return False
        return self._cursor >= len(self._records)

    def inventory(self) -> Inventory | None:
        """The file's inventory line, or ``None`` if it has none."""
        return self._inventory

    def collect(self, now: datetime) -> list[Sample]:
        """Samples whose rebased ``ts <= now``; due events are kept for :meth:`events`."""
        if not self._anchored:
            self._anchor(now)  # no start given: the first collection is the start
        samples: list[Sample] = []
        while self._records:
            if self._cursor >= len(self._records):
                if not self._loop:
                    break
                self._cursor = 0
                self._offset += self._pass_shift
            record = self._records[self._cursor]
            ts = record.ts + self._offset
            if ts > now + CLOCK_SLACK:
                break
            self._cursor += 1
            if self._cursor == len(self._records) and not self._loop:
                log.info("replay file %s exhausted", self._path)
            if record.kind == "sample":
                samples.append(_sample(record.payload, format_ts(ts)))
            else:
                self._due_events.append(_event(record.payload, format_ts(ts)))
        return samples

    def events(self) -> list[Event]:
        """Events that became due in the collections since the last call."""
        due, self._due_events = self._due_events, []
        return due

    def close(self) -> None:
        """Nothing to release."""


#: records due within this much after ``now`` are taken now: a recording's own timer jitter
#: (its third collection 2.003 s after the first) must not push a record past the replay's
#: last collection (found by a review: a 3 s replay of a 3 s recording lost its last batch)
CLOCK_SLACK = timedelta(milliseconds=100)


def _load(path: Path) -> tuple[Inventory | None, list[_Record]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SourceUnavailable(f"{path}: {exc}") from exc
    inventory: Inventory | None = None
    records: list[_Record] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            kind = obj.get("kind")
            if kind == "inventory":
                if records or inventory is not None:
                    raise ValueError("the inventory line must come first, once")
                inventory = Inventory(
                    driver_version=obj.get("driver_version"),
                    cuda_version=obj.get("cuda_version"),
                    gpus=list(obj.get("gpus") or []),
                )
            elif kind in ("sample", "event"):
                if not isinstance(obj.get("gpu_uuid"), str):
                    raise ValueError("gpu_uuid missing")
                if kind == "event" and not isinstance(obj.get("xid"), int):
                    raise ValueError("xid missing")
                records.append(_Record(parse_ts(obj["ts"]), kind, obj))
            else:
                raise ValueError(f"unknown kind {kind!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise SourceUnavailable(f"{path}:{lineno}: invalid replay record: {exc}") from exc
    # Stable: records with equal timestamps keep their file order.
    records.sort(key=lambda record: record.ts)
    return inventory, records


def _pass_shift(records: list[_Record]) -> timedelta:
    """How far each loop pass moves: the file's span plus its smallest positive step (or 1 s)."""
    if not records:
        return timedelta(0)
    distinct = sorted({record.ts for record in records})
    steps = [b - a for a, b in itertools.pairwise(distinct)]
    step = min(steps) if steps else timedelta(seconds=1)
    return distinct[-1] - distinct[0] + step


def _sample(payload: dict[str, Any], ts: str) -> Sample:
    sample = empty_sample(ts, payload["gpu_uuid"], payload.get("mig_gpu_instance_id"))
    for field in SAMPLE_FIELDS[3:]:  # the measurements (after ts, gpu_uuid, MIG GI id)
        sample[field] = payload.get(field)  # type: ignore[literal-required]
    return sample


def _event(payload: dict[str, Any], ts: str) -> Event:
    return Event(
        ts=ts,
        gpu_uuid=payload["gpu_uuid"],
        type=payload.get("type", "xid"),
        xid=payload["xid"],
        message=payload.get("message", ""),
    )
