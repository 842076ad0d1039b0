"""A node pool's driver change and the other nodes on its hosts: the upgrade side of the rule
in :mod:`fleet.host_driver` (the driver is the host's, one for every node on it).

A node upgrade installs the pool's driver on each node's host, which reloads it under every
GPU of the host. Where another pool's node shares the host (a node of a few GPUs beside it on a
dedicated host, VM nodes of other tenants on a shared host), that node's driver would change
without a drain, and its own pool's pin (if any) would silently break. So a driver change is
refused while it would do that (:func:`refuse_driver_conflicts`, called when the upgrade is
asked for), and a rollout pauses on a node whose host gained such a neighbour after the
upgrade was accepted (:func:`driver_conflicts`, called before each install).

Refused rather than moved: moving the other pools' nodes first would disrupt pools whose
owners did not ask for anything (and may be other tenants), and moving this pool's nodes is a
replacement the tenant can ask for (scale), not an in-place upgrade. GKE and EKS never meet
the case: a node is a whole VM or machine there, so its driver is its own.

:func:`node_pins` tells placement what driver each node holding GPUs pins
(:data:`fleet.host_driver.HOLDER_PINS`, registered by the app config).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleet.host_driver import changes_driver
from nvke.errors import Conflict

from .models import Node, NodePool

#: what a pool's ``driver_version`` means, in the API's help, the portal's forms and the
#: docs (nvkectl, a separate package, says the same in its own words)
DRIVER_PIN_HELP = (
    "driver branch (R580) or release (580.95.05) to pin; blank: no pin, each node runs the "
    "driver its host already has (nodes[].driver_version). The driver is the host's, one for "
    "all its nodes: a pinned node goes only to a host that runs that driver or that no other "
    "node uses"
)
#: the upgrade's ``driver_version``
DRIVER_UPGRADE_HELP = (
    "driver branch (R580) or release (580.95.05); blank or absent keeps the pool's. Refused "
    "(409 host_driver_shared) while a node of this pool shares its host with a node of "
    "another pool whose driver it would change"
)


def node_pins(holder_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
    """``{node id: the driver it pins}`` ("" none) for the nodes among ``holder_ids``: the
    version the node booted with or was upgraded to (``Node.driver_version``, its pool's pin
    then). Placement reads it across tenants, as it reads GPUs."""
    return dict(Node.objects.filter(pk__in=list(holder_ids)).values_list("pk", "driver_version"))


@dataclass
class HostConflict:
    """A host where installing a pool's driver would change it under other pools' nodes.

    ``hostname`` and its reported ``driver_version``; ``nodes``: the other pools' nodes of the
    pool's own tenant, ``[{"name", "pool"}]`` by name; ``other_tenants``: how many nodes of
    other tenants (never named: they are not this tenant's to see)."""

    hostname: str
    driver_version: str
    nodes: list[dict[str, str]] = field(default_factory=list)
    other_tenants: int = 0

    def words(self) -> str:
        """``host h1 (driver 570.172.08) also runs node c1-ex4-1a2b3c of pool ex4 and 1
        node(s) of other tenants``."""
        parts = [f"node {n['name']} of pool {n['pool']}" for n in self.nodes]
        if self.other_tenants:
            parts.append(f"{self.other_tenants} node(s) of other tenants")
        driver = self.driver_version or "none reported"
        return f"host {self.hostname} (driver {driver}) also runs {_join(parts)}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.hostname,
            "driver_version": self.driver_version,
            "nodes": self.nodes,
            "other_tenants_nodes": self.other_tenants,
        }


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def driver_conflicts(
    pool: NodePool, driver: str, nodes: Iterable[Node] | None = None
) -> list[HostConflict]:
    """The hosts of ``pool``'s live nodes (or of ``nodes``) where installing ``driver``
    (a pin; "" installs nothing) changes the reported driver while a live node of another
    pool runs there, by hostname. Reads every tenant's nodes on those hosts (one fact of the
    fleet, like placement); only counts of other tenants' leave this function."""
    mine = list(
        nodes
        if nodes is not None
        else pool.nodes.live().filter(host__isnull=False).select_related("host")
    )
    hosts = {
        n.host_id: n.host
        for n in mine
        if n.host_id is not None and changes_driver(driver, n.host.driver_version)
    }
    if not hosts:
        return []
    others = (
        Node.objects.live()
        .filter(host_id__in=list(hosts))
        .exclude(nodepool_id=pool.id)
        .select_related("nodepool")
        .order_by("name")
    )
    found: dict[uuid.UUID, HostConflict] = {}
    for other in others:
        host = hosts[other.host_id]
        entry = found.setdefault(host.id, HostConflict(host.hostname, host.driver_version))
        if other.tenant_id == pool.tenant_id:
            entry.nodes.append({"name": other.name, "pool": other.nodepool.name})
        else:
            entry.other_tenants += 1
    return sorted(found.values(), key=lambda c: c.hostname)


def conflict_words(driver: str, conflicts: list[HostConflict]) -> str:
    """The sentence a refusal and a paused rollout say (``driver`` the target pin)."""
    hosts = "; ".join(c.words() for c in conflicts)
    return (
        f"installing driver {driver} would change the driver under other pools' nodes without "
        f"draining them: {hosts}. A host's driver is one for all its nodes; move those nodes "
        "off the host (or this pool's nodes) first"
    )


def refuse_driver_conflicts(pool: NodePool, driver: str) -> None:
    """Raise Conflict ``host_driver_shared`` (409, field ``driver_version``, ``hosts``: each
    :meth:`HostConflict.as_dict`) when installing ``driver`` on ``pool``'s nodes' hosts would
    change another pool's node's driver."""
    conflicts = driver_conflicts(pool, driver)
    if conflicts:
        raise Conflict(
            conflict_words(driver, conflicts),
            code="host_driver_shared",
            field="driver_version",
            extra={"hosts": [c.as_dict() for c in conflicts]},
        )
