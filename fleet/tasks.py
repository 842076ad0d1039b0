"""Fleet periodic tasks (queue ``telemetry``): thin wrappers over plain functions."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from . import health, partitions


@shared_task(acks_late=True, ignore_result=True)
def mark_silent_hosts_not_ready() -> int:
    """Beat: hosts without a report for NVKE_HOST_HEARTBEAT_TIMEOUT_S become NOT_READY."""
    return health.mark_silent_hosts_not_ready(timezone.now())


@shared_task(acks_late=True, ignore_result=True)
def ensure_sample_partitions() -> dict[str, list[str]]:
    """Beat: create sample partitions ahead, drop those past NVKE_SAMPLE_RETENTION_DAYS."""
    now = timezone.now()
    created = partitions.ensure_partitions_around(now)
    cutoff = (now - timedelta(days=settings.NVKE_SAMPLE_RETENTION_DAYS)).date()
    dropped = partitions.drop_partitions_before(cutoff)
    return {"created": created, "dropped": dropped}
