"""On-disk spool of report batches: append-only, fsync'ed, nothing deleted before the API
acknowledges it, and it survives a crash in the middle of a write.

Layout under ``<state_dir>/spool/``::

    seg-000000000042.jsonl  a segment: one pending-or-done batch per line (the full report
                            body as JSON, its ``seq`` inside), appended in seq order; the name
                            is the first seq it holds. A new segment starts past
                            ``segment_bytes`` (1 MiB).
    done.jsonl              one line per finished batch: ``{"seq": 42, "how": "acked" |
                            "dropped" | "rejected" | "corrupt"}``, appended.
    corrupt/                bytes found unreadable on start (a torn last line, a damaged line)
    rejected/               batches the API refused for good (4xx other than 401/408/429), with
                            a ``<seq>.reason.json`` beside each: {"status", "detail", "rejected_at"}

Writes are ``write`` + ``fsync`` of the segment (and of the folder when a file is created), so
an acknowledged ``put`` is on disk. A crash can leave the *last* line of a segment (or of
``done.jsonl``) cut short: on start that torn tail is copied to ``corrupt/``, logged, and the
file is truncated back to its last complete line — the batch it belonged to was never
acknowledged to the caller, so nothing that was spooled is lost. A segment is deleted once all
its batches are done; ``done.jsonl`` is rewritten (atomically) without the entries of deleted
segments when it grows.

Size cap: when the pending batches add up to more than ``max_bytes`` the oldest are dropped
(never the newest one); the caller persists the drop counters and logs the drop at ERROR.

A state dir that cannot be written (full disk, read-only): :meth:`Spool.put` raises the
``OSError`` after cutting the segment back to its last complete batch (a partial line would
corrupt every later one), so the caller can count the report as dropped and go on. Everything
that only *finishes* batches goes on without writing: an acknowledged batch whose ``done``
record cannot be written is done for this run (and resent once after a restart: the server
answers it as a duplicate); a segment with nothing pending is still deleted, which frees
space. A read-only spool found at start is read as it is.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nvke_agent.fsutil import atomic_write, fsync_dir

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 * 2**20
DEFAULT_SEGMENT_BYTES = 2**20
DONE_FILE = "done.jsonl"
_SEGMENT = re.compile(r"^seg-(\d{12})\.jsonl$")


@dataclass(frozen=True)
class DroppedBatch:
    """A batch removed because the spool was over its size cap."""

    seq: int
    size_bytes: int
    samples: int


@dataclass(frozen=True)
class _Where:
    segment: str  # file name
    offset: int
    length: int


class Spool:
    """Pending report batches in ``<state_dir>/spool`` (see module docstring). Thread-safe."""

    def __init__(
        self,
        state_dir: str | Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    ) -> None:
        """Create the folders and recover what a previous run left behind."""
        self.dir = Path(state_dir) / "spool"
        self.corrupt_dir = self.dir / "corrupt"
        self.rejected_dir = self.dir / "rejected"
        for folder in (self.dir, self.corrupt_dir, self.rejected_dir):
            try:
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:  # read-only or full: read what is there, write nothing
                log.warning("cannot create %s: %s", folder, exc)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._pending: dict[int, _Where] = {}
        self._live: dict[str, int] = {}  # segment -> pending batches in it
        self._active: str | None = None  # the segment appended to
        self._active_fd: int | None = None
        self._active_size = 0
        self._done_fd: int | None = None
        self._done_lines = 0
        self._recover()

    @staticmethod
    def segment_name(first_seq: int) -> str:
        """``42`` -> ``"seg-000000000042.jsonl"``."""
        return f"seg-{first_seq:012d}.jsonl"

    # --- recovery -------------------------------------------------------------------------------

    def _recover(self) -> None:
        if not self.dir.is_dir():
            return
        done = self._read_done()
        segments = sorted(
            entry.name for entry in os.scandir(self.dir) if _SEGMENT.match(entry.name)
        )
        for name in segments:
            for seq, where in self._read_segment(name):
                if seq in done:
                    continue
                if seq in self._pending:
                    log.error("seq %d is in two spool segments; keeping the first", seq)
                    continue
                self._pending[seq] = where
                self._live[name] = self._live.get(name, 0) + 1
        for name in segments:
            if not self._live.get(name):
                _quietly(lambda name=name: (self.dir / name).unlink(missing_ok=True))
        _quietly(lambda: fsync_dir(self.dir))
        _quietly(self._compact_done)
        if self._pending:
            log.info(
                "spool holds %d unsent batch(es) from a previous run",
                len(self._pending),
                extra={"fields": {"pending": len(self._pending), "bytes": self.total_bytes}},
            )

    def _read_done(self) -> set[int]:
        path = self.dir / DONE_FILE
        if not path.exists():
            return set()
        done: set[int] = set()
        for line in self._complete_lines(path):
            try:
                done.add(int(json.loads(line)["seq"]))
            except (ValueError, KeyError, TypeError):
                log.error("unreadable line in %s skipped: %r", path, line[:200])
        return done

    def _read_segment(self, name: str) -> list[tuple[int, _Where]]:
        path = self.dir / name
        out: list[tuple[int, _Where]] = []
        offset = 0
        for line in self._complete_lines(path):
            length = len(line) + 1
            try:
                body = json.loads(line)
                seq = body["seq"] if isinstance(body, dict) else None
                if not isinstance(seq, int):
                    raise ValueError("no integer seq")
            except (ValueError, KeyError) as exc:
                self._keep_corrupt(f"{name}.{offset}", line + b"\n", f"unreadable batch: {exc}")
            else:
                out.append((seq, _Where(name, offset, length)))
            offset += length
        return out

    def _complete_lines(self, path: Path) -> list[bytes]:
        """The file's complete lines; a torn last line is moved to corrupt/ and cut off."""
        data = path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            self._keep_corrupt(
                f"{path.name}.torn-{end}", data[end:], "last line cut short by a crash"
            )

            def cut() -> None:
                with path.open("r+b") as fh:
                    fh.truncate(end)
                    fh.flush()
                    os.fsync(fh.fileno())

            _quietly(cut)
        return [line for line in data[:end].split(b"\n")[:-1] if line.strip()]

    def _keep_corrupt(self, name: str, data: bytes, why: str) -> None:
        _quietly(lambda: atomic_write(self.corrupt_dir / name, data))
        log.error(
            "spool: %s (%d bytes kept in %s)",
            why,
            len(data),
            self.corrupt_dir / name,
            extra={"fields": {"file": name, "bytes": len(data)}},
        )

    # --- queries --------------------------------------------------------------------------------

    def pending(self) -> list[int]:
        """Seqs of the pending batches, oldest first."""
        with self._lock:
            return sorted(self._pending)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    @property
    def total_bytes(self) -> int:
        """Bytes of all pending batches."""
        return sum(where.length for where in list(self._pending.values()))

    # --- writes ---------------------------------------------------------------------------------

    def put(self, seq: int, body: dict[str, Any]) -> None:
        """Durably append a batch; ``body["seq"]`` must equal ``seq``."""
        if body.get("seq") != seq:
            raise ValueError(f"body seq {body.get('seq')!r} does not match {seq}")
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        with self._lock:
            if self._active is None or self._active_size + len(data) > self.segment_bytes:
                self._start_segment(seq)
            assert self._active is not None and self._active_fd is not None
            offset = self._active_size
            try:
                _write_all(self._active_fd, data)
                os.fsync(self._active_fd)
            except OSError:
                # ENOSPC part-way: cut the partial line off, or every later batch would be
                # read as part of it (truncating frees space, so it works on a full disk)
                _quietly(lambda: os.ftruncate(self._active_fd, offset))
                raise
            self._active_size += len(data)
            self._pending[seq] = _Where(self._active, offset, len(data))
            self._live[self._active] = self._live.get(self._active, 0) + 1

    def _start_segment(self, first_seq: int) -> None:
        self._close_active()
        previous, self._active = self._active, None  # none while the new one may fail
        if previous is not None and not self._live.get(previous):
            self._delete_segment(previous)
        name = self.segment_name(first_seq)
        path = self.dir / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.fchmod(fd, 0o600)
            fsync_dir(self.dir)
        except OSError:
            os.close(fd)
            raise
        self._active, self._active_fd = name, fd
        self._active_size = os.fstat(fd).st_size

    def _close_active(self) -> None:
        if self._active_fd is not None:
            os.close(self._active_fd)
            self._active_fd = None

    def load(self, seq: int) -> dict[str, Any] | None:
        """The batch ``seq``, or ``None`` if it is gone or unreadable (then kept in corrupt/)."""
        with self._lock:
            where = self._pending.get(seq)
            if where is None:
                return None
            line = b""
            try:
                with (self.dir / where.segment).open("rb") as fh:
                    fh.seek(where.offset)
                    line = fh.read(where.length)
                body = json.loads(line)
                if not isinstance(body, dict) or body.get("seq") != seq:
                    raise ValueError("not a report body with this seq")
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                self._keep_corrupt(f"{seq:012d}.json", line, f"unreadable batch: {exc}")
                self._finish(seq, "corrupt")
                return None
            return body

    def ack(self, seq: int) -> None:
        """The API acknowledged ``seq``: it is done."""
        with self._lock:
            self._finish(seq, "acked")

    def reject(self, seq: int, *, status: int, detail: str) -> Path:
        """The API refused ``seq`` for good: keep it in rejected/ with a reason file."""
        body = self.load(seq)
        target = self.rejected_dir / f"{seq:012d}.json"
        with self._lock:
            reason = {"status": status, "detail": detail, "rejected_at": _now()}
            try:
                atomic_write(
                    self.rejected_dir / f"{seq:012d}.reason.json", json.dumps(reason).encode()
                )
                if body is not None:
                    atomic_write(target, json.dumps(body).encode())
            except OSError as exc:
                log.error("cannot keep refused batch seq=%d in %s: %s", seq, target, exc)
            self._finish(seq, "rejected")
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
        while True:
            with self._lock:
                if len(self._pending) <= 1 or self.total_bytes <= self.max_bytes:
                    break
                seq = min(self._pending)
            body = self.load(seq) or {}
            with self._lock:
                where = self._pending.get(seq)
                if where is None:
                    continue
                self._finish(seq, "dropped")
            dropped.append(DroppedBatch(seq, where.length, len(body.get("samples") or [])))
        return dropped

    def close(self) -> None:
        """Close the open files (the spool stays usable: they are reopened when needed)."""
        with self._lock:
            self._close_active()
            self._active = None
            if self._done_fd is not None:
                os.close(self._done_fd)
                self._done_fd = None

    # --- done records -----------------------------------------------------------------------

    def _finish(self, seq: int, how: str) -> None:
        """Record ``seq`` as done (lock held) and delete its segment when nothing is left."""
        where = self._pending.pop(seq, None)
        if where is None:
            return
        try:
            self._record_done(seq, how)
        except OSError as exc:  # full or read-only: done for this run (see module docstring)
            log.warning("cannot record batch seq=%d as %s: %s", seq, how, exc)
        self._live[where.segment] -= 1
        if not self._live[where.segment] and where.segment != self._active:
            self._delete_segment(where.segment)
        if self._done_lines > 1000 and self._done_lines > 4 * len(self._pending):
            _quietly(self._compact_done)

    def _record_done(self, seq: int, how: str) -> None:
        if self._done_fd is None:
            path = self.dir / DONE_FILE
            created = not path.exists()
            self._done_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if created:
                fsync_dir(self.dir)
        size = os.fstat(self._done_fd).st_size
        try:
            _write_all(self._done_fd, json.dumps({"seq": seq, "how": how}).encode() + b"\n")
            os.fsync(self._done_fd)
        except OSError:
            _quietly(lambda: os.ftruncate(self._done_fd, size))  # no partial line stays
            raise
        self._done_lines += 1

    def _delete_segment(self, name: str) -> None:
        self._live.pop(name, None)
        try:
            (self.dir / name).unlink(missing_ok=True)
            fsync_dir(self.dir)
        except OSError as exc:  # a read-only state dir: the segment stays for the next run
            log.warning("cannot delete spool segment %s: %s", name, exc)

    def _compact_done(self) -> None:
        """Rewrite done.jsonl with only the entries of segments still on disk."""
        if self._done_fd is not None:
            os.close(self._done_fd)
            self._done_fd = None
        path = self.dir / DONE_FILE
        if not path.exists():
            self._done_lines = 0
            return
        on_disk = {entry.name for entry in os.scandir(self.dir) if _SEGMENT.match(entry.name)}
        firsts = sorted(int(_SEGMENT.match(n).group(1)) for n in on_disk)  # type: ignore[union-attr]
        keep = []
        for line in self._complete_lines(path):
            try:
                seq = int(json.loads(line)["seq"])
            except (ValueError, KeyError, TypeError):
                continue
            if firsts and seq >= firsts[0]:
                keep.append(line)
        atomic_write(path, b"".join(line + b"\n" for line in keep))
        self._done_lines = len(keep)


def _quietly(action: Callable[[], object]) -> None:
    """Run a housekeeping write that may fail on a full or read-only state dir (logged)."""
    try:
        action()
    except OSError as exc:
        log.warning("spool housekeeping skipped: %s", exc)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
