"""Clusters (declarative spec + status) and Operations (the 202 contract)."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils import timezone

from .choices import (
    ACTIVE_OPERATION_STATUSES,
    OperationStatus,
    OperationType,
    Phase,
    TargetType,
)


class Cluster(models.Model):
    """A tenant's Kubernetes cluster.

    Spec: ``name``, ``kubernetes_version``, ``region``, ``provider``; ``generation`` increases
    on every spec change (deletion included). Status: ``phase``, ``conditions``,
    ``observed_generation`` (the generation the reconciler last converged to). A deleted
    cluster keeps its row (phase ``DELETED``) for history and invoices.
    """

    tenant_path = "tenant"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="clusters")
    name = models.CharField(max_length=63)
    kubernetes_version = models.CharField(max_length=16)
    region = models.CharField(max_length=64)
    provider = models.CharField(max_length=32, default="simulated")
    generation = models.PositiveIntegerField(default=1)
    observed_generation = models.PositiveIntegerField(default=0)
    phase = models.CharField(max_length=16, choices=Phase.choices, default=Phase.PROVISIONING)
    conditions = models.JSONField(default=list, blank=True)
    endpoint = models.CharField(max_length=255, blank=True)
    #: version the control plane actually runs (status; the spec is ``kubernetes_version``)
    control_plane_version = models.CharField(max_length=16, blank=True)
    #: disruptive, non-urgent changes wait for these windows (see clusters/maintenance.py)
    maintenance_policy = models.JSONField(default=dict, blank=True)
    #: admin kubeconfig, Fernet-encrypted (nvke.crypto); never logged, never in audit diffs
    kubeconfig_encrypted = models.TextField(blank=True)
    deletion_requested_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    delete_attempts = models.PositiveSmallIntegerField(default=0)
    reconcile_failures = models.PositiveSmallIntegerField(default=0)
    #: when the current run of retryable provider failures began (None: the last call worked);
    #: the reconciler gives up after ``NVKE_PROVIDER_RETRY_DEADLINE_S``, as node pools do
    reconcile_retry_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "name"],
                condition=~Q(phase=Phase.DELETED),
                name="cluster_tenant_name_live_uniq",
            )
        ]
        indexes = [models.Index(fields=["tenant", "-created_at"])]

    def __str__(self) -> str:
        return self.name


class HostedControlPlane(models.Model):
    """The desired and observed state of one hosted control plane (provider ``hosted``).

    One row per cluster. Desired state (written by the provider, in a Celery worker):
    ``version`` (the Kubernetes version to run, ``"1.36"`` or ``"1.36.3"``), ``desired``
    (``running`` | ``deleted``), ``port`` (kube-apiserver's port on 127.0.0.1, allocated once
    and kept across restarts) and the PKI (``pki_encrypted``: Fernet-encrypted JSON of
    :class:`clusters.hosted.pki.ControlPlanePki`). Observed state (written only by the
    control-plane manager, the one owner of the processes): ``state``, ``ready`` (from
    kube-apiserver's ``/readyz``), ``running_version`` (``/version``'s gitVersion without the
    ``v``), ``message`` (why not ready, in words), ``pids``, ``restarts``, ``rss_bytes`` (the
    three processes' resident memory) and ``observed_at``.
    """

    class Desired(models.TextChoices):
        RUNNING = "running"
        DELETED = "deleted"

    class State(models.TextChoices):
        PENDING = "pending"  # no manager has looked at it yet
        WAITING_FOR_BINARIES = "waiting-for-binaries"
        STARTING = "starting"
        RUNNING = "running"
        RESTARTING = "restarting"  # a process exited; it is started again after a backoff
        DELETED = "deleted"  # processes stopped, datastore prefix and files removed

    cluster = models.OneToOneField(
        Cluster, on_delete=models.CASCADE, primary_key=True, related_name="hosted_control_plane"
    )
    version = models.CharField(max_length=16)
    desired = models.CharField(max_length=16, choices=Desired.choices, default=Desired.RUNNING)
    port = models.PositiveIntegerField(unique=True)
    pki_encrypted = models.TextField()
    #: the cluster CA's certificate (public, PEM): what a kubeconfig trusts
    ca_cert = models.TextField()
    state = models.CharField(max_length=24, choices=State.choices, default=State.PENDING)
    ready = models.BooleanField(default=False)
    running_version = models.CharField(max_length=32, blank=True)
    message = models.TextField(blank=True)
    pids = models.JSONField(default=dict, blank=True)
    restarts = models.PositiveIntegerField(default=0)
    rss_bytes = models.BigIntegerField(default=0)
    observed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"control plane of {self.cluster_id} ({self.state})"


class Operation(models.Model):
    """A long-running change, like a GKE operation: every mutating call answers 202 with one.

    ``target_type``/``target_id`` name the cluster or node pool it acts on; ``progress`` is
    ``{"done": int, "total": int, "stage": str}``; ``error`` is ``{"code", "message",
    "retryable"}`` when ``status`` is FAILED.
    """

    tenant_path = "tenant"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="operations"
    )
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="operations")
    type = models.CharField(max_length=32, choices=OperationType.choices)
    target_type = models.CharField(max_length=16, choices=TargetType.choices)
    target_id = models.UUIDField()
    status = models.CharField(
        max_length=16, choices=OperationStatus.choices, default=OperationStatus.PENDING
    )
    progress = models.JSONField(default=dict, blank=True)
    error = models.JSONField(null=True, blank=True)
    requested_by = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["target_id", "status"]),
            models.Index(fields=["tenant", "-created_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.target_type}/{self.target_id} {self.status}"


def active_operation(target_id: uuid.UUID) -> Operation | None:
    """The oldest PENDING/RUNNING operation of a target (the one a reconciler works on)."""
    return (
        Operation.objects.filter(target_id=target_id, status__in=ACTIVE_OPERATION_STATUSES)
        .order_by("created_at")
        .first()
    )


def progress_operation(
    target_id: uuid.UUID, *, stage: str, done: int = 0, total: int = 1, now: datetime | None = None
) -> None:
    """Mark the target's active operation RUNNING with ``progress`` (guarded UPDATE)."""
    now = now or timezone.now()
    op = active_operation(target_id)
    progress = {"done": done, "total": total, "stage": stage}
    if op is None or (op.status == OperationStatus.RUNNING and op.progress == progress):
        return
    Operation.objects.filter(pk=op.pk, status__in=ACTIVE_OPERATION_STATUSES).update(
        status=OperationStatus.RUNNING,
        started_at=op.started_at or now,
        progress=progress,
    )


def finish_operation(
    target_id: uuid.UUID,
    *,
    error: dict[str, Any] | None = None,
    stage: str = "done",
    types: tuple[str, ...] | None = None,
    now: datetime | None = None,
) -> None:
    """Finish the target's active operations: DONE, or FAILED with ``error`` (guarded UPDATE).

    ``types`` limits which operation types are finished (None: all active ones).
    """
    now = now or timezone.now()
    qs = Operation.objects.filter(target_id=target_id, status__in=ACTIVE_OPERATION_STATUSES)
    if types is not None:
        qs = qs.filter(type__in=types)
    for op in qs:
        total = (op.progress or {}).get("total", 1)
        finished = Operation.objects.filter(pk=op.pk, status__in=ACTIVE_OPERATION_STATUSES).update(
            status=OperationStatus.FAILED if error else OperationStatus.DONE,
            error=error,
            started_at=op.started_at or now,
            finished_at=now,
            progress={
                "done": (op.progress or {}).get("done", 0) if error else total,
                "total": total,
                "stage": "failed" if error else stage,
            },
        )
        if finished:
            _announce_finished(op.pk)


def _announce_finished(operation_id: uuid.UUID) -> None:
    from django.db import transaction

    from .signals import operation_finished

    def announce() -> None:
        # send_robust: a receiver's failure (webhooks) is logged and never fails the reconciler
        for receiver, result in operation_finished.send_robust(
            sender=Operation, operation_id=operation_id
        ):
            if isinstance(result, Exception):
                logging.getLogger(__name__).error(
                    "operation_finished receiver %s failed for operation %s: %r",
                    getattr(receiver, "__qualname__", repr(receiver)),
                    operation_id,
                    result,
                )

    transaction.on_commit(announce)


def cancel_operations(target_id: uuid.UUID, reason: str, now: datetime | None = None) -> int:
    """CANCEL the target's active operations (e.g. a create superseded by a delete)."""
    now = now or timezone.now()
    return Operation.objects.filter(
        target_id=target_id, status__in=ACTIVE_OPERATION_STATUSES
    ).update(
        status=OperationStatus.CANCELLED,
        finished_at=now,
        error={"code": "superseded", "message": reason, "retryable": False},
    )


__all__ = [
    "Cluster",
    "HostedControlPlane",
    "Operation",
    "OperationStatus",
    "OperationType",
    "Phase",
    "TargetType",
    "active_operation",
    "cancel_operations",
    "finish_operation",
    "progress_operation",
]
