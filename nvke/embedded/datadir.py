"""The embedded data folder: where it is, who uses it (a lock), and what runs (services.json).

Layout of ``$NVKE_DATA_DIR`` (default ``.nvke/`` under the current directory)::

    postgres/             PostgreSQL cluster (initdb once; its Unix socket lives here too)
    redis/                redis.sock, redis.pid, redis.log
    static/               collectstatic output (STATIC_ROOT)
    services.json         what the current (or last) run started: pids, sockets, URLs
    env.sh                ``export`` lines for DATABASE_URL / REDIS_URL / CELERY_BROKER_URL
    .lock                 held (fcntl) by the one runner that uses this folder
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nvke.settings_registry import read

SERVICES_FILE = "services.json"
ENV_FILE = "env.sh"
LOCK_FILE = ".lock"


def resolve_data_dir(value: str | os.PathLike[str] | None = None) -> Path:
    """The absolute data folder: ``value``, else ``$NVKE_DATA_DIR``, else ``./.nvke``."""
    raw = value or read("NVKE_DATA_DIR")
    return Path(raw).expanduser().absolute()


class DataDirBusyError(RuntimeError):
    """Another runner holds the data folder's lock."""


class DataDirLock:
    """An exclusive, non-blocking lock on ``<data_dir>/.lock`` for one runner process.

    POSIX record locks (``lockf``) belong to the process, are not inherited by forked helpers
    and vanish when the process dies, so a lock left by a crashed runner never blocks the next.
    They do not exclude a second lock *in the same process* (and closing any descriptor of
    the file drops them), so paths locked by this process are also tracked in memory.
    """

    _held: set[Path] = set()
    _held_guard = threading.Lock()

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir.absolute() / LOCK_FILE
        self._fd: int | None = None

    def _busy(self, holder: str) -> DataDirBusyError:
        return DataDirBusyError(
            f"{self.path.parent} is in use by another nvke.embedded runner (pid {holder}); "
            "stop it first or set NVKE_DATA_DIR to another folder"
        )

    def acquire(self) -> DataDirLock:
        """Take the lock or raise :class:`DataDirBusyError` naming the holder's pid."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._held_guard:
            if self.path in self._held:
                raise self._busy(str(os.getpid()))
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise self._busy(holder) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self._fd = fd
            self._held.add(self.path)
        return self

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        with self._held_guard:
            if self._fd is None:
                return
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
                fcntl.lockf(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
            self._held.discard(self.path)

    def __enter__(self) -> DataDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` so readers never see a half-written file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class StateFile:
    """``services.json``: a JSON object updated in place by the runner (thread-safe).

    Keys written by the runner: ``mode``, ``running``, ``runner_pid``, ``data_dir``, ``env``,
    ``postgres``, ``redis``, ``web`` (``url``, ``port``, ``ready``) and ``processes``
    (``name -> {"pid", "create_time"}``; each pid leads its own process group).
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / SERVICES_FILE
        self._lock = threading.Lock()
        self.data: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        """The last state written by any run, or ``{}``."""
        try:
            value = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    def update(self, **values: Any) -> None:
        """Merge ``values`` into the state and write the file."""
        with self._lock:
            self.data.update(values)
            atomic_write(self.path, json.dumps(self.data, indent=2, sort_keys=True) + "\n")


def write_env_file(data_dir: Path, env: Mapping[str, str]) -> Path:
    """Write ``<data_dir>/env.sh`` with ``export`` lines (``source`` it in a shell)."""
    path = data_dir / ENV_FILE
    atomic_write(path, export_lines(env) + "\n", mode=0o600)
    return path


def export_lines(env: Mapping[str, str]) -> str:
    """``export NAME=value`` lines, shell-quoted, in a stable order."""
    return "\n".join(f"export {name}={shlex.quote(value)}" for name, value in env.items())
