"""``nvke-agent record``: write a replay file from any source.

Output (JSON lines, the format :mod:`nvke_agent.sources.replay` reads): an inventory line
``{"kind": "inventory", "driver_version", "cuda_version", "gpus"}`` (when the source has an
inventory), then ``{"kind": "sample", ...}`` and ``{"kind": "event", ...}`` lines in collection
order. Collections happen every ``interval_s`` seconds, the first at once, until
``duration_s`` has passed, the source is exhausted, or ``stop`` is set.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from nvke_agent.sources.base import Source


@dataclass(frozen=True)
class RecordSummary:
    """What was written."""

    path: Path
    gpus: int
    samples: int
    events: int
    collections: int
    elapsed_s: float

    def line(self) -> str:
        """One-line human summary."""
        return (
            f"recorded {self.gpus} GPU(s), {self.samples} sample(s), {self.events} event(s) "
            f"in {self.collections} collection(s) over {self.elapsed_s:.1f} s to {self.path}"
        )


def record(
    source: Source,
    out: str | Path,
    *,
    duration_s: float,
    interval_s: float,
    stop: threading.Event | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    monotonic: Callable[[], float] = time.monotonic,
) -> RecordSummary:
    """Record ``source`` into ``out`` (see module docstring)."""
    if interval_s <= 0 or duration_s < 0:
        raise ValueError("interval must be > 0 and duration >= 0")
    stop = stop or threading.Event()
    path = Path(out)
    started = monotonic()
    gpu_uuids: set[str] = set()
    samples = events = collections = 0
    with path.open("w", encoding="utf-8") as fh:
        inventory = source.inventory()
        if inventory is not None:
            _write(fh, {"kind": "inventory", **inventory})
            gpu_uuids.update(gpu["uuid"] for gpu in inventory["gpus"])
        next_at = started
        while True:
            for sample in source.collect(clock()):
                _write(fh, {"kind": "sample", **sample})
                gpu_uuids.add(sample["gpu_uuid"])
                samples += 1
            for event in source.events():
                _write(fh, {"kind": "event", **event})
                events += 1
            fh.flush()
            collections += 1
            next_at += interval_s
            if source.exhausted or next_at - started >= duration_s:
                break
            if stop.wait(max(0.0, next_at - monotonic())):
                break
    return RecordSummary(
        path=path,
        gpus=len(gpu_uuids),
        samples=samples,
        events=events,
        collections=collections,
        elapsed_s=monotonic() - started,
    )


def _write(fh: IO[str], obj: dict[str, Any]) -> None:
    fh.write(json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n")
