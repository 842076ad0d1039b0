"""What the console shows of a host drain: the nodes on the host and how each one moves, and
what a drain would disrupt (for the typed-name confirmation). Read-only.

Everything is read from the rows the drain machinery writes (one truth per fact):
``Host.drain_target`` / ``drain_nodes`` / ``drain_force`` / ``drain_requested_at``
(:mod:`fleet.services`), ``Node.move_state`` (:mod:`nodepools.host_moves`: ``replacing`` →
``draining`` / ``drain-blocked`` → ``moved``), the pool's ``HostDrainBlocked`` and
``CapacityShort`` conditions and its HOST_MAINTENANCE operation's ``progress``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clusters.choices import ACTIVE_OPERATION_STATUSES, OperationType
from clusters.models import Operation
from fleet.choices import HostEventKind
from fleet.models import Host, HostEvent
from fleet.services import holders_on
from nodepools.choices import Disruption, NodePhase
from nodepools.host_moves import MOVED
from nodepools.models import Node, NodePool
from nvke.conditions import get_condition

#: the actions that move nodes off a host, with the state the host ends in
DISRUPTIVE = {"drain": None, "maintenance": "MAINTENANCE", "retire": "RETIRED"}


@dataclass
class NodeMove:
    """One node of a draining (or drained) host, as the console shows it."""

    node: Node
    tenant: str
    cluster: str
    pool: str
    #: "" (not moving: the host is not draining), replacing, draining, drain-blocked, moved
    move_state: str
    #: the replacement placed elsewhere: "n-abc PROVISIONING on spare-1", or why there is none
    replacement: str
    #: what holds the move up (pods and their PodDisruptionBudget, no capacity), or ""
    blocker: str
    #: the pool's HOST_MAINTENANCE operation stage (nodes moved / pending), or ""
    operation: str = ""


@dataclass
class DrainView:
    """A host's drain: ``nodes`` (moving and moved), counts in nodes, done when not draining."""

    host: Host
    nodes: list[NodeMove] = field(default_factory=list)
    total: int = 0
    pending: int = 0

    @property
    def moved(self) -> int:
        return max(self.total - self.pending, 0)

    @property
    def draining(self) -> bool:
        return bool(self.host.drain_target)


def _condition_message(pool: NodePool, kind: str) -> str:
    cond = get_condition(pool.conditions, kind)
    return str(cond.get("message") or "") if cond and cond.get("status") == "True" else ""


def _blocker_of(node: Node, pool: NodePool) -> str:
    """The pods that block this node's drain (the pool's ``HostDrainBlocked`` condition lists
    ``node: pods`` per node, ``;``-separated), or the capacity the replacement lacks."""
    if node.move_state == "drain-blocked":
        message = _condition_message(pool, "HostDrainBlocked")
        for part in message.split("; "):
            if part.startswith(f"{node.name}: "):
                return part.removeprefix(f"{node.name}: ")
        return message or "pods that cannot be evicted"
    if node.move_state == "replacing":
        short = _condition_message(pool, "CapacityShort")
        if short:
            return short
    return ""


