"""On-disk spool of report batches: nothing is deleted before the API acknowledges it.

Layout under ``<state_dir>/spool/``::

    000000000042.json      a pending batch (the full report body, its ``seq`` in the name)
    corrupt/               files found unreadable on start (crash, disk error) — kept for a human
    rejected/              batches the API refused for good (4xx other than 401/408/429), with
                           a ``<seq>.reason.json`` beside each: {"status", "detail", "rejected_at"}

Each batch is written with write-temp + fsync + rename + fsync(dir) (:mod:`nvke_agent.fsutil`),
so a pending file is complete or absent. Batches are handed out in seq order. When the pending
files add up to more than ``max_bytes`` the oldest are dropped (never the newest one); the
caller persists the drop counters in the state file and the drop is logged at ERROR level.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nvke_agent.fsutil import TMP_SUFFIX, atomic_write, fsync_dir

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 * 2**20
_BATCH_NAME = re.compile(r"^(\d{12})\.json$")


@dataclass(frozen=True)
class DroppedBatch:
    """A batch removed because the spool was over its size cap."""

    seq: int
    size_bytes: int
    samples: int


class Spool:
    """Pending report batches in ``<state_dir>/spool`` (see module docstring). Thread-safe."""

    def __init__(self, state_dir: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        """Create the folders and index what a previous run left behind."""
        self.dir = Path(state_dir) / "spool"
        self.corrupt_dir = self.dir / "corrupt"
        self.rejected_dir = self.dir / "rejected"
        for folder in (self.dir, self.corrupt_dir, self.rejected_dir):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._sizes: dict[int, int] = {}
        self._recover()

    @staticmethod
    def filename(seq: int) -> str:
        """``42`` -> ``"000000000042.json"``."""
        return f"{seq:012d}.json"

    def _recover(self) -> None:
        for entry in os.scandir(self.dir):
            if not entry.is_file():
                continue
            match = _BATCH_NAME.match(entry.name)
            if match:
                self._sizes[int(match.group(1))] = entry.stat().st_size
            elif entry.name.endswith(TMP_SUFFIX):
                # A write that never reached its rename: the process died mid-write.
                self._move_aside(Path(entry.path), "temporary file of an interrupted write")
        if self._sizes:
            log.info(
                "spool holds %d unsent batch(es) from a previous run",
                len(self._sizes),
                extra={"fields": {"pending": len(self._sizes), "bytes": self.total_bytes}},
            )

    # --- queries --------------------------------------------------------------------------------

    def pending(self) -> list[int]:
        """Seqs of the pending batches, oldest first."""
        with self._lock:
            return sorted(self._sizes)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sizes)

    @property
    def total_bytes(self) -> int:
        """Bytes of all pending batch files."""
        return sum(self._sizes.values())

    # --- writes ---------------------------------------------------------------------------------

    def put(self, seq: int, body: dict[str, Any]) -> None:
        """Durably store a batch; ``body["seq"]`` must equal ``seq``."""
        if body.get("seq") != seq:
            raise ValueError(f"body seq {body.get('seq')!r} does not match {seq}")
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        with self._lock:
            atomic_write(self.dir / self.filename(seq), data, mode=0o600)
            self._sizes[seq] = len(data)

    def load(self, seq: int) -> dict[str, Any] | None:
        """The batch ``seq``, or ``None`` if it is gone or unreadable (then moved to corrupt/)."""
        path = self.dir / self.filename(seq)
        with self._lock:
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                self._sizes.pop(seq, None)
                return None
            try:
                body = json.loads(raw)
                if not isinstance(body, dict) or body.get("seq") != seq:
                    raise ValueError("not a report body with this seq")
            except (ValueError, UnicodeDecodeError) as exc:
                self._sizes.pop(seq, None)
                self._move_aside(path, f"unreadable batch: {exc}")
                return None
            return body

    def ack(self, seq: int) -> None:
        """The API acknowledged ``seq``: delete it."""
        with self._lock:
            path = self.dir / self.filename(seq)
            path.unlink(missing_ok=True)
            fsync_dir(self.dir)
            self._sizes.pop(seq, None)

    def reject(self, seq: int, *, status: int, detail: str) -> Path:
        """The API refused ``seq`` for good: move it to rejected/ with a reason file."""
        with self._lock:
            source = self.dir / self.filename(seq)
            target = self.rejected_dir / self.filename(seq)
            reason = {"status": status, "detail": detail, "rejected_at": _now()}
            atomic_write(
                self.rejected_dir / f"{seq:012d}.reason.json",
                json.dumps(reason, indent=2).encode(),
            )
            os.replace(source, target)
            fsync_dir(self.rejected_dir)
            fsync_dir(self.dir)
            self._sizes.pop(seq, None)
        log.error(
            "API refused batch seq=%d for good (HTTP %d): %s; kept in %s",
            seq,
            status,
            detail,
            target,
            extra={"fields": {"seq": seq, "status": status}},
        )
        return target

    def enforce_cap(self) -> list[DroppedBatch]:
        """Drop the oldest batches while over ``max_bytes`` (the newest always stays)."""
        dropped: list[DroppedBatch] = []
        with self._lock:
            while len(self._sizes) > 1 and self.total_bytes > self.max_bytes:
                seq = min(self._sizes)
                path = self.dir / self.filename(seq)
                samples = _count_samples(path)
                path.unlink(missing_ok=True)
                dropped.append(DroppedBatch(seq, self._sizes.pop(seq), samples))
            if dropped:
                fsync_dir(self.dir)
        return dropped

    def _move_aside(self, path: Path, why: str) -> None:
        target = self.corrupt_dir / path.name
        os.replace(path, target)
        fsync_dir(self.corrupt_dir)
        fsync_dir(self.dir)
        log.error(
            "spool file %s moved to %s: %s",
            path.name,
            self.corrupt_dir,
            why,
            extra={"fields": {"file": path.name}},
        )


def _count_samples(path: Path) -> int:
    try:
        return len(json.loads(path.read_bytes()).get("samples") or [])
    except (OSError, ValueError, AttributeError):
        return 0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
