"""Signals the fleet sends to the apps above it (DESIGN §2: lower apps never import upward).

Each is sent once the change has committed (``transaction.on_commit``), so a receiver never
acts on a change that was rolled back. Receivers run in the sender's process; they should
enqueue work (``transaction.on_commit`` + a task) rather than do it inline.

``gpu_health_changed``
    A GPU became unhealthy or healthy again. Keyword arguments: ``gpu_uuid`` (str),
    ``host_id`` (UUID), ``holder_id`` (UUID of the node holding it, or None), ``tenant_id``
    (UUID or None), ``healthy`` (bool), ``reason`` (:class:`fleet.choices.HealthReason`
    value), ``xid`` (int or None), ``action`` (the catalog's NVIDIA immediate action, e.g.
    ``RESET_GPU``, or ""), ``rule_action`` (the health rule's ladder step that opened it,
    :class:`fleet.choices.LadderStep` value, or ""), ``needs_operator`` (bool), ``at`` (aware
    datetime). ``nodepools``
    uses it for auto-repair; billing reads :class:`fleet.models.GpuHealthInterval` for SLA
    credits.

``host_state_changed``
    A host changed state. ``host_id``, ``old_state``, ``new_state`` (HostState values),
    ``reason`` (str), ``holder_ids`` (list of node UUIDs holding GPUs of the host).

``gpu_facts_changed``
    A host's agent reported different MIG facts (mode or GPU instances) for some of its GPUs,
    or another driver (then for all of them). ``host_id``, ``gpu_uuids`` (the GPUs whose facts
    changed). ``nodepools`` rewrites the tenant Nodes of those GPUs' holders
    (:mod:`nodepools.tenant_nodes`) and wakes their pools (:mod:`nodepools.drift`).

``host_drain_requested``
    An operator asked to drain a host: the nodes in ``holder_ids`` should be moved off it
    (``host_id``, ``holder_ids``, ``target_state``, ``force``: evict pods that block a drain).
    ``nodepools`` receives it (:mod:`nodepools.host_moves`); the host's ``drain_target`` stays
    set until it is empty, so a lost signal only waits for the periodic resync. Once none of
    its GPUs is held the host enters ``target_state`` by itself.

``host_drain_checked``
    A question, not news: sent *inside* :func:`fleet.services.drain_host`'s transaction,
    before anything is written, with ``host_id`` and ``holder_ids``. Each receiver returns a
    list of :class:`BrokenCommitment` — what the drain would break (``nodepools`` answers for
    every pool whose nodes would have no other host, :mod:`nodepools.commitments`). A drain
    that would break one is refused unless forced or the host is failing (an emergency).

``commitments_broken``
    A drain went ahead although it breaks commitments (``force``, or an emergency drain of a
    failing host). ``host_id``, ``hostname``, ``actor``, ``why`` (``"force"`` or
    ``"emergency"``), ``commitments`` (list of :class:`BrokenCommitment`). ``webhooks`` tells
    each tenant (event ``commitment.broken``).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass

from django.dispatch import Signal


@dataclass(frozen=True)
class BrokenCommitment:
    """What taking a host out of service breaks, for one node pool.

    ``kind``: ``"reservation"`` (a pool on an ACTIVE reservation would run short of what was
    reserved) or ``"no_replacement"`` (a pool's node would leave with no host to take its
    place). The tenant, the node pool and its cluster (ids and names), the reservation (id and
    name; ``None`` and ``""`` for ``no_replacement``) and ``missing`` in words with counts."""

    kind: str
    tenant_id: uuid.UUID
    reservation_id: uuid.UUID | None
    reservation_name: str
    nodepool_id: uuid.UUID
    nodepool_name: str
    missing: str
    cluster_name: str = ""

    def as_dict(self) -> dict[str, str | None]:
        """JSON-ready (ids as strings, no reservation as ``None``)."""
        return {k: None if v is None else str(v) for k, v in asdict(self).items()}

    def __str__(self) -> str:
        pool = (
            f"node pool {self.cluster_name}/{self.nodepool_name}"
            if self.cluster_name
            else f"node pool {self.nodepool_name}"
        )
        if self.kind == "reservation":
            name = self.reservation_name or str(self.reservation_id)
            return f"reservation {name} ({pool}): {self.missing}"
        return f"{pool}: {self.missing}"


gpu_health_changed = Signal()
gpu_facts_changed = Signal()
host_state_changed = Signal()
host_drain_requested = Signal()
host_drain_checked = Signal()
commitments_broken = Signal()
