"""Heartbeats of workers and beat, for an operator to alert on.

Each Celery worker (a bootstep on the worker's own timer, so a wedged event loop stops beating)
and each beat (every scheduler tick, :mod:`nvke.beat`) writes ``nvke:heartbeat:<kind>:<name>``
= ``{"ts": unix seconds, "state": …, "pid": …}`` in Redis (kept 1 day) every
``NVKE_HEARTBEAT_INTERVAL_S`` (default 10 s). ``/metrics`` exports, per process found there,
``nvke_heartbeat_age_seconds{kind, name, state}`` (now - last beat).

Alert on it, e.g. ``max by (kind) (nvke_heartbeat_age_seconds{kind="worker"}) > 60`` or
``absent(nvke_heartbeat_age_seconds{kind="beat", state="active"})`` (no active beat). A Redis
outage stops every heartbeat, which is right: nothing is dispatched without the broker. A
Redis restarted empty loses them until the next beat (≤ one interval). Writes never raise.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

from celery import bootsteps
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)

PREFIX = "nvke:heartbeat:"
TTL_S = 86400


def interval_s() -> float:
    from django.conf import settings

    return float(settings.NVKE_HEARTBEAT_INTERVAL_S)


_clients: dict[str, Any] = {}


def _client() -> Any:
    """One client per Redis URL and process (short timeouts: a heartbeat never hangs)."""
    import redis
    from django.conf import settings

    url = settings.REDIS_URL
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    return _clients[url]


def write(kind: str, name: str, state: str = "alive") -> bool:
    """Record a heartbeat now; False (debug-logged) when Redis cannot be reached."""
    import redis

    value = json.dumps({"ts": time.time(), "state": state, "pid": os.getpid()})
    try:
        _client().set(f"{PREFIX}{kind}:{name}", value, ex=TTL_S)
    except redis.RedisError as exc:
        log.debug("heartbeat %s:%s not written: %s", kind, name, exc)
        return False
    return True


_last_beat = 0.0


def beat(state: str) -> None:
    """Beat's heartbeat (called every tick, written at most once per interval)."""
    global _last_beat
    now = time.monotonic()
    if now - _last_beat >= interval_s() and write(
        "beat", f"{socket.gethostname()}:{os.getpid()}", state
    ):
        _last_beat = now


class WorkerHeartbeat(bootsteps.StartStopStep):
    """Worker bootstep: write the worker's heartbeat from its timer every interval."""

    requires = ("celery.worker.components:Timer",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        self.tref: Any = None

    def start(self, worker: Any) -> None:
        name = worker.hostname
        write("worker", name)
        self.tref = worker.timer.call_repeatedly(interval_s(), write, ("worker", name))

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None


class HeartbeatCollector:
    """``nvke_heartbeat_age_seconds{kind, name, state}`` from the heartbeat keys."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        import redis

        family = GaugeMetricFamily(
            "nvke_heartbeat_age_seconds",
            "Seconds since a worker or beat last wrote its heartbeat",
            labels=["kind", "name", "state"],
        )
        now = time.time()
        try:
            client = _client()
            keys = sorted(client.scan_iter(match=f"{PREFIX}*", count=500))
            values = client.mget(keys) if keys else []
        except redis.RedisError:
            return
        for key, raw in zip(keys, values, strict=True):
            if raw is None:
                continue
            kind, _, name = key.decode()[len(PREFIX) :].partition(":")
            data = json.loads(raw)
            family.add_metric([kind, name, data.get("state", "")], max(now - data["ts"], 0.0))
        yield family
