"""The activity feed of a tenant, a cluster or a node pool, read from the tables that hold
each fact (no copy): operations (``clusters.Operation``, with the reason of their current step
in ``progress.stage`` — e.g. "waiting for the maintenance window Sat 02:00 Europe/Berlin" —
and their error), which include node repairs (``REPAIR_NODES``) and host maintenance that
moved the tenant's nodes (``HOST_MAINTENANCE``), and webhook deliveries
(``webhooks.WebhookDelivery``: event type, status, attempts, the last attempt's answer).

Every query goes through :func:`nvke.scoping.scope_queryset`. Each source contributes at most
:data:`PER_SOURCE` newest rows; the merged entries are newest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.urls import reverse

from clusters.choices import OperationType
from clusters.models import Operation
from nodepools.models import NodePool
from nvke.scoping import scope_queryset
from tenants.principal import Principal
from webhooks.models import WebhookDelivery

#: the newest rows each source contributes to one feed
PER_SOURCE = 200

KIND_OF_OPERATION = {
    OperationType.REPAIR_NODES: "repair",
    OperationType.HOST_MAINTENANCE: "host maintenance",
}


@dataclass(frozen=True)
class Entry:
    """One line of the feed. ``kind``: ``operation``, ``repair``, ``host maintenance`` or
    ``webhook``; ``status``: the row's status word; ``reason``: why it is where it is (the
    operation's current step, an error message, a delivery's last answer)."""

    ts: datetime
    kind: str
    title: str
    status: str
    reason: str
    target: str
    link: str | None
    ident: str


def _target_names(operations: list[Operation]) -> dict[Any, str]:
    pools = NodePool.objects.filter(id__in={op.target_id for op in operations}).values_list(
        "id", "name", "cluster__name"
    )
    names = {pid: f"{cname}/{name}" for pid, name, cname in pools}
    for op in operations:
        names.setdefault(op.cluster_id, op.cluster.name)
    return names


def _operation_link(op: Operation) -> str:
    if op.target_type == "nodepool":
        return reverse("portal:nodepool-detail", args=[op.cluster_id, op.target_id])
    return reverse("portal:cluster-detail", args=[op.cluster_id])


def _operation_entry(op: Operation, names: dict[Any, str]) -> Entry:
    progress = op.progress or {}
    reason = (op.error or {}).get("message") or progress.get("stage") or ""
    if progress.get("total") and op.status in ("PENDING", "RUNNING"):
        reason = f"{progress.get('done', 0)}/{progress['total']} · {reason}".rstrip(" ·")
    return Entry(
        ts=op.finished_at or op.started_at or op.created_at,
        kind=KIND_OF_OPERATION.get(op.type, "operation"),
        title=op.type,
        status=op.status,
        reason=reason,
        target=names.get(op.target_id) or names.get(op.cluster_id, ""),
        link=_operation_link(op),
        ident=str(op.id),
    )


def _delivery_entry(d: WebhookDelivery) -> Entry:
    last = (d.log or [])[-1] if d.log else {}
    answer = last.get("error") or (f"HTTP {last['status_code']}" if last.get("status_code") else "")
    reason = f"attempt {d.attempts}" + (f": {answer}" if answer else "")
    return Entry(
        ts=d.delivered_at or d.created_at,
        kind="webhook",
        title=d.event_type,
        status=d.status,
        reason=reason,
        target=d.endpoint.url,
        link=None,
        ident=str(d.id),
    )


def feed(
    principal: Principal,
    *,
    cluster_id: Any = None,
    pool_id: Any = None,
    kinds: set[str] | None = None,
) -> list[Entry]:
    """The entries the principal may see, newest first, for its tenant (operators: every
    tenant), one cluster (``cluster_id``: its operations and its pools') or one node pool
    (``pool_id``). ``kinds`` keeps only those kinds (None: all)."""
    ops = scope_queryset(Operation.objects.select_related("cluster"), principal)
    deliveries = scope_queryset(WebhookDelivery.objects.select_related("endpoint"), principal)
    if pool_id is not None:
        ops = ops.filter(target_id=pool_id)
        deliveries = deliveries.filter(event__data__target_id=str(pool_id))
    elif cluster_id is not None:
        ops = ops.filter(cluster_id=cluster_id)
        deliveries = deliveries.filter(
            Q(event__data__cluster_id=str(cluster_id)) | Q(event__data__target_id=str(cluster_id))
        )
    operations = list(ops.order_by("-created_at")[:PER_SOURCE])
    names = _target_names(operations)
    entries = [_operation_entry(op, names) for op in operations]
    entries += [_delivery_entry(d) for d in deliveries.order_by("-created_at")[:PER_SOURCE]]
    if kinds:
        entries = [e for e in entries if e.kind in kinds]
    return sorted(entries, key=lambda e: e.ts, reverse=True)


KINDS = ("operation", "repair", "host maintenance", "webhook")


def matching(
    entries: list[Entry], *, kind: str = "", status: str = "", text: str = ""
) -> list[Entry]:
    """The entries of ``kind`` and ``status`` (empty: any) whose title, target or reason
    contains ``text`` (case-insensitive; empty: all)."""
    needle = text.casefold()
    return [
        e
        for e in entries
        if (not kind or e.kind == kind)
        and (not status or e.status == status)
        and (not needle or needle in f"{e.title} {e.target} {e.reason}".casefold())
    ]
