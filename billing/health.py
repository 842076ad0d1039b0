"""SLA-credited unhealthy time, derived from Xid events and the catalog (one small module).

Rule (until fleet keeps a GPU health history; then only this module changes):

1. An Xid event whose catalog entry (:class:`catalog.models.XidCode`) has severity
   ``critical`` needs operator action (NVIDIA's immediate action RESET_GPU, RESTART_BM,
   CONTACT_SUPPORT, WORKFLOW_* ... mapped by ``xid.yaml``'s ``resolution_buckets_to_nvke``);
   informational and application-level Xids (13, 31, 43 ...) and codes the catalog does not know
   credit nothing.
2. Its scope follows the action: RESTART_BM and CHECK_MECHANICALS take the whole machine down
   (cordon, drain, reboot the host: every allocation on the host is credited); RESTART_VM the
   node(s) holding the GPU; anything else the GPU itself (all of its rows: whole GPU or slices).
   Every scope lies on the Xid's host, which keeps the lookup to that host's rows.
3. The unhealthy interval of an affected allocation starts at the Xid's timestamp and ends at
   the first :class:`billing.models.GpuRecovery` of the Xid's GPU after it, or when that
   allocation ends (the node is released: repaired by replacement, or deleted), whichever comes
   first. Only allocations open at the Xid's timestamp are affected: a GPU given out later was
   healthy when the platform placed it, and an Xid on an idle GPU credits no one.

Credited time is billed at the allocation's fraction, so usage minus credit is what is charged.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from catalog.models import XidCode

HOST_ACTIONS = ("RESTART_BM", "CHECK_MECHANICALS")
NODE_ACTIONS = ("RESTART_VM",)


@dataclass(frozen=True)
class CreditInterval:
    """Unhealthy time of one ledger row: ``[start, end)``; ``end`` None = until the row ends.

    ``xid`` / ``xid_gpu_uuid`` / ``scope`` (``gpu`` | ``node`` | ``host``) say why.
    """

    entry_id: int
    gpu_uuid: str
    start: datetime
    end: datetime | None
    xid: int
    xid_gpu_uuid: str
    scope: str


def credit_scopes() -> dict[int, str]:
    """Xid code -> scope for every catalogued Xid that needs operator action."""
    out = {}
    for code, action in XidCode.objects.filter(severity=XidCode.Severity.CRITICAL).values_list(
        "code", "nvidia_immediate_action"
    ):
        if action in HOST_ACTIONS:
            out[code] = "host"
        elif action in NODE_ACTIONS:
            out[code] = "node"
        else:
            out[code] = "gpu"
    return out


_CREDITS_SQL = """
WITH ev AS (
    SELECT e.id, e.host_id, e.gpu_uuid, e.ts, e.xid, s.scope
      FROM fleet_xidevent e
      JOIN unnest(%(codes)s::int[], %(scopes)s::text[]) AS s(code, scope) ON s.code = e.xid
     WHERE e.ts >= %(since)s AND e.ts < %(end)s
       AND e.host_id IN (SELECT l.host_id FROM billing_ledgerentry l
                          WHERE l.period && tstzrange(%(start)s, %(end)s, '[)')
                            AND (%(tenant)s::uuid IS NULL OR l.tenant_id = %(tenant)s::uuid))
)
SELECT l.id, l.gpu_uuid, ev.ts,
       (SELECT min(r.recovered_at) FROM billing_gpurecovery r
         WHERE r.gpu_uuid = ev.gpu_uuid AND r.recovered_at > ev.ts) AS recovered_at,
       ev.xid, ev.gpu_uuid, ev.scope
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
    scopes = credit_scopes()
    if not scopes:
        return []
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
                "codes": list(scopes),
                "scopes": list(scopes.values()),
                "since": since,
                "start": start,
                "end": end,
                "tenant": tenant_id,
            },
        )
        return [CreditInterval(*row) for row in cursor.fetchall()]
