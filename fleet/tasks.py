"""Fleet periodic tasks (queue ``telemetry``): thin wrappers over plain functions.

Their periods are in the one beat schedule, ``nvke/beat_schedule.py``.
"""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from . import conf, health, hygiene, partitions, rollups


@shared_task(acks_late=True, ignore_result=True)
def mark_silent_hosts_not_ready() -> dict[str, int]:
    """Beat: hosts without a report for NVKE_HOST_HEARTBEAT_TIMEOUT_S become NOT_READY;
    scrubs the agent did not confirm within NVKE_SCRUB_TIMEOUT_S fail."""
    now = timezone.now()
    return {
        "not_ready": health.mark_silent_hosts_not_ready(now),
        "scrubs_failed": hygiene.fail_overdue_scrubs(now),
    }


@shared_task(acks_late=True, ignore_result=True)
def ensure_sample_partitions() -> dict[str, list[str] | dict[str, int]]:
    """Beat: create sample partitions ahead, drop those past NVKE_SAMPLE_RETENTION_DAYS,
    delete rollups past their retention."""
    now = timezone.now()
    created = partitions.ensure_partitions_around(now)
    cutoff = (now - timedelta(days=conf.sample_retention_days())).date()
    dropped = partitions.drop_partitions_before(cutoff)
    return {"created": created, "dropped": dropped, "rollups": rollups.prune_rollups(now)}


@shared_task(acks_late=True, ignore_result=True)
def rollup_gpu_samples() -> dict[str, int]:
    """Beat: recompute the 1-minute / 1-hour rollups touched by newly received reports."""
    return rollups.rollup_pending()
