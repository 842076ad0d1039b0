"""HTTP, Celery and domain metrics for ``/metrics`` (prometheus-client; see :mod:`nvke.metrics`).

* ``nvke_http_requests_total{route, method, status, process}`` and
  ``nvke_http_request_duration_seconds{route, method}`` (histogram, s) — ``route`` is the URL
  pattern (``api/v1/clusters/<uuid:cluster_pk>/usage``), never the raw path, so ids do not
  explode the label set; ``process`` is ``NVKE_PROCESS_NAME`` (e.g. ``web-1``) or the pid.
* ``nvke_celery_tasks_total{task, state, queue, worker}`` and
  ``nvke_celery_task_duration_seconds{task, queue}`` — from Celery's task signals in the worker.
* ``nvke_celery_queue_depth{queue}`` — messages waiting, and ``nvke_celery_messages{queue,
  state}`` — waiting / reserved (unacked) / scheduled (unacked countdowns), read from the
  broker's Redis at scrape time (:class:`QueueDepthCollector`).
* ``nvke_heartbeat_age_seconds{kind, name, state}`` — workers' and beat's heartbeats
  (:mod:`nvke.heartbeat`).
* ``nvke_clusters{phase}``, ``nvke_nodepools{phase}``, ``nvke_operations{status}``,
  ``nvke_reconcile_lag_seconds{kind}`` (age of the oldest unconverged object) — from
  PostgreSQL at scrape time.

All of it works under multi-process gunicorn and prefork Celery when ``PROMETHEUS_MULTIPROC_DIR``
is set (prometheus-client's multiprocess mode). Workers can serve their own ``/metrics`` on
``NVKE_WORKER_METRICS_PORT`` when they do not share that folder with a web process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

from celery import signals
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from nvke.settings_registry import read

from .heartbeat import HeartbeatCollector
from .metrics import register_collector

PROCESS = read("NVKE_PROCESS_NAME") or f"pid-{os.getpid()}"

HTTP_REQUESTS = Counter(
    "nvke_http_requests", "HTTP requests", ["route", "method", "status", "process"]
)
HTTP_LATENCY = Histogram(
    "nvke_http_request_duration_seconds",
    "HTTP request latency (s)",
    ["route", "method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
TASKS = Counter("nvke_celery_tasks", "Celery tasks finished", ["task", "state", "queue", "worker"])
TASK_LATENCY = Histogram(
    "nvke_celery_task_duration_seconds",
    "Celery task run time (s)",
    ["task", "queue"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)


#: the methods that get their own label value; any other (``FOO``, ``PROPFIND`` …) is
#: counted as ``OTHER``, so a client cannot create new series by inventing methods
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(method: str | None) -> str:
    """``"GET"`` -> ``"GET"``; anything outside :data:`KNOWN_METHODS` -> ``"OTHER"``."""
    return method if method in KNOWN_METHODS else "OTHER"


def status_label(status: int) -> str:
    """A status code as a label: one of the codes HTTP defines (100..599), else ``"other"``."""
    return str(status) if 100 <= status <= 599 else "other"


class HttpMetricsMiddleware:
    """Counts and times every request by route pattern, method and status. Every label has a
    bounded set of values: routes are URL patterns (or ``unmatched``), methods
    :data:`KNOWN_METHODS` or ``OTHER``, statuses 100..599."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = (match.route if match else None) or "unmatched"
        method = method_label(request.method)
        HTTP_REQUESTS.labels(route, method, status_label(response.status_code), PROCESS).inc()
        HTTP_LATENCY.labels(route, method).observe(time.perf_counter() - started)
        return response


_started: dict[str, float] = {}


def _queue(task: Any) -> str:
    info = getattr(task.request, "delivery_info", None) or {}
    return info.get("routing_key") or "unknown"


@signals.task_prerun.connect
def _task_started(task_id=None, task=None, **kwargs) -> None:
    _started[task_id] = time.perf_counter()


@signals.task_postrun.connect
def _task_finished(task_id=None, task=None, state=None, **kwargs) -> None:
    started = _started.pop(task_id, None)
    queue = _queue(task)
    worker = getattr(task.request, "hostname", None) or PROCESS
    TASKS.labels(task.name, state or "UNKNOWN", queue, worker).inc()
    if started is not None:
        TASK_LATENCY.labels(task.name, queue).observe(time.perf_counter() - started)


@signals.worker_ready.connect
def _serve_worker_metrics(**kwargs) -> None:
    port = read("NVKE_WORKER_METRICS_PORT")
    if port:
        from prometheus_client import CollectorRegistry, start_http_server

        registry = None
        if read("PROMETHEUS_MULTIPROC_DIR"):
            # the task counters live in the pool children's files: read them all
            from prometheus_client.multiprocess import MultiProcessCollector

            registry = CollectorRegistry()
            MultiProcessCollector(registry)
        if registry is None:
            start_http_server(int(port))
        else:
            start_http_server(int(port), registry=registry)


