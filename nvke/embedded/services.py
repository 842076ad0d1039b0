"""PostgreSQL + Redis for one data folder: started when their URLs are not given, then stopped.

:class:`EmbeddedServices` is what both ``python -m nvke.embedded services`` and ``run`` use:

- ``DATABASE_URL`` unset (or empty): start PostgreSQL in ``$NVKE_DATA_DIR/postgres``.
- ``REDIS_URL`` unset (or empty): start Redis on ``$NVKE_DATA_DIR/redis/redis.sock`` and export
  ``REDIS_URL`` (``unix://``, for redis-py / Django) and ``CELERY_BROKER_URL``
  (``redis+socket://``, for kombu) unless ``CELERY_BROKER_URL`` is set.
- ``REDIS_URL=unix://...`` given without ``CELERY_BROKER_URL``: the broker URL is derived.

It holds the data folder's lock for its lifetime, clears what a crashed run left behind, and
records everything in ``services.json`` and ``env.sh``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .datadir import DataDirLock, StateFile, write_env_file
from .postgres import EmbeddedPostgres, start_postgres, stop_stale_postgres
from .procutil import pid_alive, stop_process_group, terminate_processes
from .redis import EmbeddedRedis, broker_url_from_redis_url, find_stale_servers, start_redis

log = logging.getLogger(__name__)


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for files and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class EmbeddedServices:
    """Start/stop the embedded PostgreSQL and Redis for ``data_dir`` (a context manager).

    ``environ`` (default ``os.environ``) decides what is external. After :meth:`start`,
    :attr:`env` holds the variables to export to Django/Celery processes.
    """

    def __init__(
        self,
        data_dir: Path,
        environ: Mapping[str, str] | None = None,
        *,
        mode: str = "services",
    ) -> None:
        self.data_dir = data_dir
        self.environ = dict(os.environ if environ is None else environ)
        self.mode = mode
        self.lock = DataDirLock(data_dir)
        self.state = StateFile(data_dir)
        self.postgres: EmbeddedPostgres | None = None
        self.redis: EmbeddedRedis | None = None
        self.env: dict[str, str] = {}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> dict[str, str]:
        """Take the lock, start what is missing, write services.json; return :attr:`env`."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        try:
            self._clear_previous_run()
            self._start()
        except BaseException:
            self.stop()
            raise
        return self.env

    def _start(self) -> None:
        env: dict[str, str] = {"NVKE_DATA_DIR": str(self.data_dir)}
        self.state.update(
            mode=self.mode,
            running=True,
            runner_pid=os.getpid(),
            data_dir=str(self.data_dir),
            postgres=None,
            redis=None,
            processes={},
            web=None,
        )
        if self.environ.get("DATABASE_URL"):
            log.info("DATABASE_URL is set: not starting PostgreSQL")
            self.state.update(postgres={"external": True})
        else:
            self.postgres = start_postgres(self.data_dir / "postgres")
            env["DATABASE_URL"] = self.postgres.url
            self.state.update(postgres=self.postgres.as_dict())

        if self.environ.get("REDIS_URL"):
            log.info("REDIS_URL is set: not starting Redis")
            self.state.update(redis={"external": True})
            if not self.environ.get("CELERY_BROKER_URL"):
                broker = broker_url_from_redis_url(self.environ["REDIS_URL"])
                if broker != self.environ["REDIS_URL"]:
                    env["CELERY_BROKER_URL"] = broker
        else:
            self.redis = start_redis(self.data_dir / "redis")
            env["REDIS_URL"] = self.redis.url
            if not self.environ.get("CELERY_BROKER_URL"):
                env["CELERY_BROKER_URL"] = self.redis.broker_url
            self.state.update(redis=self.redis.as_dict())

        self.env = env
        self.state.update(env={k: mask_url(v) for k, v in env.items()})
        write_env_file(self.data_dir, env)

    def stop(self) -> None:
        """Stop Redis then PostgreSQL (only what we started), record it, drop the lock."""
        try:
            if self.redis is not None:
                log.info("stopping Redis (pid %s)", self.redis.pid)
                try:
                    self.redis.stop()
                except Exception:  # PostgreSQL must still be stopped
                    log.exception("stopping Redis failed")
                self.redis = None
            if self.postgres is not None:
                log.info("stopping PostgreSQL (pid %s)", self.postgres.pid)
                self.postgres.stop()
                self.postgres = None
            if self.state.data:
                self.state.update(running=False, runner_pid=None, processes={})
        finally:
            self.lock.release()

    def __enter__(self) -> EmbeddedServices:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ crash recovery
    def _clear_previous_run(self) -> None:
        """Stop processes a crashed runner left (we hold the lock, so that runner is gone).

        Supervised processes are recognised by pid *and* start time, so a recycled pid is never
        signalled. PostgreSQL is left for :func:`start_postgres` to reuse; Redis is restarted.
        """
        previous = self.state.read()
        stale = clear_stale_processes(previous)
        if stale:
            log.warning("stopped processes left by a previous run: %s", ", ".join(stale))


def clear_stale_processes(previous: Mapping[str, Any]) -> list[str]:
    """Stop the supervised processes recorded in an old ``services.json``; return their names."""
    stopped = []
    for name, entry in (previous.get("processes") or {}).items():
        pid, created = entry.get("pid"), entry.get("create_time")
        if not pid or created is None or not pid_alive(pid, created):
            continue
        try:
            leads_group = os.getpgid(pid) == pid
        except OSError:
            continue
        if leads_group:
            stop_process_group(pid)
        else:
            terminate_processes([pid])
        stopped.append(f"{name} (pid {pid})")
    return stopped


def stop_data_dir(data_dir: Path) -> list[str]:
    """Stop everything a dead runner left on ``data_dir`` (``python -m nvke.embedded stop``).

    Raises :class:`~nvke.embedded.datadir.DataDirBusyError` while a live runner holds it.
    """
    state = StateFile(data_dir)
    with DataDirLock(data_dir):
        previous = state.read()
        stopped = clear_stale_processes(previous)
        redis_info = previous.get("redis") or {}
        if redis_info.get("pid") and redis_info.get("socket"):
            pids = find_stale_servers(Path(redis_info["socket"]), data_dir / "redis" / "redis.pid")
            if pids:
                terminate_processes(pids)
                stopped.append(f"redis (pid {', '.join(map(str, pids))})")
        if stop_stale_postgres(data_dir / "postgres"):
            stopped.append("postgres")
        if previous:
            state.data = dict(previous)
            state.update(running=False, runner_pid=None, processes={})
    return stopped
