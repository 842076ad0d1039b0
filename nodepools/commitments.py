"""What taking a host out of service would break: the commitments of the node pools on it.

A host drain moves its nodes elsewhere (:mod:`nodepools.host_moves`). When no other host can
take a pool's nodes, the pool would run short: of what was reserved, for a pool drawing on an
ACTIVE reservation (promised its GPUs for the reservation's window), or of the size the tenant
asked for, for any other pool (a node removed with no replacement). That is
refused up front (409 ``commitment_would_break``, :func:`fleet.services.drain_host`) unless the
operator says ``force`` (audited, and sent to the tenant as the webhook event
``commitment.broken``). A failing host (``NOT_READY``/``FAILED``) is an emergency: its drain is
never refused, and it says what it broke the same way. Auto-repair (an Xid 79 GPU fallen off
the bus) does not drain the host and is never asked.

:func:`broken_by_host_drain` answers :data:`fleet.signals.host_drain_checked` (``fleet`` cannot
read node pools or reservations: DESIGN §2).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from datetime import datetime

from django.utils import timezone

from clusters.choices import GONE_PHASES
from clusters.providers.fleet_claims import gpu_requests
from fleet import placement
from fleet.signals import BrokenCommitment

from .models import Node
from .specs import nodepool_spec


def broken_by_host_drain(
    host_id: uuid.UUID, holder_ids: Iterable[uuid.UUID], now: datetime | None = None
) -> list[BrokenCommitment]:
    """What a drain of ``host_id`` would break, one :class:`~fleet.signals.BrokenCommitment`
    per node pool; empty when nothing would.

    For each live pool with nodes among ``holder_ids``, the nodes it would then lack (its
    ``node_count`` less its live nodes on other hosts — a defragmentation move's replacement
    placed before the drain and surge nodes count) must fit on the fleet's other hosts: one
    what-if run of the placement planner for all of them together (nothing is claimed), so
    two pools cannot both count on the same spare host. Pools on an ACTIVE reservation are
    placed first, then by cluster and pool name. A pool whose nodes do not fit is named with
    what is missing (``2 of 4 node(s) (16 GPU(s)) have no other … host in us-east-1``): as
    ``reservation`` when it draws on an ACTIVE reservation (the reservation is named too),
    otherwise as ``no_replacement`` (its nodes would leave with nothing to take their place).
    """
    now = now or timezone.now()
    nodes = (
        Node.objects.live()
        .filter(pk__in=list(holder_ids))
        .exclude(nodepool__phase__in=GONE_PHASES)
        .select_related("nodepool__reservation", "nodepool__cluster")
    )
    on_host = Counter(n.nodepool for n in nodes)
    # each pool's live nodes on other hosts, in one query
    elsewhere = Counter(
        Node.objects.live()
        .filter(nodepool__in=list(on_host))
        .exclude(host_id=host_id)
        .values_list("nodepool_id", flat=True)
    )
    wanted = []  # (pool, its ACTIVE reservation or None, nodes it would lack)
    for pool, count in on_host.items():
        reservation = pool.reservation
        if reservation is not None and not reservation.is_active(now):
            reservation = None
        missing = min(count, pool.node_count - elsewhere[pool.id])
        if missing > 0:
            wanted.append((pool, reservation, missing))
    if not wanted:
        return []
    wanted.sort(key=lambda w: (w[1] is None, w[0].cluster.name, w[0].name))
    requests = {
        pool.id: gpu_requests(nodepool_spec(pool), [uuid.uuid4() for _ in range(missing)])
        for pool, _reservation, missing in wanted
    }
    every = [r for batch in requests.values() for r in batch]
    planner = placement.Planner(placement.load_host_views(every, exclude=[host_id]))
    broken: list[BrokenCommitment] = []
    for pool, reservation, missing in wanted:
        try:
            planner.place_all(requests[pool.id])  # kept: the next pool sees what is left
            continue
        except placement.InsufficientCapacity:
            pass
        where = (reservation.zone if reservation else "") or pool.cluster.region
        what = (
            f"{missing} of {pool.node_count} node(s) ({missing * pool.gpus_per_node} GPU(s)) "
            f"have no other {pool.gpu_model_id} host in {where}"
        )
        broken.append(
            BrokenCommitment(
                kind="reservation" if reservation else "no_replacement",
                tenant_id=pool.tenant_id,
                reservation_id=reservation.id if reservation else None,
                reservation_name=reservation.name if reservation else "",
                nodepool_id=pool.id,
                nodepool_name=pool.name,
                missing=what,
                cluster_name=pool.cluster.name,
            )
        )
    return broken
