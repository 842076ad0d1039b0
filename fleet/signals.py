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
    A host's agent reported different MIG facts (mode or GPU instances) for some of its GPUs.
    ``host_id``, ``gpu_uuids`` (the GPUs whose facts changed). ``nodepools`` rewrites the
    tenant Nodes of those GPUs' holders (:mod:`nodepools.tenant_nodes`).

``host_drain_requested``
    An operator asked to drain a host: the nodes in ``holder_ids`` should be moved off it
    (``host_id``, ``holder_ids``, ``target_state``, ``force``: evict pods that block a drain).
    ``nodepools`` receives it (:mod:`nodepools.host_moves`); the host's ``drain_target`` stays
    set until it is empty, so a lost signal only waits for the periodic resync. Once none of
    its GPUs is held the host enters ``target_state`` by itself.
"""

from __future__ import annotations

from django.dispatch import Signal

gpu_health_changed = Signal()
gpu_facts_changed = Signal()
host_state_changed = Signal()
host_drain_requested = Signal()
