"""Defragmentation planner: node moves ("replace node X on host A with one on host B") that
free whole hosts and whole NVLink islands, with what they free and whom they disrupt.

Plain functions over :class:`fleet.placement.HostView` snapshots (no query per host), so a
10,000-host fleet is planned in memory (``tests/bench/test_bench_defrag.py``). Execution is
not here: ``nodepools/defrag.py`` runs a plan through the host-drain machinery.

**Rules** (the placement rules of :mod:`fleet.placement`, applied to a node that already runs):

* a node moves only inside its GPU model and zone (so a zone-spread pool stays spread), onto a
  schedulable host (``AVAILABLE``/``ALLOCATED``; never CORDONED, MAINTENANCE, NOT_READY,
  FAILED or RETIRED — :class:`~fleet.placement.Planner` skips unschedulable hosts), onto
  usable GPUs (healthy, scrubbed, reported);
* tenancy: onto a host of the same tenant, or a shared host when the node's isolation allows
  hardware-isolated sharing; never onto a host another tenant holds (dedicated hosts);
* NVLink: the new GPU set lies inside one island (a move never makes a node NVLink-split);
* never onto a wholly free host (that would just move the fragment); a host that receives a
  node is never emptied later in the same plan (no node moves twice) and a host the plan
  frees receives nothing;
* ``pinned`` holders (nodes not READY, already moving, in an upgrade …: the caller knows) do
  not move, and a host or island holding one is not emptied.

**Order** (steps, each freeing one thing; the moves of a step run one after another):

1. *hosts*: per model and zone, partly used hosts ordered by GPUs held (fewest first, then
   hostname) are emptied when every node on them finds a place; the largest nodes are placed
   first; a host whose nodes do not all fit is left as it was.
2. *islands*: on hosts of several NVLink islands (H100 NVL, A100 PCIe pairs …) not freed in
   step 1, an island that is partly used has its nodes moved into partly used islands (of this
   host or another) so it becomes wholly free; the target island must already hold GPUs.

**Disruption** is counted in GPU-hours: ``gpus of the moved node x move_hours``, the expected
time from the replacement being asked for until the old node is released (its workloads are
rescheduled onto the replacement within it; the platform default is
``NVKE_DEFRAG_MOVE_MINUTES``, 15 minutes). It measures how much tenant capacity a move touches,
not a charge: the tenant is billed by the ledger as always (DESIGN §6).

**What it frees** is measured before and after on the same snapshots: whole hosts free, whole
multi-GPU NVLink islands free, free GPUs and, per common shape (8, 4, 2, 1 GPUs as
:mod:`fleet.fragmentation` uses them), the stranded GPUs (free GPUs no node of that shape can
use, inside islands, ignoring tenancy).

**Not here yet**: nodes hold whole GPUs in this placement model, so a move frees whole GPUs by
moving whole-GPU nodes; consolidating MIG GPU instances of GPUs shared across tenants (to free whole
GPUs of shared hosts) needs the shared-host slice map and is not planned by this module.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .placement import GpuRequest, HostView, Placement, Planner

SHAPES = (8, 4, 2, 1)
HOST, ISLAND = "host", "island"


@dataclass(frozen=True)
class Move:
    """Replace node ``holder_id`` (``gpus`` GPUs on ``from_host``) with one on ``to_host`` at
    ``to_gpu_indexes``. ``gpu_hours``: the disruption (module docstring)."""

    holder_id: uuid.UUID
    tenant_id: uuid.UUID
    group_id: uuid.UUID | None
    gpus: int
    from_host_id: uuid.UUID
    from_host: str
    from_gpu_indexes: tuple[int, ...]
    to_host_id: uuid.UUID
    to_host: str
    to_gpu_indexes: tuple[int, ...]
    gpu_hours: float
    shares_host: bool = False


@dataclass(frozen=True)
class Step:
    """One thing freed: a whole host (``kind`` HOST) or one NVLink island of a host (ISLAND,
    ``island`` its number and ``island_gpus`` its GPU indexes), by ``moves`` in order."""

    kind: str
    host_id: uuid.UUID
    hostname: str
    gpu_model: str
    zone: str
    moves: tuple[Move, ...]
    island: int | None = None
    island_gpus: tuple[int, ...] = ()

    @property
    def gpu_hours(self) -> float:
        return sum(m.gpu_hours for m in self.moves)


@dataclass
class Totals:
    """Fleet figures of one snapshot (see :func:`totals`)."""

    hosts: int = 0
    whole_hosts_free: int = 0
    islands_free: int = 0
    free_gpus: int = 0
    stranded_gpus: dict[int, int] = field(default_factory=dict)


@dataclass
class Plan:
    """A defragmentation plan: ``steps`` in order and what they change (``before``/``after``)."""

    steps: list[Step]
    before: Totals
    after: Totals
    move_hours: float

    @property
    def moves(self) -> list[Move]:
        return [m for s in self.steps for m in s.moves]

    @property
    def hosts_freed(self) -> list[str]:
        return [s.hostname for s in self.steps if s.kind == HOST]

    @property
    def islands_freed(self) -> list[tuple[str, int]]:
        return [(s.hostname, s.island) for s in self.steps if s.kind == ISLAND]  # type: ignore[misc]

    @property
    def gpu_hours(self) -> float:
        return sum(s.gpu_hours for s in self.steps)

    def disrupted(self) -> dict[uuid.UUID, dict[str, float]]:
        """``{tenant id: {"nodes": n, "gpus": n, "gpu_hours": h}}`` over all moves."""
        out: dict[uuid.UUID, dict[str, float]] = defaultdict(
            lambda: {"nodes": 0, "gpus": 0, "gpu_hours": 0.0}
        )
        for m in self.moves:
            entry = out[m.tenant_id]
            entry["nodes"] += 1
            entry["gpus"] += m.gpus
            entry["gpu_hours"] += m.gpu_hours
        return dict(out)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready shape (UUIDs as strings, tuples as lists)."""

        def clean(value: Any) -> Any:
            if isinstance(value, uuid.UUID):
                return str(value)
            if isinstance(value, dict):
                return {str(k): clean(v) for k, v in value.items()}
            if isinstance(value, list | tuple):
                return [clean(v) for v in value]
            return value

        return clean(
            {
                "move_hours": self.move_hours,
                "steps": [{**asdict(s), "gpu_hours": s.gpu_hours} for s in self.steps],
                "hosts_freed": self.hosts_freed,
                "islands_freed": [list(i) for i in self.islands_freed],
                "gpus_moved": sum(m.gpus for m in self.moves),
                "gpu_hours": self.gpu_hours,
                "before": asdict(self.before),
                "after": asdict(self.after),
                "disrupted": self.disrupted(),
            }
        )


