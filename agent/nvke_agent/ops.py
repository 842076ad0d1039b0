"""The agent, operable: ``/metrics`` (Prometheus) and ``/healthz`` on a local port, and the
systemd watchdog fed only while the agent is healthy.

Metric names follow dcgm-exporter's where the quantity and unit are the same, so its
dashboards work unchanged: ``DCGM_FI_DEV_GPU_UTIL`` (%), ``DCGM_FI_DEV_MEM_COPY_UTIL`` (%),
``DCGM_FI_DEV_GPU_TEMP`` (°C), ``DCGM_FI_DEV_POWER_USAGE`` (W), ``DCGM_FI_DEV_SM_CLOCK`` and
``DCGM_FI_DEV_MEM_CLOCK`` (MHz), ``DCGM_FI_DEV_XID_ERRORS`` (last Xid), with dcgm-exporter's
labels ``gpu``, ``UUID``, ``modelName`` (``GPU_I_ID`` on MIG devices). Where dcgm-exporter's
unit is not a base unit the metric is NVKE's, in base units: ``nvke_gpu_memory_used_bytes``
(dcgm: ``DCGM_FI_DEV_FB_USED`` in MiB), ``nvke_gpu_energy_joules_total`` (dcgm:
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` in mJ). The agent's own: ``nvke_agent_*``.

``/healthz``: 200 ``{"status": "ok", …}`` while the last collection is younger than
``3 x interval`` (and during the first ``3 x interval`` after start); else 503 with why.
While the state dir cannot be written (full disk, read-only; :mod:`nvke_agent.storage`) it is
200 ``{"status": "degraded", "spool_writable": false, "spool_error": …, "dropped_reports": …,
"dropped_samples": …}``: the agent still delivers what is spooled, and a restart (the systemd
watchdog keeps being fed) would not free the disk. ``/metrics`` says the same with
``nvke_agent_spool_writable`` (0) and ``nvke_agent_dropped_reports`` / ``_samples``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from nvke_agent import __version__, systemd
from nvke_agent.client import Ack, Refused, RetryLater
from nvke_agent.storage import StorageHealth

log = logging.getLogger(__name__)


class ObservedSource:
    """A source proxy that remembers the newest sample of each GPU (and MIG device), when the
    last collection ran, the last Xid per GPU and the inventory's index and name per UUID."""

    def __init__(self, source: Any, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._source = source
        self._monotonic = monotonic
        self.started = monotonic()
        self.last_collect: float | None = None
        self.latest: dict[tuple[str, int | None], dict[str, Any]] = {}  # newest per GPU/GI
        self.last_xid: dict[str, int] = {}
        self.models: dict[str, tuple[int, str]] = {}  # uuid -> (index, name)
        self.collect_errors = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def inventory(self) -> Any:
        inventory = self._source.inventory()
        if inventory is not None:
            # best effort: a replayed inventory may lack fields; observing never fails the agent
            self.models = {
                g["uuid"]: (g.get("index", -1), g.get("name") or "")
                for g in inventory.get("gpus") or []
                if isinstance(g, dict) and g.get("uuid")
            }
        return inventory

    def collect(self, now: datetime) -> list[dict[str, Any]]:
        try:
            samples = self._source.collect(now)
        except Exception:
            self.collect_errors += 1
            raise
        for sample in samples:
            if sample.get("gpu_uuid"):
                self.latest[(sample["gpu_uuid"], sample.get("mig_gpu_instance_id"))] = sample
        self.last_collect = self._monotonic()
        return samples

    def events(self) -> list[dict[str, Any]]:
        events = self._source.events()
        for event in events:
            if (
                event.get("type") == "xid"
                and event.get("gpu_uuid")
                and event.get("xid") is not None
            ):
                self.last_xid[event["gpu_uuid"]] = int(event["xid"])
        return events


class ObservedClient:
    """An ApiClient proxy counting report outcomes (acked, refused, retry) and the last ack."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.outcomes = {"acked": 0, "refused": 0, "retry": 0}
        self.last_ack_unix: float | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def send_report(self, credential: str, body: dict[str, Any]) -> Any:
        outcome = self._client.send_report(credential, body)
        if isinstance(outcome, Ack):
            self.outcomes["acked"] += 1
            self.last_ack_unix = time.time()
        elif isinstance(outcome, Refused):
            self.outcomes["refused"] += 1
        elif isinstance(outcome, RetryLater):
            self.outcomes["retry"] += 1
        return outcome


_GPU_GAUGES = (
    # (metric, help, sample field, scale)
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "utilization_gpu_pct", 1),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "utilization_memory_pct", 1),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature_c", 1),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_mw", 1e-3),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz", 1),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "memory_clock_mhz", 1),
    ("nvke_gpu_memory_used_bytes", "Framebuffer memory used (bytes).", "memory_used_bytes", 1),
    ("nvke_gpu_memory_total_bytes", "Framebuffer memory (bytes).", "memory_total_bytes", 1),
)


class AgentCollector:
    """Prometheus collector reading the observed source, client and spool at scrape time."""

    def __init__(
        self,
        source: ObservedSource,
        client: ObservedClient,
        spool: Any,
        store: Any,
        storage: StorageHealth | None = None,
    ):
        self.source, self.client, self.spool, self.store = source, client, spool, store
        self.storage = storage or StorageHealth()

    def _labels(self, sample: dict[str, Any]) -> tuple[list[str], list[str]]:
        index, model = self.source.models.get(sample["gpu_uuid"], (-1, ""))
        names, values = ["gpu", "UUID", "modelName"], [str(index), sample["gpu_uuid"], model]
        if sample.get("mig_gpu_instance_id") is not None:
            names.append("GPU_I_ID")
            values.append(str(sample["mig_gpu_instance_id"]))
        return names, values

    def collect(self) -> Iterator[Any]:
        samples = [self.source.latest[key] for key in sorted(self.source.latest, key=str)]
        for metric, help_text, field, scale in _GPU_GAUGES:
            family, family_labels = None, None
            for sample in samples:
                value = sample.get(field)
                if value is None:
                    continue
                names, values = self._labels(sample)
                if family is None:
                    family = GaugeMetricFamily(metric, help_text, labels=names)
                    family_labels = names
                elif names != family_labels:
                    continue  # one label set per family: GPU rows, or MIG rows, not both
                family.add_metric(values, float(value) * scale)
            if family is not None:
                yield family
        energy = None
        for sample in samples:
            if sample.get("energy_mj") is not None and sample.get("mig_gpu_instance_id") is None:
                names, values = self._labels(sample)
                if energy is None:
                    energy = CounterMetricFamily(
                        "nvke_gpu_energy_joules",
                        "Energy consumed since the driver loaded (joules).",
                        labels=names,
                    )
                energy.add_metric(values, sample["energy_mj"] / 1000)
        if energy is not None:
            yield energy
        if self.source.last_xid:
            xid = GaugeMetricFamily(
                "DCGM_FI_DEV_XID_ERRORS",
                "Value of the last XID error encountered.",
                labels=["UUID"],
            )
            for uuid, code in sorted(self.source.last_xid.items()):
                xid.add_metric([uuid], code)
            yield xid

        info = GaugeMetricFamily(
            "nvke_agent_info", "Agent version and source.", labels=["version", "source"]
        )
        info.add_metric([__version__, getattr(self.source, "name", "")], 1)
        yield info
        reports = CounterMetricFamily(
            "nvke_agent_reports", "Report batches sent, by outcome.", labels=["outcome"]
        )
        for outcome, count in sorted(self.client.outcomes.items()):
            reports.add_metric([outcome], count)
        yield reports
        yield GaugeMetricFamily(
            "nvke_agent_spool_batches",
            "Batches in the spool, not yet acknowledged.",
            value=len(self.spool),
        )
        state = self.store.state
        yield CounterMetricFamily(
            "nvke_agent_dropped_samples",
            "Samples dropped since set-up (spool over its cap, or state dir not writable).",
            value=state.dropped_samples,
        )
        yield CounterMetricFamily(
            "nvke_agent_dropped_reports",
            "Report batches dropped since set-up (spool over its cap, or state dir not writable).",
            value=state.dropped_batches,
        )
        yield GaugeMetricFamily(
            "nvke_agent_spool_writable",
            "1 while the state dir (spool, state file) can be written; 0: no new reports.",
            value=1 if self.storage.writable else 0,
        )
        yield CounterMetricFamily(
            "nvke_agent_collect_errors",
            "Collections that failed.",
            value=self.source.collect_errors,
        )
        if self.client.last_ack_unix is not None:
            yield GaugeMetricFamily(
                "nvke_agent_last_ack_timestamp_seconds",
                "Unix time of the last acknowledged batch.",
                value=self.client.last_ack_unix,
            )
        if self.source.last_collect is not None:
            yield GaugeMetricFamily(
                "nvke_agent_last_collect_age_seconds",
                "Seconds since the last collection.",
                value=self.source._monotonic() - self.source.last_collect,
            )


def health(
    source: ObservedSource,
    interval_s: float,
    storage: StorageHealth | None = None,
    store: Any = None,
) -> tuple[bool, dict[str, Any]]:
    """(healthy, body): healthy while collections keep coming; ``degraded`` (still healthy)
    while the state dir cannot be written (see the module docstring)."""
    now = source._monotonic()
    limit = 3 * interval_s
    last = source.last_collect
    if last is None:
        ok = now - source.started <= limit
        age = None
    else:
        age = round(now - last, 3)
        ok = now - last <= limit
    body = {
        "status": "ok" if ok else "stalled",
        "last_collect_age_s": age,
        "limit_s": limit,
        "collect_errors": source.collect_errors,
    }
    if storage is not None and not storage.writable:
        if ok:
            body["status"] = "degraded"
        body["spool_writable"] = False
        body["spool_error"] = storage.error
        if store is not None:
            body["dropped_reports"] = store.state.dropped_batches
            body["dropped_samples"] = store.state.dropped_samples
    return ok, body


class OpsServer:
    """``/metrics`` and ``/healthz`` on ``host:port`` (a daemon thread)."""

    def __init__(self, address: str, registry: CollectorRegistry, health_fn) -> None:
        host, _, port = address.rpartition(":")
        registry_ = registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/metrics":
                    body, status, ctype = generate_latest(registry_), 200, CONTENT_TYPE_LATEST
                elif self.path == "/healthz":
                    ok, data = health_fn()
                    body, status = json.dumps(data).encode(), 200 if ok else 503
                    ctype = "application/json"
                else:
                    body, status, ctype = b"not found\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host.strip("[]") or "127.0.0.1", int(port)), Handler)
        self.address = f"{self.server.server_address[0]}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> OpsServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Watchdog:
    """``READY=1`` once, then ``WATCHDOG=1`` every half interval while healthy: a stalled
    agent stops feeding systemd, which restarts it (``WatchdogSec=``)."""

    def __init__(self, health_fn, stop: threading.Event) -> None:
        self.health_fn, self.stop = health_fn, stop
        self.interval = systemd.watchdog_interval_s()

    def start(self) -> Watchdog:
        systemd.notify("READY=1")
        if self.interval:
            threading.Thread(target=self._run, name="nvke-watchdog", daemon=True).start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(self.interval / 2):
            ok, body = self.health_fn()
            if ok:
                systemd.notify("WATCHDOG=1")
            else:
                log.error("unhealthy, not feeding the systemd watchdog: %s", body)

    def close(self) -> None:
        systemd.notify("STOPPING=1")


def start_ops(*, address: str | None, source, client, spool, store, interval_s, stop, storage=None):
    """Wrap source and client, start the HTTP server (when ``address``) and the watchdog.
    Returns ``(source, client, close)``."""
    observed, counted = ObservedSource(source), ObservedClient(client)

    def health_fn():
        return health(observed, interval_s, storage, store)

    server = None
    if address:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(AgentCollector(observed, counted, spool, store, storage))
        server = OpsServer(address, registry, health_fn).start()
        log.info("metrics and health on http://%s", server.address)
    watchdog = Watchdog(health_fn, stop).start()

    def close() -> None:
        watchdog.close()
        if server is not None:
            server.close()

    return observed, counted, close
