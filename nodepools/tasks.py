"""Node pool Celery tasks (queue ``reconcile``): thin, take ids, safe to run twice."""

from __future__ import annotations

from celery import shared_task

from clusters.providers.base import ProviderError
from nvke.queueing import clear_pending, enqueue_once

from . import reconcile


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def reconcile_nodepool(pool_id: str) -> None:
    """One reconcile step; requeues itself with the delay the step asks for."""
    clear_pending(reconcile_nodepool.name, pool_id)
    delay = reconcile.reconcile_nodepool(pool_id)
    if delay is not None:
        enqueue_once(reconcile_nodepool, pool_id, countdown=delay)


@shared_task(
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    autoretry_for=(ProviderError,),
    retry_backoff=True,
    max_retries=5,
)
def sync_tenant_nodes(cluster_id: str) -> None:
    """Write the cluster's Nodes from its hosts' latest reports (the one writer:
    :func:`nodepools.tenant_nodes.sync_cluster_nodes`); a no-op for providers without."""
    from clusters.models import Cluster

    from .tenant_nodes import sync_cluster_nodes

    clear_pending(sync_tenant_nodes.name, cluster_id)
    if Cluster.objects.filter(pk=cluster_id, deletion_requested_at__isnull=True).exists():
        sync_cluster_nodes(cluster_id)


@shared_task(acks_late=True, ignore_result=True)
def resync_nodepools() -> int:
    """Beat: re-enqueue every unconverged node pool (and the active defragmentation run, so a
    lost message only delays it)."""
    from .defrag_models import DefragRun

    ids = reconcile.nodepools_needing_reconcile()
    runs = DefragRun.objects.filter(active=True).values_list("pk", flat=True)
    return sum(enqueue_once(reconcile_nodepool, pool_id) for pool_id in ids) + sum(
        enqueue_once(run_defrag, str(run_id)) for run_id in runs
    )


@shared_task(acks_late=True, ignore_result=True)
def autoscale_nodepools() -> int:
    """Beat (every minute): size autoscaled pools by their measured GPU utilization."""
    from django.utils import timezone

    from .autoscaling import autoscale

    return len(autoscale(timezone.now()))


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_defrag(run_id: str) -> None:
    """One step of a defragmentation run (nodepools/defrag.py); requeues itself."""
    from .defrag import advance_run

    clear_pending(run_defrag.name, run_id)
    delay = advance_run(run_id)
    if delay is not None:
        enqueue_once(run_defrag, run_id, countdown=delay)
