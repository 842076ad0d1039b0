"""Cluster Celery tasks (queue ``reconcile``): thin, take ids, safe to run twice."""

from __future__ import annotations

from celery import shared_task

from nvke.queueing import clear_pending, enqueue_once

from . import reconcile


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def reconcile_cluster(cluster_id: str) -> None:
    """One reconcile step; requeues itself with the delay the step asks for."""
    clear_pending(reconcile_cluster.name, cluster_id)
    delay = reconcile.reconcile_cluster(cluster_id)
    if delay is not None:
        enqueue_once(reconcile_cluster, cluster_id, countdown=delay)


@shared_task(acks_late=True, ignore_result=True)
def resync_clusters() -> int:
    """Beat: re-enqueue every unconverged cluster, so a lost message only delays convergence."""
    ids = reconcile.clusters_needing_reconcile()
    return sum(enqueue_once(reconcile_cluster, cluster_id) for cluster_id in ids)


@shared_task(acks_late=True, ignore_result=True)
def refresh_version_conditions() -> int:
    """Beat (daily): flag clusters whose Kubernetes version passed its end of life."""
    from django.utils import timezone

    return reconcile.refresh_version_conditions(timezone.now())