def broker_redis_url(broker_url: str) -> str:
    """The redis-py URL of a kombu Redis broker URL (``redis+socket:///path?virtual_host=N``
    -> ``unix:///path?db=N``; ``redis://`` / ``rediss://`` unchanged)."""
    from urllib.parse import parse_qs, urlsplit

    if not broker_url.startswith("redis+socket://"):
        return broker_url
    parts = urlsplit(broker_url)
    db = parse_qs(parts.query).get("virtual_host", ["0"])[0] or "0"
    return f"unix://{parts.path}?db={db}"


class QueueDepthCollector:
    """Messages per Celery queue, read from the broker's Redis at scrape time.

    * ``nvke_celery_queue_depth{queue}``: waiting in the queue (Redis list length);
    * ``nvke_celery_messages{queue, state}``: ``waiting`` (the same), ``reserved`` (delivered
      to a worker, not yet acknowledged: running, or lost with a dead worker until the
      visibility timeout hands it out again) and ``scheduled`` (delivered and unacknowledged
      with an ETA still in the future: a countdown waiting in a worker). kombu keeps the last
      two in its ``unacked`` hash, with the message and its routing key; a message with an ETA
      header in the future counts as scheduled. The hash is read in pages (HSCAN), so a large
      backlog costs a longer scrape, never a blocked Redis.
    """

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        import json
        from datetime import UTC, datetime

        import redis
        from django.conf import settings

        depth = GaugeMetricFamily("nvke_celery_queue_depth", "Messages waiting", labels=["queue"])
        states = GaugeMetricFamily(
            "nvke_celery_messages",
            "Messages per queue: waiting, reserved (unacked), scheduled (unacked, ETA ahead)",
            labels=["queue", "state"],
        )
        queues = {r["queue"] for r in settings.CELERY_TASK_ROUTES.values()}
        queues.add(settings.CELERY_TASK_DEFAULT_QUEUE)
        counts = {q: {"waiting": 0, "reserved": 0, "scheduled": 0} for q in queues}
        now = datetime.now(UTC)
        try:
            client = redis.Redis.from_url(
                broker_redis_url(settings.CELERY_BROKER_URL), socket_timeout=2
            )
            for queue in queues:
                counts[queue]["waiting"] = client.llen(queue)
            for _tag, raw in client.hscan_iter("unacked", count=500):
                try:
                    message, _exchange, routing_key = json.loads(raw)
                    eta = (message.get("headers") or {}).get("eta")
                except (ValueError, TypeError, AttributeError):
                    continue
                bucket = counts.setdefault(
                    routing_key, {"waiting": 0, "reserved": 0, "scheduled": 0}
                )
                ahead = False
                if eta:
                    try:
                        when = datetime.fromisoformat(eta)
                        ahead = (when if when.tzinfo else when.replace(tzinfo=UTC)) > now
                    except ValueError:
                        ahead = False
                bucket["scheduled" if ahead else "reserved"] += 1
        except redis.RedisError:
            return
        for queue in sorted(counts):
            if queue in queues:
                depth.add_metric([queue], counts[queue]["waiting"])
            for state, value in counts[queue].items():
                states.add_metric([queue, state], value)
        yield depth
        yield states


class DomainCollector:
    """Clusters and node pools by phase, operations by status, reconcile lag (s)."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from django.db import connection

        with connection.cursor() as cursor:
            for name, table, column in (
                ("nvke_clusters", "clusters_cluster", "phase"),
                ("nvke_nodepools", "nodepools_nodepool", "phase"),
                ("nvke_operations", "clusters_operation", "status"),
            ):
                family = GaugeMetricFamily(name, f"{table} rows by {column}", labels=[column])
                cursor.execute(f"SELECT {column}, count(*) FROM {table} GROUP BY 1 ORDER BY 1")
                for value, count in cursor.fetchall():
                    family.add_metric([value], count)
                yield family
            lag = GaugeMetricFamily(
                "nvke_reconcile_lag_seconds",
                "Age of the oldest object whose status lags its spec (s)",
                labels=["kind"],
            )
            for kind, table in (
                ("cluster", "clusters_cluster"),
                ("nodepool", "nodepools_nodepool"),
            ):
                cursor.execute(
                    f"SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(updated_at)), 0) FROM {table} "
                    "WHERE observed_generation < generation AND phase NOT IN ('DELETED', 'ERROR')"
                )
                lag.add_metric([kind], float(cursor.fetchone()[0]))
            yield lag


register_collector(QueueDepthCollector())
register_collector(DomainCollector())
register_collector(HeartbeatCollector())
