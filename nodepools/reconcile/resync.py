"""What the periodic resync re-enqueues, and the cluster's NodesReady condition written from
its pools.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from django.db import transaction

from clusters.choices import Phase
from clusters.models import Cluster
from nvke.conditions import set_condition

from .. import host_moves, readiness, repair
from ..models import NodePool
from . import delete, scale

log = logging.getLogger(__name__)


def update_cluster_nodes_ready(cluster_id: uuid.UUID, now: datetime) -> None:
    """Write the cluster's ``NodesReady`` condition from its live pools' own ``NodesReady``
    (:func:`nodepools.readiness.cluster_nodes_ready`: one truth; the pools' phases said
    "6 node pool(s) running" beside a pool's "1 of 2 nodes ready", issue 33).

    The cluster row is locked with SKIP LOCKED: when the cluster reconciler holds it, the
    update is skipped (the next pool step or resync writes it), which avoids a lock-order
    deadlock between the two reconcilers.
    """
    with transaction.atomic():
        cluster = (
            Cluster.objects.select_for_update(skip_locked=True, no_key=True)
            .filter(pk=cluster_id)
            .first()
        )
        if cluster is None or cluster.phase == Phase.DELETED:
            return
        pools = list(
            NodePool.objects.filter(cluster_id=cluster_id)
            .exclude(phase=Phase.DELETED)
            .values_list("name", "conditions")
        )
        _type, status, reason, message = readiness.cluster_nodes_ready(pools)
        conditions = set_condition(cluster.conditions, "NodesReady", status, reason, message, now)
        if conditions != cluster.conditions:
            Cluster.objects.filter(pk=cluster_id).update(conditions=conditions)


def nodepools_needing_reconcile() -> list[uuid.UUID]:
    """Ids the periodic resync re-enqueues: any pool one of the steps still has work for,
    each step saying when in its own ``RESYNC`` clause (deletion, scaling and capacity,
    auto-repair, host moves)."""
    wanted = delete.RESYNC | scale.RESYNC | repair.RESYNC | host_moves.RESYNC
    return list(
        NodePool.objects.filter(wanted)
        .exclude(phase__in=(Phase.DELETED, Phase.DELETE_FAILED))
        .values_list("id", flat=True)
        .distinct()
    )
