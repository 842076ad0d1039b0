"""A node pool's readiness, read from its nodes' phases at every reconcile step.

A node's readiness is stored once, in ``Node.phase``: ``READY`` once its host's agent agreed
(:mod:`nodepools.observed_gates`), ``NOT_READY`` while its host is ``NOT_READY`` (the receiver
``follow_host_readiness`` copies the host's state, which :mod:`fleet.health` sets from the
agent's heartbeats), ``REPAIRING`` during an auto-repair reboot. The pool's summary is
computed from those phases here, never carried over from the step that made the pool RUNNING:

* condition ``NodesReady``: True ``"3 of 3 nodes ready"``, or False naming each node that is
  not ready and why (``c1-h100-ab12cd NOT_READY: host gpu-07 NOT_READY since
  2026-12-02T07:40:00+00:00 (no agent report for 120 s)``);
* while a node is unavailable without anyone having asked for it (``NOT_READY``,
  ``REPAIRING``): condition ``Ready`` False (reason ``NodesNotReady``) and phase ``DEGRADED``
  (as GKE/EKS node groups report a degraded group); the pool is RUNNING again, with ``Ready``
  True, once every node is READY (the reconciler's last step).

Nodes drained on purpose (an upgrade, an isolation change, a scale-down) count as not ready in
``NodesReady`` but do not make the pool DEGRADED: their own steps report them.

A pool ``ERROR`` for its current spec (say, a scale-up without capacity) is read the same way
at every step (:func:`nodepools.reconcile._step_failed`), with the nodes the failed change did
not place named too (``1 of 2 nodes ready; 1 node(s) not placed``); it stays ``ERROR`` and
its ``Ready`` condition keeps the failure (the failed operation's error), while
``NodesReady`` names the nodes out of service.

The cluster's ``NodesReady`` is derived from its pools' own ``NodesReady`` conditions
(:func:`cluster_nodes_ready`), never from their phases: a pool RUNNING while it waits for
capacity (``1 of 2 nodes ready; 1 node(s) not placed``) makes it False too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from clusters.choices import Phase
from nvke.conditions import get_condition, set_condition

from .choices import Disruption, NodePhase
from .models import Node, NodePool

#: node phases that mean the node is out of service without anyone having asked for it
UNPLANNED = (NodePhase.NOT_READY, NodePhase.REPAIRING)


@dataclass(frozen=True)
class Readiness:
    """``ready`` of ``total`` (the pool's ``node_count``) nodes READY; ``problems``: one text
    per node that is not, naming it and why (and how many are not placed, on an ERROR pool);
    ``degraded``: some node is out of service
    unplanned (:data:`UNPLANNED`)."""

    ready: int
    total: int
    problems: tuple[str, ...]
    degraded: bool

    @property
    def summary(self) -> str:
        return f"{self.ready} of {self.total} nodes ready"

    @property
    def message(self) -> str:
        """The summary and each problem, as conditions say it (at most 1000 characters):
        ``1 of 2 nodes ready; 1 node(s) not placed``."""
        return "; ".join((self.summary, *self.problems))[:1000]


def _why(node: Node) -> str:
    """Why ``node`` is not READY, in words: its phase, and its host's state when the host is
    why (state, since when, the reason the fleet recorded)."""
    text = f"{node.name} {node.phase}"
    host = node.host if node.host_id else None
    if node.phase == NodePhase.NOT_READY and host is not None and host.state == "NOT_READY":
        since = host.state_changed_at.isoformat() if host.state_changed_at else "unknown"
        text += f": host {host.hostname} NOT_READY since {since}"
        if host.state_reason:
            text += f" ({host.state_reason})"
    elif node.phase == NodePhase.REPAIRING and node.repair_reason:
        text += f": auto-repair ({node.repair_reason})"
    elif node.observed_problem:
        text += f": {node.observed_problem}"
    return text


def readiness(pool: NodePool, live: list[Node]) -> Readiness:
    """The pool's readiness from ``live`` (its nodes that count towards ``node_count``)."""
    ready = sum(1 for n in live if n.phase == NodePhase.READY)
    not_ready = [n for n in live if n.phase != NodePhase.READY]
    # an ERROR pool (the failed change's) or one waiting for capacity to grow (CapacityShort)
    # has fewer nodes than its node_count here
    missing = pool.node_count - len(live)
    return Readiness(
        ready=ready,
        total=pool.node_count,
        problems=tuple(_why(n) for n in not_ready)
        + ((f"{missing} node(s) not placed",) if missing > 0 else ()),
        degraded=any(n.phase in UNPLANNED for n in live),
    )


def nodes_ready(state: Readiness) -> tuple[str, bool, str, str]:
    """The ``NodesReady`` condition (type, status, reason, message) of ``state``."""
    if state.problems:
        return ("NodesReady", False, "NodesNotReady", state.message)
    return ("NodesReady", True, "NodesReady", state.summary)


def cluster_nodes_ready(pools: list[tuple[str, list[dict]]]) -> tuple[str, bool, str, str]:
    """The cluster's ``NodesReady`` condition (type, status, reason, message) from ``pools``
    (each live pool's ``(name, conditions)``): True when every pool's own ``NodesReady`` is
    True (``"all nodes ready in 6 node pool(s)"``), else False naming each pool whose
    ``NodesReady`` is not True with what it says (``"1 of 6 node pool(s) have nodes not
    ready: ex4 (1 of 2 nodes ready; 1 node(s) not placed)"``; a pool that has not said yet:
    ``"ex4 (no node readiness reported yet)"``); at most 1000 characters."""
    if not pools:
        return ("NodesReady", True, "NoNodePools", "the cluster has no node pools")
    not_ready = []
    for name, conditions in sorted(pools, key=lambda p: p[0]):
        cond = get_condition(conditions, "NodesReady")
        if cond is None:
            not_ready.append(f"{name} (no node readiness reported yet)")
        elif cond.get("status") != "True":
            not_ready.append(f"{name} ({cond.get('message', '')})")
    if not not_ready:
        return (
            "NodesReady",
            True,
            "AllNodesReady",
            f"all nodes ready in {len(pools)} node pool(s)",
        )
    message = f"{len(not_ready)} of {len(pools)} node pool(s) have nodes not ready: " + ", ".join(
        not_ready
    )
    return ("NodesReady", False, "NodePoolsNotReady", message[:1000])


def write_readiness(pool: NodePool, live: list[Node], now: datetime) -> Readiness:
    """Set the pool's ``NodesReady`` condition (and, while :attr:`Readiness.degraded`,
    ``Ready`` False and phase DEGRADED, except on an ERROR pool) from ``live``; saves only
    what changed. Returns the readiness it wrote."""
    state = readiness(pool, live)
    conditions = set_condition(pool.conditions, *nodes_ready(state), now)
    phase = pool.phase
    # an ERROR pool's Ready keeps its failure: NodesReady alone names its nodes
    if state.degraded and phase != Phase.ERROR:
        conditions = set_condition(conditions, "Ready", False, "NodesNotReady", state.message, now)
        if phase == Phase.RUNNING:  # other phases are their own steps' to say
            phase = Phase.DEGRADED
    if (phase, conditions) != (pool.phase, pool.conditions):
        pool.phase, pool.conditions = phase, conditions
        pool.save(update_fields=["phase", "conditions", "updated_at"])
    return state


def next_look_s(live: list[Node], now: datetime) -> float | None:
    """Seconds until the first NOT_READY node of ``live`` (not yet marked for repair) reaches
    ``NVKE_NODE_REPAIR_TIMEOUT_S`` and is replaced (:mod:`nodepools.repair`); None when none
    waits for it (the node's return to READY wakes the pool: ``follow_host_readiness``)."""
    from django.conf import settings

    timeout = settings.NVKE_NODE_REPAIR_TIMEOUT_S
    waits = [
        timeout - (now - n.repair_requested_at).total_seconds()
        for n in live
        if n.phase == NodePhase.NOT_READY
        and n.disruption != Disruption.REPAIR
        and n.repair_requested_at
    ]
    return max(min(waits), 1.0) if waits else None
