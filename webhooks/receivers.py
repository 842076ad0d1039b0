"""Lower apps' signals -> webhook events (every event type has its sender here)."""

from __future__ import annotations

from django.db import transaction
from django.dispatch import receiver

from billing.signals import invoice_finalized
from clusters.signals import operation_finished
from fleet.signals import commitments_broken, host_drain_requested
from nodepools.signals import disruption_requested, node_repaired
from reservations.signals import reservation_ended, reservation_ending
from tenants.signals import quota_threshold_reached

from . import services
from .choices import EventType


@receiver(operation_finished)
def on_operation_finished(sender, operation_id, **kwargs) -> None:
    from clusters.api.serializers import OperationSerializer
    from clusters.choices import OperationStatus
    from clusters.models import Operation

    op = Operation.objects.filter(pk=operation_id).first()
    if op is None or op.tenant_id is None:
        return
    kind = EventType.OPERATION_FINISHED
    if op.status == OperationStatus.FAILED:
        kind = EventType.OPERATION_FAILED
    with transaction.atomic():
        services.emit(
            tenant_id=op.tenant_id,
            event_type=kind,
            source="/api/v1/operations",
            subject=str(op.id),
            data=lambda: dict(OperationSerializer(op).data),
        )


@receiver(commitments_broken)
def on_commitments_broken(sender, host_id, hostname, why, commitments, **kwargs) -> None:
    """``commitment.broken`` to each tenant whose reservation a forced (``why`` ``force``) or
    emergency drain of a host breaks: its own pools and reservations only."""
    by_tenant: dict = {}
    for item in commitments:
        by_tenant.setdefault(item.tenant_id, []).append(item.as_dict())
    with transaction.atomic():
        for tenant_id, items in by_tenant.items():
            services.emit(
                tenant_id=tenant_id,
                event_type=EventType.COMMITMENT_BROKEN,
                source="/api/v1/fleet",
                subject=str(host_id),
                data={
                    "why": why,
                    "host": hostname,
                    "commitments": [
                        {k: v for k, v in i.items() if k != "tenant_id"} for i in items
                    ],
                },
            )


@receiver(invoice_finalized)
def on_invoice_finalized(sender, invoice, **kwargs) -> None:
    services.emit(
        tenant_id=invoice.tenant_id,
        event_type=EventType.INVOICE_FINALIZED,
        source="/api/v1/invoices",
        subject=str(invoice.id),
        data={
            "id": str(invoice.id),
            "number": invoice.number,
            "period_label": invoice.period_label,
            "currency": invoice.currency,
            "finalized_at": invoice.finalized_at.isoformat() if invoice.finalized_at else None,
        },
    )


@receiver(host_drain_requested)
def on_host_drain_requested(sender, host_id, holder_ids, target_state, **kwargs):
    """``host.maintenance`` to each tenant with a node on a host an operator is draining for
    MAINTENANCE (the tenant sees its own nodes only, never the host's other tenants)."""
    if target_state != "MAINTENANCE" or not holder_ids:
        return
    reason = kwargs.get("reason", "host maintenance")
    from nodepools.models import Node

    by_tenant: dict = {}
    for node in Node.objects.filter(pk__in=holder_ids):
        by_tenant.setdefault(node.tenant_id, []).append(
            {"node": node.name, "nodepool_id": str(node.nodepool_id)}
        )
    with transaction.atomic():
        for tenant_id, affected in by_tenant.items():
            services.emit(
                tenant_id=tenant_id,
                event_type=EventType.HOST_MAINTENANCE,
                source="/api/v1/fleet",
                subject=str(host_id),
                data={"reason": reason, "nodes": affected},
            )


@receiver(node_repaired)
def on_node_repaired(sender, node, action, reason, **kwargs) -> None:
    kind = EventType.NODE_REPLACED if action == "replace" else EventType.NODE_REPAIRED
    services.emit(
        tenant_id=node.tenant_id,
        event_type=kind,
        source="/api/v1/clusters",
        subject=node.name,
        data={
            "node": node.name,
            "nodepool_id": str(node.nodepool_id),
            "cluster_id": str(node.cluster_id),
            "action": action,
            "reason": reason,
        },
    )


@receiver(disruption_requested)
def on_disruption_requested(sender, request, **kwargs) -> None:
    """``nodepool.disruption.requested``: a planned disruption of the tenant's nodes waits
    for its checkpoint ack (through the API or the pod annotation, never this delivery's
    answer) until ``deadline``."""
    from nodepools.checkpoints import ANNOTATION
    from nodepools.models import NodePool

    pool = NodePool.objects.only("id", "name", "cluster_id").get(pk=request.nodepool_id)
    base = f"/api/v1/clusters/{pool.cluster_id}/nodepools/{pool.id}"
    services.emit(
        tenant_id=request.tenant_id,
        event_type=EventType.NODEPOOL_DISRUPTION_REQUESTED,
        source=base,
        subject=str(request.id),
        data={
            "id": str(request.id),
            "cluster_id": str(pool.cluster_id),
            "nodepool_id": str(pool.id),
            "nodepool": pool.name,
            "nodes": list(request.nodes),
            "reason": request.reason,
            "requested_at": request.requested_at.isoformat(),
            "deadline": request.deadline.isoformat(),
            "ack": {
                "url": f"{base}/disruption-requests/{request.id}/ack",
                "annotation": {ANNOTATION: str(request.id)},
            },
        },
    )


@receiver(quota_threshold_reached)
def on_quota_threshold(sender, tenant_id, resource, limit, reserved, threshold, **kwargs):
    with transaction.atomic():
        services.emit(
            tenant_id=tenant_id,
            event_type=EventType.QUOTA_100 if threshold >= 100 else EventType.QUOTA_80,
            source="/api/v1/quotas",
            subject=resource,
            data={"resource": resource, "limit": limit, "reserved": reserved, "percent": threshold},
        )


def _reservation_data(reservation) -> dict:
    pools = [str(p) for p in reservation.nodepools.values_list("id", flat=True)]
    return {
        "id": str(reservation.id),
        "gpu_model": reservation.gpu_model_id,
        "region": reservation.region,
        "zone": reservation.zone,
        "gpus": reservation.gpus,
        "start": reservation.start.isoformat(),
        "end": reservation.end.isoformat() if reservation.end else None,
        "end_action": reservation.end_action,
        "cancelled_at": reservation.cancelled_at.isoformat() if reservation.cancelled_at else None,
        "nodepool_ids": pools,
    }


@receiver(reservation_ending)
def on_reservation_ending(sender, reservation, **kwargs) -> None:
    """``reservation.ending``: sent ``notice_lead_s`` before the end (once)."""
    services.emit(
        tenant_id=reservation.tenant_id,
        event_type=EventType.RESERVATION_ENDING,
        source="/api/v1/reservations",
        subject=str(reservation.id),
        data=_reservation_data(reservation),
    )


@receiver(reservation_ended)
def on_reservation_ended(sender, reservation, first=False, **kwargs) -> None:
    """``reservation.ended``: once, when the end is processed."""
    if not first:
        return
    services.emit(
        tenant_id=reservation.tenant_id,
        event_type=EventType.RESERVATION_ENDED,
        source="/api/v1/reservations",
        subject=str(reservation.id),
        data=_reservation_data(reservation),
    )
