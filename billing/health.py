"""SLA-credited unhealthy time, read from the fleet's GPU health intervals (one truth).

The fleet keeps one history of GPU health: :class:`fleet.models.GpuHealthInterval`, opened by
an Xid (:func:`fleet.health.handle_xid`), a failed check, a missing GPU or a silent host, and
closed by verified recovery, auto-repair (a node rebooted) or an operator (``mark-healthy`` in
the API or the console, audited). Billing credits exactly those intervals:

1. Only intervals with ``needs_operator`` count: a fault the platform must fix (an Xid whose
   catalog severity is ``critical``: NVIDIA's action RESET_GPU, RESTART_BM, CONTACT_SUPPORT …).
   Application Xids, unknown codes the device plugin ignores, a silent host or a missing GPU
   credit nothing.
2. Scope, from the interval's catalog action through the one Xid-action table
   (:mod:`catalog.xid_actions`, which fleet reads too): RESTART_BM and CHECK_MECHANICALS take
   the whole machine down (every allocation on the interval's host is credited — the
   interval's GPU is a GPU of that host by construction: an Xid naming a GPU the host does
   not own is refused at ingestion); RESTART_VM the node(s) holding the GPU; anything else
   the GPU itself (all of its rows: whole GPU or GPU instances).
3. An affected allocation is credited from the interval's start to its end (an open interval:
   until the allocation ends). Only allocations open at the interval's start are affected: a
   GPU given out later was healthy when the platform placed it, and a fault on an idle GPU
   credits no one.

Credited time is billed at the allocation's fraction, so usage minus credit is what is charged.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from catalog.xid_actions import actions_of_scope


@dataclass(frozen=True)
class CreditInterval:
    """Unhealthy time of one ledger row: ``[start, end)``; ``end`` None = until the row ends.

    ``xid`` (None for a non-Xid cause) / ``xid_gpu_uuid`` (the faulty GPU) / ``scope``
    (``gpu`` | ``node`` | ``host``) say why; ``interval_id`` is the fleet interval's public
    UUID (what invoices show tenants: :mod:`nvke.public_ids`), "" when not known.
    """

    entry_id: int
    gpu_uuid: str
    start: datetime
    end: datetime | None
    xid: int | None
    xid_gpu_uuid: str
    scope: str
    interval_id: str = ""


_CREDITS_SQL = """
WITH ev AS (
    SELECT i.public_id::text AS public_id, i.host_id, i.gpu_uuid, i.started_at AS ts,
           i.ended_at, i.xid,
           CASE WHEN i.action = ANY(%(host_actions)s) THEN 'host'
                WHEN i.action = ANY(%(node_actions)s) THEN 'node'
                ELSE 'gpu' END AS scope
      FROM fleet_gpuhealthinterval i
     WHERE i.needs_operator
       AND i.started_at >= %(since)s AND i.started_at < %(end)s
       AND i.host_id IN (SELECT l.host_id FROM billing_ledgerentry l
                          WHERE l.period && tstzrange(%(start)s, %(end)s, '[)')
                            AND (%(tenant)s::uuid IS NULL OR l.tenant_id = %(tenant)s::uuid))
)
SELECT l.id, l.gpu_uuid, ev.ts, ev.ended_at, ev.xid, ev.gpu_uuid, ev.scope, ev.public_id
  FROM ev
  JOIN billing_ledgerentry l
    ON l.host_id = ev.host_id
   -- "period @> ts" spelled on the bounds: the host index, not the GiST of the exclusion
   -- constraint (which leads with gpu_uuid and is slow for this probe)
   AND lower(l.period) <= ev.ts AND ev.ts < COALESCE(upper(l.period), 'infinity')
   AND (ev.scope = 'host'
     OR (ev.scope = 'gpu' AND l.gpu_uuid = ev.gpu_uuid)
     OR (ev.scope = 'node' AND l.node_id IN (
            SELECT h.node_id FROM billing_ledgerentry h
             WHERE h.host_id = ev.host_id AND h.gpu_uuid = ev.gpu_uuid
               AND lower(h.period) <= ev.ts
               AND ev.ts < COALESCE(upper(h.period), 'infinity'))))
 WHERE lower(l.period) < %(end)s AND COALESCE(upper(l.period), 'infinity') > %(start)s
   AND (%(tenant)s::uuid IS NULL OR l.tenant_id = %(tenant)s::uuid)
 ORDER BY l.id, ev.ts
"""


def credit_intervals(
    *, start: datetime, end: datetime, tenant_id: uuid.UUID | None = None
) -> list[CreditInterval]:
    """Credited intervals of the ledger rows overlapping ``[start, end)`` (one tenant or all).

    Intervals are not clipped to the window or merged; overlapping ones of one row count once
    where they are used (:mod:`billing.aggregation` unions them per row).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(lower(period)) FROM billing_ledgerentry"
            " WHERE period && tstzrange(%(start)s, %(end)s, '[)')"
            " AND (%(tenant)s::uuid IS NULL OR tenant_id = %(tenant)s::uuid)",
            {"start": start, "end": end, "tenant": tenant_id},
        )
        since = cursor.fetchone()[0]
        if since is None:
            return []
        cursor.execute(
            _CREDITS_SQL,
            {
                "host_actions": list(actions_of_scope("host")),
                "node_actions": list(actions_of_scope("node")),
                "since": since,
                "start": start,
                "end": end,
                "tenant": tenant_id,
            },
        )
        return [CreditInterval(*row) for row in cursor.fetchall()]