def drain_view(host: Host) -> DrainView:
    """The nodes on ``host`` and, while it drains (or after), how each one moves.

    Nodes listed: those holding GPUs of the host now, plus those moved off it since the drain
    was requested (``move_state`` moved, released after ``drain_requested_at``). A moving node's
    replacement is the pool's newest nodes elsewhere, created since the drain was requested,
    paired with the moving nodes in creation order (the reconciler places one per moving node).
    """
    live = list(
        Node.objects.filter(host=host)
        .exclude(phase=NodePhase.DELETED)
        .select_related("tenant", "cluster", "nodepool")
        .order_by("created_at", "name")
    )
    moved: list[Node] = []
    since = host.drain_requested_at or last_drain_at(host)
    if since is not None:
        moved = list(
            Node.objects.filter(
                host=host, disruption=Disruption.MOVE, disruption_step=MOVED, released_at__gte=since
            )
            .select_related("tenant", "cluster", "nodepool")
            .order_by("released_at", "name")
        )
    pools = {n.nodepool_id: n.nodepool for n in live + moved}
    ops = {
        op.target_id: op
        for op in Operation.objects.filter(
            target_id__in=list(pools),
            type=OperationType.HOST_MAINTENANCE,
            status__in=ACTIVE_OPERATION_STATUSES,
        )
    }
    replacements: dict[Any, list[Node]] = {}
    if since is not None:
        for n in (
            Node.objects.filter(nodepool_id__in=list(pools), created_at__gte=since)
            .exclude(host=host)
            .exclude(phase=NodePhase.DELETED)
            .select_related("host")
            .order_by("created_at", "name")
        ):
            replacements.setdefault(n.nodepool_id, []).append(n)
    rows: list[NodeMove] = []
    for node in moved + live:
        pool = pools[node.nodepool_id]
        candidates = replacements.get(pool.id, [])
        replacement = ""
        if node.move_state:
            mine = candidates.pop(0) if candidates else None
            if mine is not None:
                where = mine.host.hostname if mine.host else "no host yet"
                replacement = f"{mine.name} {mine.phase} on {where}"
            elif node.move_state == MOVED:
                replacement = (
                    "none (the pool runs short)"
                    if _condition_message(pool, "CapacityShort")
                    else "—"
                )
            else:
                replacement = "being placed" if node.move_state == "replacing" else "none"
        op = ops.get(pool.id)
        rows.append(
            NodeMove(
                node=node,
                tenant=node.tenant.name,
                cluster=node.cluster.name,
                pool=pool.name,
                move_state=node.move_state,
                replacement=replacement,
                blocker=_blocker_of(node, pool),
                operation=str((op.progress or {}).get("stage", "")) if op else "",
            )
        )
    if host.drain_target:
        pending = len(live)
        total = max(host.drain_nodes, pending)
    else:  # not draining (any more): the last drain's moved nodes, and nothing pending
        pending, total = 0, len(moved)
    return DrainView(host=host, nodes=rows, total=total, pending=pending)


def last_drain_at(host: Host):
    """When the host's last drain was asked for (its ``drain to …`` action event), or None."""
    return (
        HostEvent.objects.filter(
            host=host, kind=HostEventKind.ACTION, message__startswith="drain to "
        )
        .order_by("-ts")
        .values_list("ts", flat=True)
        .first()
    )


def disruption(host: Host, action: str) -> dict[str, Any]:
    """What ``action`` (drain / maintenance / retire) on ``host`` would disrupt: the nodes
    holding its GPUs now, per tenant, cluster and pool, and the end state.

    ``{"commitments": [what a drain would break, in words], "nodes": [{"tenant", "cluster",
    "pool", "node", "gpus"}], "tenants": [names],
    "end_state": "MAINTENANCE" | "RETIRED" | None (the drain form's choice), "final": bool}``.
    """
    holder_ids = holders_on(host.pk)
    nodes = list(
        Node.objects.filter(pk__in=holder_ids)
        .select_related("tenant", "cluster", "nodepool")
        .order_by("tenant__name", "cluster__name", "nodepool__name", "name")
    )
    rows = [
        {
            "tenant": n.tenant.name,
            "cluster": n.cluster.name,
            "pool": n.nodepool.name,
            "node": n.name,
            "gpus": len(n.gpu_uuids),
        }
        for n in nodes
    ]
    end = DISRUPTIVE.get(action)
    from nodepools.commitments import broken_by_host_drain

    return {
        # what the drain would break (refused unless forced): nodepools.commitments
        "commitments": [str(b) for b in broken_by_host_drain(host.pk, holder_ids)],
        "nodes": rows,
        "tenants": sorted({r["tenant"] for r in rows}),
        "end_state": end,
        "final": end == "RETIRED",
    }
