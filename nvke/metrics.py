"""``/metrics``: the Prometheus text exposition of the control plane.

Apps define their metrics where they live and plug in here:

* counters/histograms made with ``prometheus_client`` at import time (e.g. the agent reports
  and samples counters of :mod:`fleet.metrics`) — in a multi-process server (gunicorn workers,
  Celery) set ``PROMETHEUS_MULTIPROC_DIR`` to an empty, writable folder shared by the
  processes: the values are then read from there by ``MultiProcessCollector``
  (prometheus_client's multiprocess mode) instead of this process' memory;
* collectors that read current state from the database at scrape time (gauges such as GPUs by
  state) register with :func:`register_collector`; they are asked once per scrape, never
  cached.

The endpoint takes no credentials, like ``/healthz``: it exposes fleet-wide counts only (no
tenant names or ids). In production set ``NVKE_INTERNAL_PORT``: ``/metrics`` (and ``/admin/``)
then answer only connections accepted on that port (:mod:`nvke.internal_port`) and are a 404
on the public one. Keep that port out of the Service the ingress reaches.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from nvke.settings_registry import read

_collectors: list[Any] = []


def register_collector(collector: Any) -> None:
    """Add a collector (an object with ``collect()`` yielding metric families). Idempotent."""
    if all(existing is not collector for existing in _collectors):
        _collectors.append(collector)


class _ProcessRegistry:
    """This process' default registry, as one collector of the per-scrape registry."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        return REGISTRY.collect()


def build_registry(*, include_collectors: bool = True) -> CollectorRegistry:
    """A registry for one scrape: process (or multiprocess) metrics plus the app collectors."""
    registry = CollectorRegistry(auto_describe=False)
    if read("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)
    else:
        registry.register(_ProcessRegistry())  # type: ignore[arg-type]
    if include_collectors:
        for collector in _collectors:
            registry.register(collector)
    return registry


def metrics_view(request: HttpRequest) -> HttpResponse:
    """GET /metrics: the Prometheus text exposition format (404 off the internal port, by
    :class:`nvke.internal_port.InternalPortMiddleware`)."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
    return HttpResponse(generate_latest(build_registry()), content_type=CONTENT_TYPE_LATEST)
