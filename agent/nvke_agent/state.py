"""Persisted agent state: ``<state_dir>/state.json`` (mode 0600, written atomically).

Shape::

    {"host_id": "<uuid>" | null,        # from registration
     "credential": "<secret>" | null,   # per-host credential (a secret: never logged)
     "report_interval_s": int | null,   # what the server asked for at registration
     "next_seq": int,                   # the next report seq; >= 1, only ever increases;
                                        # above the server's seq_baseline at registration
     "dropped_batches": int,            # batches dropped because the spool was over its cap
     "dropped_samples": int}            # samples in those batches

``next_seq`` is persisted *before* a seq is used (:meth:`StateStore.allocate_seq`), so a crash
can skip a seq but never reuse one; the server is idempotent on ``(host, seq)``, so reusing a
seq would silently lose a batch. A state file that cannot be read is an error, never a reset.
Two agents on one state dir would hand out the same seqs, so commands hold
:meth:`StateStore.exclusive` (an ``flock`` on ``<state_dir>/lock``) while they run.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from nvke_agent.fsutil import atomic_write

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
LOCK_FILE = "lock"


class StateError(RuntimeError):
    """The state file exists but cannot be used (corrupt, wrong shape)."""


@dataclass
class State:
    """In-memory copy of ``state.json`` (see module docstring for the fields)."""

    host_id: str | None = None
    credential: str | None = None
    report_interval_s: int | None = None
    next_seq: int = 1
    dropped_batches: int = 0
    dropped_samples: int = 0

    @property
    def registered(self) -> bool:
        """True when the host has an id and a credential."""
        return bool(self.host_id and self.credential)


class StateStore:
    """Loads and saves :class:`State` under ``state_dir``; thread-safe."""

    def __init__(self, state_dir: str | Path) -> None:
        """Create ``state_dir`` (mode 0700) if needed and load the state (defaults if absent)."""
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = self.state_dir / STATE_FILE
        self._lock = threading.Lock()
        self.state = self._load()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold an exclusive lock on the state dir; :class:`StateError` if another holds it.

        A read-only state dir: the lock file is opened read-only (``flock`` works on it); when
        it does not exist there nothing is locked — an agent that cannot write makes no
        reports, so it cannot hand out a seq another agent also uses."""
        try:
            fd = os.open(self.state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC):
                raise
            try:
                fd = os.open(self.state_dir / LOCK_FILE, os.O_RDONLY)
            except FileNotFoundError:
                yield
                return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise StateError(
                f"another nvke-agent is using {self.state_dir} (lock held on {LOCK_FILE})"
            ) from exc
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _load(self) -> State:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return State()
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc}") from exc
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            known = {key: data[key] for key in State.__dataclass_fields__ if key in data}
            state = State(**known)
            if not isinstance(state.next_seq, int) or state.next_seq < 1:
                raise ValueError(f"next_seq must be an integer >= 1, got {state.next_seq!r}")
        except (ValueError, TypeError) as exc:
            raise StateError(
                f"{self.path} is corrupt ({exc}); refusing to start rather than reuse report "
                "sequence numbers: fix or remove it (removing it needs a new registration)"
            ) from exc
        return state

    def save(self) -> None:
        """Write the state atomically (mode 0600)."""
        with self._lock:
            self._save_locked()

    def _save_locked(self) -> None:
        data = json.dumps(asdict(self.state), indent=2, sort_keys=True).encode()
        atomic_write(self.path, data, mode=0o600)

    def set_registration(
        self,
        host_id: str,
        credential: str,
        report_interval_s: int | None,
        seq_baseline: int = 0,
    ) -> None:
        """Store a new registration and persist it.

        ``seq_baseline`` is the highest seq the server accepted from this host (the
        registration answer): ``next_seq`` moves above it (and never back), so an agent that
        lost its state does not send new reports under seqs the server already holds — which
        it would acknowledge as duplicates and drop.
        """
        with self._lock:
            self.state.host_id = host_id
            self.state.credential = credential
            self.state.report_interval_s = report_interval_s
            self.state.next_seq = max(self.state.next_seq, seq_baseline + 1)
            self._save_locked()

    def allocate_seq(self) -> int:
        """Return the next seq and persist ``next_seq + 1`` before returning it. OSError
        (a full disk, a read-only state dir) when it cannot be persisted: then the seq is
        not handed out."""
        with self._lock:
            seq = self.state.next_seq
            self.state.next_seq = seq + 1
            try:
                self._save_locked()
            except OSError:
                self.state.next_seq = seq
                raise
            return seq

    def count_dropped(self, batches: int, samples: int) -> None:
        """Add to the dropped-batch counters and persist them when the state dir can be
        written (a drop because it cannot be is still counted, in memory, and persisted with
        the next write that works)."""
        with self._lock:
            self.state.dropped_batches += batches
            self.state.dropped_samples += samples
            try:
                self._save_locked()
            except OSError as exc:
                log.debug("dropped counters kept in memory: %s", exc)
