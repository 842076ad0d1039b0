"""Opening and closing allocation ledger rows (the only writers of :class:`LedgerEntry`)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, connection, transaction
from django.db.models import DateTimeField, F, Func, Min
from psycopg.types.range import Range

from nvke.errors import Conflict

from .fractions import WHOLE_GPU, mig_billable_fraction, pool_shares_gpus_across_tenants
from .models import LedgerEntry


def open_allocation(
    *,
    node,
    gpu_uuid: str,
    start: datetime,
    mig_gpu_instance_id: int | None = None,
    mig_profile: str = "",
    billable_fraction: Decimal | None = None,
) -> LedgerEntry:
    """Open the ledger row of one GPU (or MIG GPU instance) held by ``node`` from ``start``.

    ``node`` is a :class:`nodepools.models.Node` (its tenant, cluster, pool, host and the pool's
    GPU model are copied). The fraction, unless given: a MIG instance (``mig_gpu_instance_id``
    set) of a pool that shares GPUs across tenants bills its profile's share
    (:func:`~billing.fractions.mig_billable_fraction`); anything else bills 1.0.

    Idempotent: an open row of the same node, GPU and instance is returned unchanged. Raises
    :class:`~nvke.errors.Conflict` ``ledger_overlap`` when the GPU (or part of it) is already
    held by another row at ``start`` (the exclusion constraint).
    """
    existing = LedgerEntry.objects.filter(
        node=node,
        gpu_uuid=gpu_uuid,
        mig_gpu_instance_id=mig_gpu_instance_id,
        period__upper_inf=True,
    ).first()
    if existing is not None:
        return existing
    pool = node.nodepool
    if billable_fraction is None:
        shared = mig_gpu_instance_id is not None and pool_shares_gpus_across_tenants(pool.isolation)
        billable_fraction = (
            mig_billable_fraction(pool.gpu_model_id, mig_profile, start) if shared else WHOLE_GPU
        )
    entry = LedgerEntry(
        tenant_id=node.tenant_id,
        cluster_id=node.cluster_id,
        nodepool_id=node.nodepool_id,
        node=node,
        host_id=node.host_id,
        gpu_uuid=gpu_uuid,
        gpu_model=pool.gpu_model_id,
        mig_profile=mig_profile,
        mig_gpu_instance_id=mig_gpu_instance_id,
        billable_fraction=billable_fraction,
        period=Range(start, None, "[)"),
    )
    try:
        with transaction.atomic():
            entry.save()
    except IntegrityError as exc:
        if "ledger_no_overlap_per_gpu_slot" not in str(exc):
            raise
        raise Conflict(
            f"{gpu_uuid} (instance {mig_gpu_instance_id}) is already allocated at {start}",
            code="ledger_overlap",
        ) from exc
    return entry


def close_allocations(node, end: datetime) -> int:
    """Close the node's open rows at ``end`` (never before their start); returns rows closed.

    A guarded UPDATE of open rows only, so calling it twice changes nothing the second time.
    A row that would become empty (released at its own start) is deleted: it held nothing.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM billing_ledgerentry"
            " WHERE node_id = %s AND upper_inf(period) AND lower(period) >= %s",
            [node.id, end],
        )
        deleted = cursor.rowcount
        cursor.execute(
            """
            UPDATE billing_ledgerentry
               SET period = tstzrange(lower(period), %s, '[)')
             WHERE node_id = %s AND upper_inf(period)
            """,
            [end, node.id],
        )
        return cursor.rowcount + deleted


def first_use(
    tenant_id,
    gpu_model: str,
    mig_profile: str,
    start: datetime,
    end: datetime,
    *,
    cluster_id=None,
    nodepool_id=None,
) -> datetime | None:
    """The earliest instant in ``[start, end)`` at which a ledger row of the tenant's
    (``gpu_model``, ``mig_profile``) (of that cluster / node pool when given) holds a GPU;
    None when none does. What a missing price names as its ``at`` (the console, the usage API,
    the invoice's 409): the first usage it stops, not the hour bucket or the price gap's start.
    Example: a row from 23:41, a window from 00:00 that day -> 23:41."""
    rows = LedgerEntry.objects.filter(
        tenant_id=tenant_id,
        gpu_model=gpu_model,
        mig_profile=mig_profile,
        period__overlap=(start, end),
    )
    if cluster_id is not None:
        rows = rows.filter(cluster_id=cluster_id)
    if nodepool_id is not None:
        rows = rows.filter(nodepool_id=nodepool_id)
    lowest = rows.aggregate(
        m=Min(Func(F("period"), function="lower", output_field=DateTimeField()))
    )["m"]
    return None if lowest is None else max(lowest, start)