# --- what a snapshot holds ------------------------------------------------------------------------


def _held(view: HostView) -> int:
    return sum(1 for g in view.gpus if g.holder is not None)


def _islands(view: HostView) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for g in view.gpus:
        out[g.island].append(g.index)
    return out


def _shape_nodes(view: HostView, k: int) -> int:
    if k == view.gpu_count:
        return 1 if view.free == view.gpu_count else 0
    return sum(len(free) // k for free in view.free_by_island.values())


def totals(views: Iterable[HostView]) -> Totals:
    """Whole hosts free, wholly free NVLink islands of 2 GPUs or more on hosts of several
    islands, free GPUs, and stranded GPUs per shape (``free - k * nodes of k``, shapes no
    larger than the model's biggest host; summed over models and zones, as
    :func:`fleet.fragmentation.summarise` counts them per group)."""
    out = Totals()
    groups: dict[tuple[str, str], list[HostView]] = defaultdict(list)
    for v in views:
        if not v.schedulable:
            continue
        groups[(v.gpu_model, v.zone)].append(v)
    stranded: dict[int, int] = dict.fromkeys(SHAPES, 0)
    for hosts in groups.values():
        free = sum(v.free for v in hosts)
        largest = max(v.gpu_count for v in hosts)
        out.hosts += len(hosts)
        out.free_gpus += free
        for v in hosts:
            if v.free == v.gpu_count:
                out.whole_hosts_free += 1
            islands = _islands(v)
            if len(islands) > 1:
                out.islands_free += sum(
                    1
                    for number, members in islands.items()
                    if len(members) > 1 and len(v.free_by_island.get(number, ())) == len(members)
                )
        for k in SHAPES:
            if k <= largest:
                stranded[k] += free - k * sum(_shape_nodes(v, k) for v in hosts)
    out.stranded_gpus = stranded
    return out


# --- the planner ----------------------------------------------------------------------------------


def _copy(view: HostView) -> HostView:
    return HostView(
        id=view.id,
        hostname=view.hostname,
        zone=view.zone,
        region=view.region,
        gpu_model=view.gpu_model,
        gpus=[replace(g) for g in view.gpus],
        schedulable=view.schedulable,
        driver_version=view.driver_version,
    )


def _nodes_on(view: HostView, indexes: Collection[int] | None = None) -> dict[uuid.UUID, dict]:
    """``{holder: {"tenant", "shares", "group", "pin", "indexes"}}`` of the nodes on ``view`` (only
    GPUs in ``indexes`` when given; a node with GPUs outside them is reported with
    ``"outside": True``)."""
    nodes: dict[uuid.UUID, dict] = {}
    for g in view.gpus:
        if g.holder is None:
            continue
        entry = nodes.setdefault(
            g.holder,
            {
                "tenant": g.tenant,
                "shares": g.shares,
                "group": g.group,
                "pin": g.pin,
                "indexes": [],
                "out": 0,
            },
        )
        if indexes is None or g.index in indexes:
            entry["indexes"].append(g.index)
        else:
            entry["out"] += 1
    if indexes is not None:
        nodes = {h: n for h, n in nodes.items() if n["indexes"]}
    return nodes


class _Group:
    """The planning state of one (model, zone)."""

    def __init__(
        self,
        hosts: list[HostView],
        pinned: Collection[uuid.UUID],
        move_hours: float,
        budget: list[int],
    ) -> None:
        self.budget = budget  # steps left, shared by every group of one plan
        self.hosts = {h.id: h for h in hosts}
        self.planner = Planner(hosts)
        self.pinned = pinned
        self.move_hours = move_hours
        self.received: set[uuid.UUID] = set()  # hosts that got a node: never emptied later
        self.freed: set[uuid.UUID] = set()  # hosts the plan frees: never targets
        self.moved: set[uuid.UUID] = set()  # holders moved once: they stay where they went

    def _request(self, holder: uuid.UUID, node: dict, host: HostView) -> GpuRequest:
        return GpuRequest(
            holder_id=holder,
            tenant_id=node["tenant"],
            gpu_model=host.gpu_model,
            gpus=len(node["indexes"]),
            region=host.zone,
            zone=host.zone,
            group_id=node["group"],
            shares_host=node["shares"],
            driver_version=node["pin"],  # the driver rule (fleet.host_driver) holds for moves
        )

    def _place(
        self, nodes: dict[uuid.UUID, dict], source: HostView, avoid_island: int | None = None
    ) -> list[tuple[uuid.UUID, dict, Placement]] | None:
        """Place ``nodes`` (largest first) on partly used islands/hosts; None (and nothing
        changed) when one does not fit."""
        placed: list[tuple[uuid.UUID, dict, Placement]] = []
        for holder, node in sorted(
            nodes.items(), key=lambda item: (-len(item[1]["indexes"]), str(item[0]))
        ):
            request = self._request(holder, node, source)
            found = self.planner.find(request, allow_split=False, use_free_hosts=False)
            ok = found is not None
            if found is not None and avoid_island is not None:
                target, indexes, _split = found
                island = {g.index: g.island for g in target.gpus}[indexes[0]]
                members = [g for g in target.gpus if g.island == island]
                ok = any(g.holder is not None for g in members)  # not into a wholly free island
            if not ok or found is None:
                for _h, _n, placement in reversed(placed):
                    self.planner.unplace(placement)
                return None
            target, indexes, _split = found
            placed.append((holder, node, self.planner._apply(request, target, indexes, False)))
        return placed

    def _moves(self, source: HostView, placed: list[tuple[uuid.UUID, dict, Placement]]):
        self.budget[0] -= 1
        self.moved.update(holder for holder, _n, _p in placed)
        return tuple(
            Move(
                holder_id=holder,
                tenant_id=node["tenant"],
                group_id=node["group"],
                gpus=len(placement.gpu_indexes),
                from_host_id=source.id,
                from_host=source.hostname,
                from_gpu_indexes=tuple(node["indexes"]),
                to_host_id=placement.host_id,
                to_host=placement.hostname,
                to_gpu_indexes=tuple(placement.gpu_indexes),
                gpu_hours=len(placement.gpu_indexes) * self.move_hours,
                shares_host=node["shares"],
            )
            for holder, node, placement in placed
        )

    def free_hosts(self) -> list[Step]:
        steps: list[Step] = []
        sources = [h for h in self.hosts.values() if h.schedulable and h.free > 0 and _held(h) > 0]
        sources.sort(key=lambda h: (_held(h), h.hostname))
        for host in sources:
            if self.budget[0] <= 0:
                break
            if host.id in self.received:
                continue
            nodes = _nodes_on(host)
            if any(h in self.pinned for h in nodes):
                continue
            self.planner.remove(host.id)
            placed = self._place(nodes, host)
            if placed is None:
                self.planner.add(host)
                continue
            for g in host.gpus:  # the plan keeps it free: out of the planner for good
                g.holder = g.tenant = g.group = None
                g.shares = False
            host.refresh()
            self.freed.add(host.id)
            self.received.update(p.host_id for _h, _n, p in placed)
            steps.append(
                Step(
                    HOST,
                    host.id,
                    host.hostname,
                    host.gpu_model,
                    host.zone,
                    self._moves(host, placed),
                )
            )
        return steps

    def free_islands(self) -> list[Step]:
        steps: list[Step] = []
        hosts = sorted(
            (
                h
                for h in self.hosts.values()
                if h.schedulable and h.id not in self.freed and len(_islands(h)) > 1
            ),
            key=lambda h: h.hostname,
        )
        for host in hosts:
            for number, members in sorted(_islands(host).items()):
                if self.budget[0] <= 0:
                    return steps
                if len(members) < 2:
                    continue
                member_set = set(members)
                nodes = _nodes_on(host, member_set)
                free_here = len(host.free_by_island.get(number, ()))
                if not nodes or free_here == 0 or free_here == len(members):
                    continue  # wholly free or wholly held: nothing to gain
                if any(h in self.pinned or h in self.moved or n["out"] for h, n in nodes.items()):
                    continue  # a pinned or already moved node, or one spanning islands, stays
                saved = {
                    g.index: (g.holder, g.tenant, g.shares, g.group, g.usable) for g in host.gpus
                }
                self.planner.remove(host.id)
                for g in host.gpus:  # the island is neither source nor target of its own nodes
                    if g.index in member_set:
                        g.holder = g.tenant = g.group = None
                        g.shares, g.usable = False, False
                host.refresh()
                self.planner.add(host)
                placed = self._place(nodes, host, avoid_island=number)
                self.planner.remove(host.id)
                for g in host.gpus:
                    if g.index in member_set:
                        holder, tenant, shares, group, usable = saved[g.index]
                        g.usable = usable
                        if placed is None:
                            g.holder, g.tenant, g.shares, g.group = holder, tenant, shares, group
                host.refresh()
                self.planner.add(host)
                if placed is None:
                    continue
                self.received.update(p.host_id for _h, _n, p in placed)
                steps.append(
                    Step(
                        ISLAND,
                        host.id,
                        host.hostname,
                        host.gpu_model,
                        host.zone,
                        self._moves(host, placed),
                        island=number,
                        island_gpus=tuple(sorted(members)),
                    )
                )
        return steps


def plan_defrag(
    views: Iterable[HostView],
    *,
    pinned: Collection[uuid.UUID] = frozenset(),
    move_hours: float = 0.25,
    islands: bool = True,
    max_steps: int | None = None,
) -> Plan:
    """Plan the moves that free whole hosts, then whole NVLink islands (module docstring).

    ``views``: snapshots of the fleet (not changed); ``pinned``: holder ids that must not move;
    ``move_hours``: the expected time of one move (h), for the disruption in GPU-hours;
    ``islands=False`` plans whole hosts only; ``max_steps`` keeps the first steps (host steps
    come first; the figures ``after`` are those of the kept steps). Deterministic for the same
    input.
    """
    originals = list(views)
    copies = [_copy(v) for v in originals]
    groups: dict[tuple[str, str], list[HostView]] = defaultdict(list)
    for v in copies:
        groups[(v.gpu_model, v.zone)].append(v)
    budget = [max_steps if max_steps is not None else len(copies) * 8]
    planned = [_Group(groups[key], pinned, move_hours, budget) for key in sorted(groups)]
    steps: list[Step] = []
    for group in planned:
        steps.extend(group.free_hosts())
    if islands:
        for group in planned:
            steps.extend(group.free_islands())
    return Plan(
        steps=steps,
        before=totals(originals),
        after=totals(copies),
        move_hours=move_hours,
    )


# --- the database side ----------------------------------------------------------------------------


class TargetUnavailable(Exception):
    """A planned target's GPUs are no longer free for the node (taken, unhealthy, the host
    left the schedulable states or is locked by a claim): the plan is out of date."""


def load_views(*, gpu_model: str | None = None, zone: str | None = None) -> list[HostView]:
    """Snapshots of the schedulable hosts (optionally of one model / zone), two queries.

    Unschedulable hosts are left out: they are neither sources (a drain moves their nodes)
    nor targets.
    """
    from .choices import SCHEDULABLE_HOST_STATES
    from .models import Host
    from .placement import _views_for_hosts

    hosts = Host.objects.filter(state__in=SCHEDULABLE_HOST_STATES)
    if gpu_model:
        hosts = hosts.filter(gpu_model_id=gpu_model)
    if zone:
        hosts = hosts.filter(zone=zone)
    return _views_for_hosts(hosts.values_list("pk", flat=True))


def claim_exact(
    *,
    holder_id: uuid.UUID,
    tenant_id: uuid.UUID,
    host_id: uuid.UUID,
    gpu_indexes: tuple[int, ...],
    shares_host: bool = False,
    group_id: uuid.UUID | None = None,
    driver_version: str = "",
) -> Placement:
    """Claim the GPUs ``gpu_indexes`` of ``host_id`` for ``holder_id`` (a move's target).

    Must run inside ``transaction.atomic()``. The host row is locked as placement locks it
    (``FOR NO KEY UPDATE SKIP LOCKED``: a claim in flight there makes this fail rather than
    wait), then the GPUs are checked under the lock (free, usable, the tenancy rule) and
    claimed with placement's guarded UPDATE. ``driver_version``: the driver the node's pool
    pins; the host must take it (:mod:`fleet.host_driver`). Raises :class:`TargetUnavailable`.
    """
    from django.db import transaction

    from .choices import SCHEDULABLE_HOST_STATES
    from .models import Host
    from .placement import _still_fits, _views_for_hosts, _write

    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("claim_exact must run inside transaction.atomic()")
    locked = (
        Host.objects.select_for_update(skip_locked=True, no_key=True)
        .filter(pk=host_id, state__in=SCHEDULABLE_HOST_STATES)
        .values_list("hostname", "zone")
        .first()
    )
    if locked is None:
        raise TargetUnavailable("the target host is not schedulable or is being claimed on")
    hostname, zone = locked
    fresh = {v.id: v for v in _views_for_hosts([host_id])}
    slots = {g.index: g for g in fresh[host_id].gpus} if host_id in fresh else {}
    request = GpuRequest(
        holder_id=holder_id,
        tenant_id=tenant_id,
        gpu_model=fresh[host_id].gpu_model if host_id in fresh else "",
        gpus=len(gpu_indexes),
        region=zone,
        zone=zone,
        group_id=group_id,
        shares_host=shares_host,
        driver_version=driver_version,
    )
    placement = Placement(
        holder_id,
        host_id,
        hostname,
        zone,
        tuple(slots[i].uuid for i in gpu_indexes if i in slots),
        tuple(gpu_indexes),
    )
    if len(placement.gpu_uuids) != len(gpu_indexes) or not _still_fits(
        placement, fresh, {holder_id: request}
    ):
        raise TargetUnavailable(
            f"GPUs {list(gpu_indexes)} of {hostname} are no longer free for this node"
        )
    _write([placement], {holder_id: request})
    return placement
