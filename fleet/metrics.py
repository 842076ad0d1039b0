"""Fleet metrics for ``/metrics`` (:mod:`nvke.metrics`).

Counters, incremented by ingestion (per process; multiprocess-safe with
``PROMETHEUS_MULTIPROC_DIR``):

* ``nvke_agent_reports_total{outcome="stored"|"duplicate"|"status"}`` (``status``: a status report,
  :func:`fleet.ingest.ingest_status`)
* ``nvke_gpu_samples_total{outcome="stored"|"rejected"}`` — ``rate()`` of it is samples/s.

Gauges, read from PostgreSQL at scrape time (:class:`FleetCollector`):

* ``nvke_fleet_hosts{gpu_model, state}`` — hosts by state;
* ``nvke_fleet_gpus{gpu_model, host_state, health, held}`` — GPUs by the state of their host,
  their health and whether a node holds them; ``nvke_fleet_gpus_scrub_pending{gpu_model}``;
* ``nvke_fleet_ingest_lag_seconds{stat="avg"|"max"}`` — for reports received in the last
  5 minutes, how long after its newest sample each report arrived (s);
* ``nvke_fleet_agent_silence_seconds_max`` — the longest time since a registered host's last
  report (s);
* ``nvke_fleet_samples_per_second`` — samples stored over the last 60 s / 60 (all processes);
* ``nvke_fleet_hosts_warned{kind}`` — hosts with a warning of each kind of
  :data:`fleet.host_warnings.KINDS` (``agent_identity``: two agents on one credential,
  ``agent_spool``: an agent that cannot write its state dir, ``agent_clock`` …).

``nvke_agent_reports_total`` also counts ``outcome="identity_conflict"``: a seq received again
with other content (:mod:`fleet.ingest`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily

from .host_warnings import KINDS

REPORTS = Counter("nvke_agent_reports", "Agent reports received", ["outcome"])
SAMPLES = Counter("nvke_gpu_samples", "GPU telemetry samples received", ["outcome"])

LAG_WINDOW_S = 300
RATE_WINDOW_S = 60


class FleetCollector:
    """Fleet gauges from the database (see module docstring)."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from django.db import connection

        hosts = GaugeMetricFamily(
            "nvke_fleet_hosts", "Hosts by state", labels=["gpu_model", "state"]
        )
        gpus = GaugeMetricFamily(
            "nvke_fleet_gpus",
            "GPUs by host state, health and whether a node holds them",
            labels=["gpu_model", "host_state", "health", "held"],
        )
        scrub = GaugeMetricFamily(
            "nvke_fleet_gpus_scrub_pending",
            "GPUs released by a tenant and not scrubbed yet",
            labels=["gpu_model"],
        )
        lag = GaugeMetricFamily(
            "nvke_fleet_ingest_lag_seconds",
            f"Seconds between a report's newest sample and its arrival (last {LAG_WINDOW_S} s)",
            labels=["stat"],
        )
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT gpu_model_id, state, COUNT(*) FROM fleet_host GROUP BY 1, 2 ORDER BY 1, 2"
            )
            for model, state, count in cursor.fetchall():
                hosts.add_metric([model, state], count)
            cursor.execute(
                """
                SELECT g.gpu_model_id, h.state, g.health, g.holder_id IS NOT NULL, COUNT(*)
                  FROM fleet_gpu g JOIN fleet_host h ON h.id = g.host_id
                 GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
                """
            )
            for model, state, health, held, count in cursor.fetchall():
                gpus.add_metric([model, state, health, "true" if held else "false"], count)
            cursor.execute(
                "SELECT gpu_model_id, COUNT(*) FROM fleet_gpu WHERE scrub_state = 'PENDING' "
                "GROUP BY 1 ORDER BY 1"
            )
            for model, count in cursor.fetchall():
                scrub.add_metric([model], count)
            cursor.execute(
                """
                SELECT AVG(EXTRACT(EPOCH FROM received_at - max_ts)),
                       MAX(EXTRACT(EPOCH FROM received_at - max_ts))
                  FROM fleet_agentreport
                 WHERE received_at >= now() - make_interval(secs => %s) AND max_ts IS NOT NULL
                """,
                [LAG_WINDOW_S],
            )
            avg_lag, max_lag = cursor.fetchone()
            cursor.execute(
                "SELECT COALESCE(SUM(samples_stored), 0) FROM fleet_agentreport "
                "WHERE received_at >= now() - make_interval(secs => %s)",
                [RATE_WINDOW_S],
            )
            (recent,) = cursor.fetchone()
            cursor.execute(
                "SELECT MAX(EXTRACT(EPOCH FROM now() - last_seen_at)) FROM fleet_host "
                "WHERE credential_hash <> '' AND state <> 'RETIRED'"
            )
            (silence,) = cursor.fetchone()
            cursor.execute(
                "SELECT p, COUNT(h.id) FROM unnest(%s::text[]) AS p LEFT JOIN fleet_host h ON"
                " EXISTS (SELECT 1 FROM jsonb_array_elements_text(h.warnings) AS w"
                " WHERE starts_with(w, p)) GROUP BY p ORDER BY p",
                [list(KINDS)],
            )
            warned = GaugeMetricFamily(
                "nvke_fleet_hosts_warned", "Hosts with a warning of this kind", labels=["kind"]
            )
            for prefix, count in cursor.fetchall():
                warned.add_metric([KINDS[prefix]], count)
        lag.add_metric(["avg"], float(avg_lag or 0.0))
        lag.add_metric(["max"], float(max_lag or 0.0))
        yield hosts
        yield gpus
        yield scrub
        yield lag
        yield GaugeMetricFamily(
            "nvke_fleet_agent_silence_seconds_max",
            "Longest time since a registered host's last report",
            value=float(silence or 0.0),
        )
        yield warned
        yield GaugeMetricFamily(
            "nvke_fleet_samples_per_second",
            f"Samples stored over the last {RATE_WINDOW_S} s, per second",
            value=float(recent) / RATE_WINDOW_S,
        )


COLLECTOR = FleetCollector()
