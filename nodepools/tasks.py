"""Node pool Celery tasks (queue ``reconcile``): thin, take ids, safe to run twice."""

from __future__ import annotations

from celery import shared_task

from nvke.queueing import clear_pending, enqueue_once

from . import reconcile


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def reconcile_nodepool(pool_id: str) -> None:
    """One reconcile step; requeues itself with the delay the step asks for."""
    clear_pending(reconcile_nodepool.name, pool_id)
    delay = reconcile.reconcile_nodepool(pool_id)
    if delay is not None:
        enqueue_once(reconcile_nodepool, pool_id, countdown=delay)


@shared_task(acks_late=True, ignore_result=True)
def resync_nodepools() -> int:
    """Beat: re-enqueue every unconverged node pool."""
    ids = reconcile.nodepools_needing_reconcile()
    return sum(enqueue_once(reconcile_nodepool, pool_id) for pool_id in ids)


@shared_task(acks_late=True, ignore_result=True)
def autoscale_nodepools() -> int:
    """Beat (every minute): size autoscaled pools by their measured GPU utilization."""
    from django.utils import timezone

    from .autoscaling import autoscale

    return len(autoscale(timezone.now()))
