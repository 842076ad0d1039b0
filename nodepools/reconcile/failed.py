"""The step of a pool ERROR for its current spec (step 9): its nodes are read and repaired, the
failed change waits.
"""

from __future__ import annotations

import logging
from datetime import datetime

from clusters.choices import OperationType, Phase
from clusters.models import finish_operation
from clusters.providers import ProviderError, get_provider
from clusters.providers.base import InsufficientCapacity
from nvke.conditions import save_conditions

from .. import readiness
from ..choices import LIVE_NODE_PHASES
from ..models import NodePool
from ..repair import (
    placed_replacements,
    replacement_waits,
    step_repair,
)
from ..specs import nodepool_spec
from .nodes_up import _bring_up, _verified
from .scale import _place_nodes

log = logging.getLogger(__name__)


def _step_failed(pool: NodePool, now: datetime) -> float | None:
    """A step of a pool ERROR for its current spec (step 9 of the module docstring).

    The failed change is not retried (a new spec or a deletion moves the pool on); the nodes
    the pool has are still read (:mod:`nodepools.readiness`) and repaired
    (:mod:`nodepools.repair`) as in a RUNNING pool. A replaced node gets exactly one
    replacement (:func:`nodepools.repair.placed_replacements`), never the nodes the failed
    change asked for; without capacity for it the placement is retried every
    ``SHORT_RETRY_S`` (``RepairPending`` says why). The phase stays ERROR and ``Ready`` keeps
    the failure. Returns None when nothing is in progress.
    """
    if pool.cluster.phase != Phase.RUNNING:
        return None  # its nodes are looked at once the control plane is back (beat's resync)
    live = list(pool.nodes.live().order_by("created_at", "name"))
    unplaced, placed = placed_replacements(pool, live)
    if unplaced:
        try:
            _place_nodes(pool, len(unplaced), now, replaces=unplaced)
        except (InsufficientCapacity, ProviderError) as exc:
            why = (
                str(exc) if isinstance(exc, InsufficientCapacity) else f"the provider failed: {exc}"
            )
            readiness.write_readiness(pool, live, now)
            return replacement_waits(pool, unplaced, why, now)
        return 0.0  # the next step brings the replacement up
    provider = get_provider(pool.cluster.provider)
    spec = nodepool_spec(pool)
    waits, unverified, failed = _bring_up(pool, placed, provider, spec, now)
    if placed:
        save_conditions(pool, now, _verified([failed] if failed else unverified))
    if failed is not None or waits:
        readiness.write_readiness(pool, live, now)
    if failed is not None:
        # the replacement never agreed with its host's agent: the repair fails, the node
        # stays as a new node of a failed change does (an operator looks, or a new spec)
        error = {"code": "observed_state_mismatch", "message": failed, "retryable": True}
        finish_operation(pool.id, types=(OperationType.REPAIR_NODES,), error=error, now=now)
        return None
    if waits:
        return min(waits)
    repairing = step_repair(pool, live, provider, spec, now)
    # read after the repair step, so that a node it took out of service is named at once
    live = [n for n in live if n.phase in LIVE_NODE_PHASES]
    readiness.write_readiness(pool, live, now)
    if repairing is not None:
        return repairing
    return readiness.next_look_s(live, now)
