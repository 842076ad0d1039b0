"""Every periodic task NVKE runs, in one place (``settings.CELERY_BEAT_SCHEDULE`` is built from
:data:`PERIODIC_TASKS`; no app adds entries of its own).

Each entry names the task by its dotted path (so this module imports no app), its period
(a number of seconds, or the registry setting that holds it) and what it does; the periodic
tasks reference page (``docs/reference/periodic-tasks.md``) is generated from the same list.
Every entry ``expires`` before its next run (its own ``expires_s``, else 0.9 of the period),
so a backlog does not pile up copies: a late run is dropped, the next one comes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PeriodicTask:
    """One beat entry: ``name`` (beat's key), ``task`` (dotted path), ``every_s`` (seconds) or
    ``every_setting`` (the registry setting holding the seconds), and ``what`` it does."""

    name: str
    task: str
    what: str
    every_s: float | None = None
    every_setting: str | None = None
    expires_s: float | None = None

    def period_s(self, values: Mapping[str, Any]) -> float:
        """The period in seconds, given the registry's values (``{name: value}``)."""
        if self.every_setting is not None:
            return float(values[self.every_setting])
        assert self.every_s is not None
        return float(self.every_s)

    def expires(self, values: Mapping[str, Any]) -> float:
        """Seconds after which a queued run is dropped (under the period)."""
        return self.expires_s if self.expires_s is not None else self.period_s(values) * 0.9


PERIODIC_TASKS: tuple[PeriodicTask, ...] = (
    PeriodicTask(
        "resync-clusters",
        "clusters.tasks.resync_clusters",
        "Re-enqueue the reconciler of every cluster that has not converged (a lost message "
        "only delays it).",
        every_setting="NVKE_RESYNC_INTERVAL_S",
    ),
    PeriodicTask(
        "resync-nodepools",
        "nodepools.tasks.resync_nodepools",
        "Re-enqueue the reconciler of every node pool that has not converged.",
        every_setting="NVKE_RESYNC_INTERVAL_S",
    ),
    PeriodicTask(
        "kubernetes-version-end-of-life",
        "clusters.tasks.refresh_version_conditions",
        "Refresh the clusters' conditions about Kubernetes versions nearing or past their end "
        "of life.",
        every_s=86400.0,
        expires_s=3600.0,
    ),
    PeriodicTask(
        "autoscale-nodepools",
        "nodepools.tasks.autoscale_nodepools",
        "Size every autoscaled RUNNING node pool by its measured GPU utilization.",
        every_s=60.0,
        expires_s=50.0,
    ),
    PeriodicTask(
        "mark-silent-hosts-not-ready",
        "fleet.tasks.mark_silent_hosts_not_ready",
        "Hosts without an agent report for NVKE_HOST_HEARTBEAT_TIMEOUT_S become NOT_READY; "
        "scrubs past NVKE_SCRUB_TIMEOUT_S fail.",
        every_s=60.0,
        expires_s=50.0,
    ),
    PeriodicTask(
        "ensure-sample-partitions",
        "fleet.tasks.ensure_sample_partitions",
        "Create the GPU sample table's daily partitions ahead, drop those past "
        "NVKE_SAMPLE_RETENTION_DAYS and old rollups.",
        every_s=3600.0,
        expires_s=3000.0,
    ),
    PeriodicTask(
        "rollup-gpu-samples",
        "fleet.tasks.rollup_gpu_samples",
        "Recompute the 1-minute and 1-hour rollups touched by newly received reports.",
        every_s=60.0,
        expires_s=50.0,
    ),
    PeriodicTask(
        "sweep-reservations",
        "reservations.tasks.sweep_reservations",
        "Announce, start, end and settle capacity reservations.",
        every_s=60.0,
        expires_s=50.0,
    ),
    PeriodicTask(
        "billing-refresh-usage",
        "billing.tasks.refresh_usage",
        "Enqueue a usage aggregation for every tenant with allocations in the last 35 days.",
        every_setting="NVKE_BILLING_AGGREGATE_INTERVAL_S",
    ),
    PeriodicTask(
        "billing-build-invoices",
        "billing.tasks.build_monthly_invoices",
        "Build (rebuild) every tenant's DRAFT invoices of its previous and current month; "
        "finalizing stays an operator's decision.",
        every_setting="NVKE_BILLING_INVOICE_INTERVAL_S",
    ),
)


def celery_beat_schedule(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Celery's ``beat_schedule`` from :data:`PERIODIC_TASKS`, periods taken from ``values``
    (the registry's ``{name: value}``, as ``nvke/settings.py`` reads them)."""
    return {
        p.name: {
            "task": p.task,
            "schedule": p.period_s(values),
            "options": {"expires": p.expires(values)},
        }
        for p in PERIODIC_TASKS
    }
