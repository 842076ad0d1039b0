"""The one disruption path: how a node is taken out of service (DESIGN §3, "Inside the tenant's
cluster"), and which node leaves first.

Every caller that takes a node away — scale-down, upgrade, isolation change, host maintenance
and defrag moves (:mod:`nodepools.host_moves`), repair, deletion — cordons and drains it
through :func:`drain`, one look per reconcile step, with a :class:`DrainPolicy` that says how
long blocking pods are waited for and what happens then:

- ``pause``: the drain stops on the node (``BLOCKED``), the caller names the pods and waits
  for an operator (``force``) — node upgrades and host drains;
- ``evict``: the blockers are deleted anyway, as cluster autoscalers do — scale-down;
- ``fail``: the drain FAILS (``FAILED``) naming the pods. No caller asks for it today;
  handed it, an upgrade and a host move pause as for ``pause``, a defragmentation run FAILS
  (``move_blocked``), a scale-down keeps waiting (``tests/nodepools/test_disruption_callers.py``
  runs every caller in every situation).

``force`` deletes the pods at once, ignoring PodDisruptionBudgets (never the default). Before any
eviction the registered :data:`GATES` are asked (a gate answering a reason keeps the drain
``WAITING`` and names it). Gates are asked even with ``force``: ``force`` overrides commitments
and budgets, never a gate. The first gate is the tenant's checkpoint
(:func:`nodepools.checkpoints.checkpoint_gate`): before a *planned* disruption of a node of a
pool with a disruption hook the sequence is cordon → request (CloudEvent
``nodepool.disruption.requested``) → wait for the ack or the deadline → evict. ``immediate``
drains (repair of a failing GPU, deletion) ask no gate: emergencies never wait.

The primitive talks to the tenant cluster only through a :class:`NodeBackend`: cordon,
then one look at the node's pods (ask each to leave; say which are still there and why).
:class:`ProviderBackend` hands both to the cluster's provider
(:meth:`clusters.providers.base.Provider.cordon_node` / ``evict_pods``). On a hosted cluster
that is the tenant's real kube-apiserver (:mod:`clusters.hosted.drain`): cordon sets the
Node's ``spec.unschedulable``; pods leave through the **Eviction API**, so their
PodDisruptionBudgets hold, and a refused eviction (429) names the budget and the pod
(``"default/web-1 (blocked by PodDisruptionBudget default/web-pdb: …)"``); ``force`` deletes
the pods instead (``kubectl drain --disable-eviction``), and each pod deleted so is written to
the audit log (action ``node.pods_deleted``); DaemonSet and mirror pods stay, as with
``kubectl drain``. A drain is complete once no other pod is left on the node (evicted pods
still terminating are waited for), except for ``immediate`` drains, whose machine goes anyway.
Every call is idempotent: a Celery task that runs twice asks again and finds less to do.

The node's sub-state (``Node.disruption``: why, ``Node.disruption_step``: how far, and the drain
clock ``Node.drain_started_at``) is written here and nowhere else: :func:`cordon` starts a
disruption (the drain's caller names it), :func:`start` marks one that starts before any
cordon (a repair requested, a move placing its replacement first) or replaces another under the
overlap rule of ``Node``'s docstring (repair wins over everything, a move over planned
disruptions), :func:`advance` records the next step, :func:`end` puts the node back in service
or leaves the row as released; :func:`advance_all` / :func:`end_all` are their guarded bulk
forms. Callers read the fields and decide; they never assign them.

Which node leaves first (:func:`removal_order`): nodes out of service (NOT_READY,
REPAIRING, marked for repair, GPUs in an unknown state) before healthy ones, then the newest
first — Cluster API's MachineSet deletion policy ("Newest", with unhealthy machines first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

from django.conf import settings

from clusters.providers.base import Evictions, NodePoolSpec, Provider

from .checkpoints import checkpoint_gate
from .choices import Disruption, DisruptionStep, NodePhase
from .models import Node
from .specs import node_spec

log = logging.getLogger(__name__)

#: outcomes of :func:`drain`
DRAINED, WAITING, BLOCKED, FAILED = "drained", "waiting", "blocked", "failed"

OnTimeout = Literal["pause", "evict", "fail"]


@dataclass(frozen=True)
class DrainPolicy:
    """How a drain treats pods that block it: waited for up to ``timeout_s`` seconds after
    the node was cordoned (``Node.drain_started_at``), then ``on_timeout``; ``force`` evicts
    at once, ignoring disruption budgets. ``immediate``: the node leaves now (it is failing,
    or its machine is being deleted): no gate is asked and nothing is waited for."""

    timeout_s: float
    on_timeout: OnTimeout = "pause"
    force: bool = False
    immediate: bool = False
    #: the :data:`POLICIES` row it came from ("" for a policy made by hand): the gates read
    #: it (the checkpoint gate asks the tenant before a planned caller's drain)
    caller: str = ""


#: every caller of :func:`drain` and its policy: (timeout in seconds, or the setting that
#: holds it, or None where the request says; what happens at the timeout; immediate)
POLICIES: dict[str, tuple[float | str | None, OnTimeout, bool]] = {
    "scale-down": ("NVKE_SCALE_DOWN_DRAIN_TIMEOUT_S", "evict", False),
    "upgrade": (None, "pause", False),  # the upgrade request's drain_timeout_s
    "isolation-change": (float("inf"), "pause", False),  # waited for, never evicted
    "host-maintenance": ("NVKE_HOST_DRAIN_TIMEOUT_S", "pause", False),
    "defrag-move": ("NVKE_HOST_DRAIN_TIMEOUT_S", "pause", False),
    "repair": (0.0, "evict", True),  # a failing node: never waits (the emergency path)
    "deletion": (0.0, "evict", True),  # the machine is deleted: its pods go with it
}


#: the disruption (``Node.disruption``) each caller of :data:`POLICIES` records
REASONS: dict[str, str] = {
    "scale-down": Disruption.SCALE_DOWN,
    "upgrade": Disruption.UPGRADE,
    "isolation-change": Disruption.ISOLATION_CHANGE,
    "host-maintenance": Disruption.MOVE,
    "defrag-move": Disruption.MOVE,
    "repair": Disruption.REPAIR,
    "deletion": Disruption.DELETION,
}
#: the disruptions a move replaces (planned ones; never a repair or a deletion)
PLANNED = (Disruption.UPGRADE, Disruption.ISOLATION_CHANGE, Disruption.SCALE_DOWN)


def policy_for(caller: str, *, force: bool = False, timeout_s: float | None = None) -> DrainPolicy:
    """The drain policy of ``caller`` (a key of :data:`POLICIES`); ``timeout_s`` where the
    request gives it (an upgrade's ``drain_timeout_s``), ``force`` where the operator asked.
    KeyError for an unknown caller."""
    timeout, on_timeout, immediate = POLICIES[caller]
    if timeout_s is None:
        if timeout is None:
            raise ValueError(f"the {caller} policy takes its timeout from the request")
        timeout_s = float(getattr(settings, timeout) if isinstance(timeout, str) else timeout)
    return DrainPolicy(timeout_s, on_timeout, force=force, immediate=immediate, caller=caller)


@dataclass(frozen=True)
class DrainResult:
    """One look at a drain: ``outcome`` (:data:`DRAINED`, :data:`WAITING`, :data:`BLOCKED`,
    :data:`FAILED`) and the pods (``namespace/name (why)``) or gate reasons that hold it."""

    outcome: str
    blockers: list[str] = field(default_factory=list)
    #: pods deleted without the Eviction API by this look (``force`` or ``on_timeout="evict"``)
    deleted: list[str] = field(default_factory=list)
    #: WAITING because a gate holds it (``blockers`` are the gates' reasons, e.g. "waiting for
    #: checkpoint (deadline …)"), not because of pods
    gated: bool = False

    @property
    def drained(self) -> bool:
        return self.outcome == DRAINED

    def held(self, node_name: str) -> list[str]:
        """What holds this WAITING drain of ``node_name``, as a caller's progress names it: each
        gate's reason (``"n: waiting for checkpoint (deadline …)"``), or the pods waited for
        until the drain timeout (``"n: draining, waiting for default/web-1 (…)"``)."""
        if self.gated:
            return [f"{node_name}: {reason}" for reason in self.blockers]
        return [f"{node_name}: draining, waiting for {', '.join(self.blockers)}"]


class NodeBackend(Protocol):
    """What the drain needs from the tenant's cluster."""

    def cordon(self, node: Node) -> None:
        """Mark the node unschedulable (idempotent)."""

    def evict(self, node: Node, *, force: bool) -> Evictions:
        """Ask the node's pods to leave (``force``: delete them, budgets ignored); which are
        still on the node and why (:class:`clusters.providers.base.Evictions`)."""


class ProviderBackend:
    """The backend of every cluster: its provider (the tenant's real API on a hosted cluster,
    the workload cluster under Cluster API, simulated kubelets in tests)."""

    def __init__(self, provider: Provider, spec: NodePoolSpec) -> None:
        self.provider, self.spec = provider, spec

    def cordon(self, node: Node) -> None:
        self.provider.cordon_node(self.spec, node_spec(node))

    def evict(self, node: Node, *, force: bool) -> Evictions:
        return self.provider.evict_pods(self.spec, node_spec(node), force=force)


def backend_for(provider: Provider, spec: NodePoolSpec) -> NodeBackend:
    """The node backend of a pool's cluster."""
    return ProviderBackend(provider, spec)


#: gates asked before a node's pods are evicted (never by an ``immediate`` drain):
#: ``gate(node, policy, now) -> reason or None``; a reason keeps the drain WAITING
GATES: list[Callable[[Node, DrainPolicy, datetime], str | None]] = [checkpoint_gate]


class _Keep:
    """The drain clock is left as it is."""


KEEP = _Keep()


def _write(node: Node, fields: dict, save: tuple[str, ...] | list[str] = ()) -> None:
    """Set ``fields`` on ``node`` and save them with the caller's own ``save`` fields."""
    for name, value in fields.items():
        setattr(node, name, value)
    node.save(update_fields=[*fields, *save])


def start(
    node: Node,
    why: str,
    step: str,
    *,
    phase: str | None = None,
    clock: datetime | _Keep | None = KEEP,
    save: tuple[str, ...] | list[str] = (),
) -> None:
    """``node`` is disrupted for ``why`` (:class:`~nodepools.choices.Disruption`), at
    ``step``, whatever it was doing before: the caller applies the overlap rule (``Node``'s
    docstring) before calling. ``phase``/``clock`` where they change; ``save``: other fields
    the caller set on ``node`` to save with it."""
    fields: dict = {"disruption": why, "disruption_step": step}
    if phase is not None:
        fields["phase"] = phase
    if not isinstance(clock, _Keep):
        fields["drain_started_at"] = clock
    _write(node, fields, save)


def advance(
    node: Node,
    step: str,
    *,
    phase: str | None = None,
    clock: datetime | _Keep | None = KEEP,
    save: tuple[str, ...] | list[str] = (),
) -> None:
    """``node``'s disruption reached ``step`` (:class:`~nodepools.choices.DisruptionStep`);
    ``clock``: the drain clock restarts (an upgrade's verification counts from its install)."""
    start(node, node.disruption, step, phase=phase, clock=clock, save=save)


def end(node: Node, *, phase: str | None = None, save: tuple[str, ...] | list[str] = ()) -> None:
    """``node``'s disruption is over: no disruption, no drain clock; ``phase`` its phase now
    (READY: back in service, uncordoned)."""
    start(node, "", "", phase=phase, clock=None, save=save)


def advance_all(nodes, step: str, *, clock: datetime | _Keep | None = KEEP) -> int:
    """:func:`advance` for a queryset already filtered on its disruption and step (a guarded
    UPDATE: a node that moved on meanwhile is not touched). Returns the count."""
    fields: dict = {"disruption_step": step}
    if not isinstance(clock, _Keep):
        fields["drain_started_at"] = clock
    return nodes.update(**fields)


def end_all(nodes, *, phase: str | None = None) -> int:
    """:func:`end` for a queryset already filtered on its disruption and step."""
    fields: dict = {"disruption": "", "disruption_step": "", "drain_started_at": None}
    if phase is not None:
        fields["phase"] = phase
    return nodes.update(**fields)


def restart_clock(node: Node, now: datetime) -> None:
    """The drain clock of ``node`` restarts at ``now`` (the tenant's checkpoint released the
    drain: the pods' timeout counts from there)."""
    _write(node, {"drain_started_at": now})


def cordon(
    node: Node, backend: NodeBackend, now: datetime, *, why: str = "", step: str = ""
) -> None:
    """Start the disruption of ``node``: cordoned by the backend, then DRAINING (no new
    pods) with its drain clock started. Nothing is written when the backend raises (a
    provider that cannot drain leaves the node as it was). The backend is asked at every
    call (a cordon is idempotent).

    ``why``: the disruption the caller records (:class:`~nodepools.choices.Disruption`), at
    ``step`` (default ``draining``), on a node that has none; a node already disrupted keeps
    its disruption (a repair's drain stays ``repair``, a released move stays ``move``), and
    moves to ``step`` where the disruption is ``why`` and ``step`` is given (a move's
    ``replacing`` → ``draining``). A new disruption or step starts the drain clock; otherwise
    the clock of a node already DRAINING is left alone."""
    backend.cordon(node)
    fields: dict = {}
    if why and not node.disruption:
        fields.update(disruption=why, disruption_step=step or DisruptionStep.DRAINING)
    elif why and step and node.disruption == why and node.disruption_step != step:
        fields["disruption_step"] = step
    if fields or node.phase != NodePhase.DRAINING or node.drain_started_at is None:
        fields.update(phase=NodePhase.DRAINING, drain_started_at=now)
    if fields:
        _write(node, fields)


def drain(node: Node, policy: DrainPolicy, backend: NodeBackend, now: datetime) -> DrainResult:
    """One look at ``node``'s drain under ``policy`` (cordoning it first if it is not yet).

    Gates first (not with ``policy.immediate``): a reason keeps it ``WAITING``. Then the pods
    are asked to leave: with ``policy.force`` or ``policy.immediate`` deleted (budgets
    ignored; ``immediate`` is ``DRAINED`` at once, ``force`` once they are gone), else
    evicted. ``DRAINED`` once no pod is left; ``WAITING`` while pods stay (refused by a
    budget, terminating) for less than ``policy.timeout_s`` since ``node.drain_started_at``;
    after that they are deleted (``on_timeout="evict"``), or the drain is ``BLOCKED``
    (``pause``) or ``FAILED`` (``fail``) naming them. No caller-specific branch: the caller
    reads the outcome and records it in its own terms.
    """
    cordon(node, backend, now, why=REASONS.get(policy.caller, ""))
    held = [] if policy.immediate else [r for gate in GATES if (r := gate(node, policy, now))]
    if held:
        return DrainResult(WAITING, held, gated=True)
    if policy.force or policy.immediate:
        left = _evict(node, backend, force=True)
        if policy.immediate or not left.remaining:
            return DrainResult(DRAINED, deleted=left.deleted)
        return DrainResult(WAITING, left.remaining, deleted=left.deleted)
    left = _evict(node, backend, force=False)
    if not left.remaining:
        return DrainResult(DRAINED)
    if (now - (node.drain_started_at or now)).total_seconds() < policy.timeout_s:
        return DrainResult(WAITING, left.remaining)
    if policy.on_timeout == "evict":
        forced = _evict(node, backend, force=True)
        return DrainResult(DRAINED, left.remaining, deleted=forced.deleted)
    return DrainResult(FAILED if policy.on_timeout == "fail" else BLOCKED, left.remaining)


def _evict(node: Node, backend: NodeBackend, *, force: bool) -> Evictions:
    """The backend's look at the node's pods; pods it deleted without the Eviction API are
    written to the audit log (one event per look), so a forced drain leaves a record."""
    left = backend.evict(node, force=force)
    if left.deleted:
        from tenants import audit

        log.warning("node %s: deleted without eviction: %s", node.name, ", ".join(left.deleted))
        audit.record(
            actor="nvke:disruption",
            action="node.pods_deleted",
            target_type="node",
            target_id=node.pk,
            tenant_id=node.tenant_id,
            after={"node": node.name, "pods": list(left.deleted), "eviction_api": False},
        )
    return left


def unhealthy(node: Node) -> bool:
    """Out of service or about to be: NOT_READY, REPAIRING, marked for repair, or GPUs in an
    unknown state after a failed reconfiguration."""
    from .reconcile import UNKNOWN_CONFIG

    return (
        node.phase in (NodePhase.NOT_READY, NodePhase.REPAIRING)
        or node.disruption == Disruption.REPAIR
        or node.applied_config == UNKNOWN_CONFIG
    )


def removal_order(nodes: list[Node]) -> list[Node]:
    """``nodes`` in the order they leave a pool that has too many: unhealthy ones first
    (:func:`unhealthy`), then the newest (Cluster API's MachineSet deletion policy)."""
    return sorted(nodes, key=lambda n: (unhealthy(n), n.created_at, n.name), reverse=True)
