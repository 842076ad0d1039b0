"""What the periodic resync re-enqueues, and the cluster's NodesReady condition written from
its pools.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from django.db import transaction
from django.db.models import F, Q

from clusters.choices import Phase
from clusters.models import Cluster
from clusters.providers import MACHINE_REPLACING_PROVIDERS
from nvke.conditions import set_condition

from .. import host_moves
from ..choices import LIVE_NODE_PHASES, NodePhase
from ..models import NodePool
from ..repair import REPLACING

log = logging.getLogger(__name__)


def update_cluster_nodes_ready(cluster_id: uuid.UUID, now: datetime) -> None:
    """Write the cluster's ``NodesReady`` condition from its live pools.

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
            .values_list("name", "phase")
        )
        not_running = sorted(name for name, phase in pools if phase != Phase.RUNNING)
        if not pools:
            status, reason, message = True, "NoNodePools", "the cluster has no node pools"
        elif not_running:
            status, reason = False, "NodePoolsNotReady"
            message = f"node pools not running: {', '.join(not_running)}"
        else:
            status, reason, message = (
                True,
                "AllNodePoolsRunning",
                f"{len(pools)} node pool(s) running",
            )
        conditions = set_condition(cluster.conditions, "NodesReady", status, reason, message, now)
        if conditions != cluster.conditions:
            Cluster.objects.filter(pk=cluster_id).update(conditions=conditions)


def nodepools_needing_reconcile() -> list[uuid.UUID]:
    """Ids the periodic resync re-enqueues: unconverged, transitional, or cluster deleting."""
    return list(
        NodePool.objects.filter(
            Q(observed_generation__lt=F("generation"))
            | Q(phase__in=(Phase.PROVISIONING, Phase.RECONCILING, Phase.DELETING))
            | Q(cluster__deletion_requested_at__isnull=False)
            | Q(nodes__phase=NodePhase.NOT_READY)
            # a live node marked for repair, or a released one waiting for its replacement
            | Q(nodes__phase__in=LIVE_NODE_PHASES, nodes__repair_state__gt="")
            | Q(nodes__repair_state=REPLACING)
            # the infrastructure may replace their machines by itself (health checks)
            | Q(phase=Phase.RUNNING, cluster__provider__in=MACHINE_REPLACING_PROVIDERS)
            | Q(nodes__move_state__in=host_moves.MOVING_STATES)
            | Q(nodes__phase__in=LIVE_NODE_PHASES, nodes__host__drain_target__gt="")
            | Q(conditions__contains=[{"type": "CapacityShort", "status": "True"}])
        )
        .exclude(phase__in=(Phase.DELETED, Phase.DELETE_FAILED))
        .values_list("id", flat=True)
        .distinct()
    )
