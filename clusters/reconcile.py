"""The cluster reconciler: one level-triggered, idempotent step per call.

``reconcile_cluster(id)`` locks the cluster row (``FOR UPDATE SKIP LOCKED``: a cluster being
reconciled by another worker is skipped, that worker requeues if needed), compares spec and
status, takes one step, saves status and returns the delay after which it wants to run again
(None when converged). Running it twice in a row changes nothing the second time.

Phases: PROVISIONING -> RUNNING once the provider reports the control plane ready;
deletion: DELETING (node pools are asked to go through the ``cluster_deleting`` signal) ->
control plane deleted -> DELETED, or DELETE_FAILED with the leftovers named after
``NVKE_MAX_DELETE_ATTEMPTS`` polls that found something left (each one counts, with
exponential backoff between them: 1, 2, 4 … 60 s). Retryable provider errors back off
exponentially (1, 2, 4 … 60 s) and end in ERROR (with a condition in words a tenant understands)
once they have lasted ``NVKE_PROVIDER_RETRY_DEADLINE_S`` (the node pool reconciler's deadline:
one rule for both); a non-retryable one ends in ERROR at once.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from nvke import crypto
from nvke.conditions import set_condition

from . import versions
from .choices import GONE_PHASES, OperationType, Phase
from .models import Cluster, cancel_operations, finish_operation, progress_operation
from .providers import ProviderError, get_provider
from .providers.base import DeletionStatus
from .signals import cluster_deleting
from .specs import cluster_spec

log = logging.getLogger(__name__)

DELETE_POLL_S = 1.0


def backoff(failures: int) -> float:
    """Exponential backoff in seconds: 1, 2, 4 … capped at 60."""
    return float(min(2 ** max(failures - 1, 0), 60))


def reconcile_cluster(cluster_id: uuid.UUID | str, now: datetime | None = None) -> float | None:
    """Take one reconcile step for a cluster; returns the requeue delay (s) or None."""
    now = now or timezone.now()
    with transaction.atomic():
        cluster = (
            Cluster.objects.select_for_update(skip_locked=True, no_key=True)
            .filter(pk=cluster_id)
            .first()
        )
        if cluster is None or cluster.phase in (Phase.DELETED, Phase.DELETE_FAILED):
            return None
        if cluster.deletion_requested_at is not None:
            return _step_delete(cluster, now)
        if cluster.phase == Phase.ERROR and cluster.observed_generation == cluster.generation:
            return None  # failed for this spec: wait for a spec change (or deletion)
        return _step_ensure(cluster, now)


def _step_ensure(cluster: Cluster, now: datetime) -> float | None:
    provider = get_provider(cluster.provider)
    try:
        status = provider.ensure_control_plane(cluster_spec(cluster), now)
    except ProviderError as exc:
        return _provider_failed(cluster, exc, now)
    if not status.ready:
        conditions = set_condition(
            cluster.conditions, "ControlPlaneReady", False, "Provisioning", status.message, now
        )
        conditions = set_condition(
            conditions, "Ready", False, "ControlPlaneProvisioning", status.message, now
        )
        if conditions != cluster.conditions:
            cluster.conditions = conditions
            _save(cluster, ["conditions"])
        progress_operation(cluster.id, stage="control-plane", total=1, now=now)
        return status.retry_after_s
    if cluster.phase == Phase.RUNNING and cluster.observed_generation == cluster.generation:
        return None  # converged: nothing to write
    cluster.phase = Phase.RUNNING
    cluster.endpoint = status.endpoint
    cluster.control_plane_version = status.version or cluster.kubernetes_version
    cluster.conditions = version_conditions(cluster, now)
    if not cluster.kubeconfig_encrypted:
        try:
            kubeconfig = provider.kubeconfig(cluster_spec(cluster))
        except ProviderError as exc:
            return _provider_failed(cluster, exc, now)
        cluster.kubeconfig_encrypted = crypto.encrypt(kubeconfig)
    cluster.observed_generation = cluster.generation
    cluster.reconcile_failures = 0
    cluster.reconcile_retry_since = None
    cluster.conditions = set_condition(
        cluster.conditions, "ControlPlaneReady", True, "Ready", "control plane is ready", now
    )
    cluster.conditions = set_condition(
        cluster.conditions, "Ready", True, "Ready", "cluster is running", now
    )
    _save(
        cluster,
        [
            "phase",
            "endpoint",
            "control_plane_version",
            "kubeconfig_encrypted",
            "observed_generation",
            "reconcile_failures",
            "reconcile_retry_since",
            "conditions",
        ],
    )
    finish_operation(
        cluster.id,
        types=(
            OperationType.CREATE_CLUSTER,
            OperationType.UPGRADE_CONTROL_PLANE,
            OperationType.ROTATE_CREDENTIALS,
        ),
        now=now,
    )
    return None


def version_conditions(cluster: Cluster, now: datetime) -> list[dict]:
    """``VersionEndOfLife``: True (with the upgrade on offer) once the control plane's minor
    version is past its upstream end of life (catalog ``kubernetes_versions.yaml``)."""
    version = cluster.control_plane_version or cluster.kubernetes_version
    eol = versions.end_of_life(version)
    if eol is not None and eol < now.date():
        offer = versions.available_upgrades(version, now.date(), provider=cluster.provider)
        message = f"Kubernetes {version} reached end of life on {eol}; " + (
            f"upgrade to {offer[0]}" if offer else "no supported upgrade path is available"
        )
        return set_condition(
            cluster.conditions, "VersionEndOfLife", True, "EndOfLife", message, now
        )
    message = f"Kubernetes {version} is supported" + (f" until {eol}" if eol else "")
    return set_condition(cluster.conditions, "VersionEndOfLife", False, "Supported", message, now)


def refresh_version_conditions(now: datetime) -> int:
    """Beat: re-evaluate ``VersionEndOfLife`` of running clusters; returns how many changed."""
    changed = 0
    for cluster in Cluster.objects.filter(phase=Phase.RUNNING):
        conditions = version_conditions(cluster, now)
        if conditions != cluster.conditions:
            changed += Cluster.objects.filter(pk=cluster.pk, phase=Phase.RUNNING).update(
                conditions=conditions
            )
    return changed


def _step_delete(cluster: Cluster, now: datetime) -> float | None:
    if cluster.phase != Phase.DELETING:
        cluster.phase = Phase.DELETING
        _save(cluster, ["phase"])
    progress_operation(cluster.id, stage="node-pools", total=2, now=now)
    remaining = 0
    failed: list[str] = []
    for _receiver, response in cluster_deleting.send(sender=Cluster, cluster=cluster):
        if isinstance(response, list):
            failed.extend(response)
        elif isinstance(response, int):
            remaining += response
    if failed:
        return _delete_failed(cluster, f"node pools could not be deleted: {', '.join(failed)}", now)
    if remaining:
        conditions = set_condition(
            cluster.conditions,
            "Ready",
            False,
            "Deleting",
            f"waiting for {remaining} node pool(s) to be deleted",
            now,
        )
        if conditions != cluster.conditions:
            cluster.conditions = conditions
            _save(cluster, ["conditions"])
        return DELETE_POLL_S
    progress_operation(cluster.id, stage="control-plane", done=1, total=2, now=now)
    try:
        deletion = get_provider(cluster.provider).delete_control_plane(cluster_spec(cluster))
    except ProviderError as exc:
        deletion = DeletionStatus(gone=False, message=f"the infrastructure provider failed: {exc}")
    if not deletion.gone:
        # every poll that finds something left counts: a deletion ends, DELETED or
        # DELETE_FAILED naming what is left, after NVKE_MAX_DELETE_ATTEMPTS polls
        cluster.delete_attempts += 1
        _save(cluster, ["delete_attempts"])
        waiting = deletion.message or "waiting for the control plane to be deleted"
        if deletion.leftovers:
            waiting += f"; left: {', '.join(deletion.leftovers)}"
        if cluster.delete_attempts >= settings.NVKE_MAX_DELETE_ATTEMPTS:
            return _delete_failed(
                cluster,
                f"control plane not deleted after {cluster.delete_attempts} attempts: {waiting}",
                now,
            )
        conditions = set_condition(cluster.conditions, "Ready", False, "Deleting", waiting, now)
        if conditions != cluster.conditions:
            cluster.conditions = conditions
            _save(cluster, ["conditions"])
        return backoff(cluster.delete_attempts)
    cluster.phase = Phase.DELETED
    cluster.deleted_at = now
    cluster.observed_generation = cluster.generation
    cluster.conditions = set_condition(
        cluster.conditions, "Ready", False, "Deleted", "cluster deleted", now
    )
    cluster.conditions = set_condition(
        cluster.conditions, "ControlPlaneReady", False, "Deleted", "control plane deleted", now
    )
    _save(cluster, ["phase", "deleted_at", "observed_generation", "conditions"])
    finish_operation(cluster.id, types=(OperationType.DELETE_CLUSTER,), now=now)
    return None


def _delete_failed(cluster: Cluster, message: str, now: datetime) -> None:
    cluster.phase = Phase.DELETE_FAILED
    cluster.conditions = set_condition(
        cluster.conditions, "Ready", False, "DeleteFailed", message, now
    )
    _save(cluster, ["phase", "conditions"])
    finish_operation(
        cluster.id,
        types=(OperationType.DELETE_CLUSTER,),
        error={"code": "delete_failed", "message": message, "retryable": True},
        now=now,
    )
    return None


def _provider_failed(cluster: Cluster, exc: ProviderError, now: datetime) -> float | None:
    """A provider call failed: back off (retryable, within the deadline) or go ERROR.

    Returns the requeue delay in s, or None once the cluster is ERROR for this generation."""
    cluster.reconcile_failures += 1
    cluster.reconcile_retry_since = cluster.reconcile_retry_since or now
    waited = (now - cluster.reconcile_retry_since).total_seconds()
    deadline = settings.NVKE_PROVIDER_RETRY_DEADLINE_S
    message = f"the infrastructure provider failed: {exc}"
    if not exc.retryable or waited >= deadline:
        if exc.retryable:
            message = (
                f"gave up after {cluster.reconcile_failures} attempt(s) over {waited:.0f} s "
                f"(deadline {deadline:.0f} s); the infrastructure provider failed: {exc}"
            )
        cluster.phase = Phase.ERROR
        cluster.observed_generation = cluster.generation
        cluster.reconcile_failures, cluster.reconcile_retry_since = 0, None
        cluster.conditions = set_condition(
            cluster.conditions, "Ready", False, "ProviderError", message, now
        )
        _save(
            cluster,
            [
                "phase",
                "observed_generation",
                "reconcile_failures",
                "reconcile_retry_since",
                "conditions",
            ],
        )
        finish_operation(
            cluster.id,
            error={"code": exc.code, "message": message, "retryable": exc.retryable},
            now=now,
        )
        return None
    delay = backoff(cluster.reconcile_failures)
    cluster.conditions = set_condition(
        cluster.conditions,
        "Ready",
        False,
        "ProviderRetrying",
        f"attempt {cluster.reconcile_failures} failed, retrying in {delay:.0f} s: {message}",
        now,
    )
    _save(cluster, ["reconcile_failures", "reconcile_retry_since", "conditions"])
    return delay


def _save(cluster: Cluster, fields: list[str]) -> None:
    cluster.save(update_fields=[*fields, "updated_at"])


def clusters_needing_reconcile() -> list[uuid.UUID]:
    """Ids the periodic resync re-enqueues: unconverged or in a transitional phase."""
    from django.db.models import F, Q

    return list(
        Cluster.objects.filter(
            Q(observed_generation__lt=F("generation"))
            | Q(phase__in=(Phase.PROVISIONING, Phase.RECONCILING, Phase.DELETING))
        )
        .exclude(phase__in=(Phase.DELETED, Phase.DELETE_FAILED))
        .values_list("id", flat=True)
    )


__all__ = [
    "GONE_PHASES",
    "cancel_operations",
    "clusters_needing_reconcile",
    "reconcile_cluster",
]
