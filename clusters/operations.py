"""The one way an Operation starts (DESIGN §3: every mutating call answers with one).

:func:`start_operation` creates the row, writes the audit event in the same transaction and
enqueues the target's reconciler once the transaction commits — by the task's dotted name, so
that ``clusters`` starts operations for node pools without importing ``nodepools`` (the app
order of DESIGN §2). ``grep Operation.objects.create`` finds this module only.
"""

from __future__ import annotations

import importlib
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from nvke.queueing import send
from tenants import audit

from .choices import OperationStatus, TargetType
from .models import Operation

#: the reconcile task of each target type, by its Celery name (module path + function)
RECONCILE_TASKS = {
    TargetType.CLUSTER: "clusters.tasks.reconcile_cluster",
    TargetType.NODE_POOL: "nodepools.tasks.reconcile_nodepool",
}


@dataclass(frozen=True)
class Audit:
    """The audit event written with an operation: ``action`` (``nodepool.set_size``) and the
    ``before`` / ``after`` spec fields (redacted and diffed by :func:`tenants.audit.record`)."""

    action: str
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None


def enqueue_by_name(task_name: str, object_id: Any) -> None:
    """Send the Celery task ``task_name`` (``"nodepools.tasks.reconcile_nodepool"``) with
    ``object_id`` once the current transaction commits (never before; a broker that cannot be
    reached is logged and left to the resync, :func:`nvke.queueing.send`)."""
    module, _, name = task_name.rpartition(".")

    def _send() -> None:
        send(getattr(importlib.import_module(module), name), object_id)

    transaction.on_commit(_send)


def start_operation(
    *,
    tenant_id: uuid.UUID,
    cluster_id: uuid.UUID,
    type: str,
    target_type: str,
    target_id: uuid.UUID,
    requested_by: str,
    total: int = 1,
    audit_event: Audit | None = None,
    enqueue: bool = True,
    done: bool = False,
    started: bool = False,
    now: datetime | None = None,
) -> Operation:
    """Create an Operation (PENDING, progress ``{"done": 0, "total": total, "stage":
    "pending"}``), write ``audit_event`` (actor ``requested_by``, target the same) and, with
    ``enqueue``, send the target's reconcile task (:data:`RECONCILE_TASKS`) on commit.

    ``done``: a change applied at once (DONE, started and finished at ``now``, progress
    ``total/total``); ``started``: a system operation a reconcile step starts (RUNNING-ready:
    ``started_at`` = ``now``). ``now`` is the creation instant (default: the database's
    ``timezone.now`` at save). Call inside the caller's transaction: the row, its audit event
    and the enqueue commit together or not at all.
    """
    fields: dict[str, Any] = {}
    if now is not None:
        fields["created_at"] = now
    if done:
        fields.update(
            status=OperationStatus.DONE,
            started_at=now,
            finished_at=now,
            progress={"done": total, "total": total, "stage": "done"},
        )
    else:
        fields["progress"] = {"done": 0, "total": total, "stage": "pending"}
        if started:
            fields["started_at"] = now
    op = Operation.objects.create(
        tenant_id=tenant_id,
        cluster_id=cluster_id,
        type=type,
        target_type=target_type,
        target_id=target_id,
        requested_by=requested_by[:100],
        **fields,
    )
    if audit_event is not None:
        audit.record(
            actor=requested_by,
            action=audit_event.action,
            target_type=target_type,
            target_id=target_id,
            tenant_id=tenant_id,
            before=audit_event.before,
            after=audit_event.after,
        )
    if enqueue and not done:
        enqueue_by_name(RECONCILE_TASKS[target_type], target_id)
    return op
