"""Open and close ledger rows when nodes become ready / are released."""

from __future__ import annotations

from decimal import Decimal

from django.db import connection
from django.dispatch import receiver
from psycopg.types.range import Range

from nodepools.signals import node_ready, node_released

from .models import LedgerEntry

WHOLE_GPU = Decimal("1")


@receiver(node_ready)
def open_ledger(sender, node, **kwargs) -> None:
    """One open row per GPU the node holds, from ``node.ready_at``. Idempotent per node+GPU.

    A node pool owning whole GPUs pays 1.0 GPU-hour per GPU-hour, MIG or not (DESIGN §6).
    """
    pool = node.nodepool
    open_uuids = set(
        LedgerEntry.objects.filter(node=node, period__upper_inf=True).values_list(
            "gpu_uuid", flat=True
        )
    )
    LedgerEntry.objects.bulk_create(
        [
            LedgerEntry(
                tenant_id=node.tenant_id,
                cluster_id=node.cluster_id,
                nodepool=pool,
                node=node,
                host_id=node.host_id,
                gpu_uuid=uuid,
                gpu_model=pool.gpu_model_id,
                mig_profile=pool.isolation.get("mig_profile", ""),
                billable_fraction=WHOLE_GPU,
                period=Range(node.ready_at, None, "[)"),
            )
            for uuid in node.gpu_uuids
            if uuid not in open_uuids
        ]
    )


@receiver(node_released)
def close_ledger(sender, node, **kwargs) -> None:
    """Close the node's open rows at ``node.released_at`` (a guarded UPDATE; idempotent)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE billing_ledgerentry
               SET period = tstzrange(lower(period), GREATEST(lower(period), %s), '[)')
             WHERE node_id = %s AND upper_inf(period)
            """,
            [node.released_at, node.id],
        )
