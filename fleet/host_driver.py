"""A host's NVIDIA driver is one fact for every node on it; who may change it.

The driver is the host's: its agent reports one version (``fleet.Host.driver_version``), and
installing a driver reloads it under every GPU of the host. Several nodes can run on one host
(nodes of a few GPUs on a dedicated host, VM nodes of several tenants on a shared host), so a
driver installed for one node changes it under all of them. A node's driver is its pool's pin
(``Node.driver_version``, "" for a pool without one: the node then runs whatever driver its
host has).

The rule, one for every place that decides an install (as on GKE and EKS, where a node is a
whole VM or machine and its driver changes only through its own pool's drained rollout, never
as a side effect of another pool's):

* **placement** (:mod:`fleet.placement`, :mod:`fleet.shared_hosts`, :func:`may_place`): a node
  whose pool pins a driver goes onto a host that already reports a matching driver, or onto a
  host that holds no other node (its first boot installs the pin and changes nobody's driver);
  nodes pinning the same driver may join such a host before the install. A node without a pin
  accepts the host's driver, but not a host where an install is still pending (a pinned node
  placed there has not booted yet: it would change the driver under it).
* **upgrades** (:mod:`nodepools.host_drivers`): a node pool upgrade that changes the driver is
  refused while one of its nodes shares its host with a node of another pool, and a rollout
  pauses if such a node arrived after the upgrade was accepted.

The pins of the nodes holding a host's GPUs come from the app that owns nodes, through
:data:`HOLDER_PINS` (fleet knows holders only by id).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence

from catalog.services import driver_matches, parse_driver_version

#: called as ``hook(holder_ids) -> {holder_id: pin}``: the driver each holder (a node) pins
#: ("" none); ``nodepools`` registers it. A holder no hook names counts as pinning nothing.
HOLDER_PINS: list[Callable[[Iterable[uuid.UUID]], dict[uuid.UUID, str]]] = []


def holder_pins(holder_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
    """``{holder_id: pin}`` by the :data:`HOLDER_PINS` hooks, for the holders they know."""
    ids = list(dict.fromkeys(holder_ids))
    out: dict[uuid.UUID, str] = {}
    if not ids:
        return out
    for hook in HOLDER_PINS:
        out.update(hook(ids))
    return out


def changes_driver(pin: str, reported: str) -> bool:
    """Whether installing ``pin`` (``R580``, ``580.95.05``; "" installs nothing) changes the
    driver of a host that reports ``reported`` (``570.172.08``; "" when never reported)."""
    return bool(pin) and not driver_matches(pin, reported)


def may_place(pin: str, reported: str, held_pins: Sequence[str]) -> bool:
    """Whether a node pinning ``pin`` ("" none) may go onto a host that reports driver
    ``reported`` and holds nodes pinning ``held_pins`` (one entry per node, or per GPU or GPU
    instance it holds; empty when the host holds none), changing nobody's driver (module
    docstring)."""
    if not held_pins:
        return True
    pending = [p for p in held_pins if changes_driver(p, reported)]
    if not pin:
        return not pending
    if not pending:
        return not changes_driver(pin, reported)
    # an install is pending there: only nodes pinning exactly that driver join it
    return all(p and driver_matches(pin, p) and driver_matches(p, pin) for p in held_pins)


def branch_of(pin: str) -> str | None:
    """The driver branch of a pin as the first field of a reported version (``"580"`` for
    ``R580`` or ``580.95.05``), for a database pre-filter; None for "" (no pin) or a pin that
    does not parse (validation refused those before)."""
    if not pin:
        return None
    try:
        return str(parse_driver_version(pin).branch)
    except ValueError:
        return None
