"""Placement: hand free GPUs of physical hosts to nodes, all-or-nothing (DESIGN §4).

Rules, in the order they decide:

1. **Eligible GPUs**: the host has the requested GPU model, is in the requested region (and
   zone, when one is asked for) and in a schedulable state (``AVAILABLE``/``ALLOCATED``) and
   dedicated (a shared host's GPUs go out as MIG instances: :mod:`fleet.shared_hosts`); the
   GPU is free, healthy, scrubbed (``scrub_state`` CLEAN) and listed by the agent.
2. **Tenancy**: a host is dedicated to one tenant while that tenant holds any of its GPUs. Two
   tenants may share a host only when *both* holders' isolation allows hardware-isolated
   sharing (``GpuRequest.shares_host``, e.g. MIG or vGPU pools).
3. **NVLink**: a multi-GPU node gets a GPU set inside one NVLink island of its host (GPUs joined
   by NVLink or one NVSwitch, :mod:`fleet.topology`). Only when no host can give one does the
   node get a set spanning islands (``Placement.nvlink_split``), so capacity is never refused
   for topology alone. Hosts with unknown topology count as one island.
4. **Zones**: with ``spread_zones`` the node goes to the eligible zone holding the fewest nodes
   of its group (node pool) so far; otherwise zones do not matter.
5. **Best fit**: among the hosts left, the one whose free GPU count is smallest (so partly used
   hosts fill up and whole hosts stay free for full-host nodes); then the island that fits most
   tightly; then the hostname. On the host the lowest free GPU indexes of the island are taken.
   A full-host node (as many GPUs as the host has) therefore lands only on a wholly free host.
6. **Driver** (:mod:`fleet.host_driver`): the driver is the host's, one for all its nodes. A
   node whose pool pins a driver (``GpuRequest.driver_version``) goes onto a host that reports
   a matching driver, or one that holds no other node (its boot installs the pin there); a node
   without a pin takes the host's driver, anywhere no install is pending. A host this rule
   leaves out is passed over like one of another tenant.

:class:`Planner` does this in memory over :class:`HostView` snapshots, so a batch of 1,000
requests on 10,000 hosts is planned without a query per request (``tests/bench``);
:func:`naive_first_fit` is the baseline it is measured against. :func:`claim_gpus` loads the
candidate hosts from PostgreSQL, plans the whole batch, locks the chosen hosts
(``SELECT … FOR NO KEY UPDATE SKIP LOCKED``; a host locked by someone else is left out and the
batch re-planned), checks the GPUs again under the lock and claims them with guarded UPDATEs.
It must run inside the caller's transaction: when a request cannot be placed the caller's
rollback leaves nothing held — GPUs held by others are never touched, since every write is
guarded by ``holder_id IS NULL``.

**Contention is not capacity.** A claimant holds its hosts' locks until its transaction ends,
which includes the provider call (seconds on a real infrastructure API), and every claimant
plans the same best-fit order, so concurrent claims meet on the same hosts. Skipping a locked
host and re-planning moves a claimant to the next-best host; when the loaded candidates run
out, the next ones (hosts not yet seen) are loaded, so a claim only ends when *every* eligible
host was tried. It then raises :class:`InsufficientCapacity` only if no host was skipped for a
lock — i.e. even with every lock released the fleet (as committed) could not hold the batch;
otherwise :class:`PlacementContended`, which says "try again shortly" (the node pool reconciler
retries it with backoff until its deadline). A lock never waits (SKIP LOCKED), so claims cannot
deadlock; best fit stays deterministic without contention; under contention claimants spread
over the next-best hosts instead of failing.
"""

from __future__ import annotations

import bisect
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from django.db import connection, transaction
from django.utils import timezone

from . import host_driver
from .choices import SCHEDULABLE_HOST_STATES, HostState, HostTenancy, ScrubState
from .models import Gpu, Host, host_in_region, region_of_zone

#: tenancy key of hosts nobody holds a GPU of
FREE = "free"
#: tenancy key of hosts whose holders all allow hardware-isolated sharing
SHARED = "shared"
#: safety bound on plan/lock rounds of one claim (each round skips a locked host, refreshes a
#: changed one, or loads more candidates, so a claim ends long before; past it: contended)
MAX_ROUNDS = 64
#: called as ``hook(requests, placements)`` after a claim's GPUs are written, inside its
#: transaction; raising InsufficientCapacity / PlacementContended rolls the claim back.
#: Apps above fleet register here (``reservations`` keeps on-demand claims off reserved GPUs).
CLAIM_HOOKS: list = []
#: called as ``fence(gpu_model, region, reservation_id) -> set[(cluster_uuid, clique_id)]``:
#: multi-node NVLink domains whose hosts a claim (of that reservation; None: on-demand) may not
#: use. ``reservations`` fences the domains reserved as a whole (reservations/fences.py).
DOMAIN_FENCES: list = []


def fenced_domains(
    gpu_model: str, region: str, reservation_id: uuid.UUID | None
) -> set[tuple[uuid.UUID, int]]:
    """The union of what the :data:`DOMAIN_FENCES` say for one kind of claim."""
    out: set[tuple[uuid.UUID, int]] = set()
    for fence in DOMAIN_FENCES:
        out |= set(fence(gpu_model, region, reservation_id))
    return out


@dataclass(frozen=True)
class GpuRequest:
    """``gpus`` whole GPUs of ``gpu_model`` (catalog slug) in ``region`` for one node.

    ``zone`` pins the node to one zone; ``group_id`` (the node pool) with ``spread_zones``
    spreads a group over zones; ``shares_host`` says the pool's isolation allows sharing the
    host with other tenants (hardware isolation: MIG, vGPU). ``nvlink_domain`` (fabric
    cluster UUID, clique id) limits the candidates to the hosts of one multi-node NVLink
    domain (:mod:`fleet.nvlink_domains` chooses it).
    """

    holder_id: uuid.UUID
    tenant_id: uuid.UUID
    gpu_model: str
    gpus: int
    region: str
    zone: str | None = None
    group_id: uuid.UUID | None = None
    spread_zones: bool = False
    shares_host: bool = False
    nvlink_domain: tuple[uuid.UUID, int] | None = None
    #: draws from this capacity reservation (opaque here: see :data:`CLAIM_HOOKS`)
    reservation_id: uuid.UUID | None = None
    #: the driver the node's pool pins (``R580``, ``580.95.05``; "" none: the node runs its
    #: host's): rule 6, :mod:`fleet.host_driver`
    driver_version: str = ""


@dataclass(frozen=True)
class Placement:
    """Where a request landed: the host and the GPU UUIDs (by GPU index)."""

    holder_id: uuid.UUID
    host_id: uuid.UUID
    hostname: str
    zone: str
    gpu_uuids: tuple[str, ...]
    gpu_indexes: tuple[int, ...] = ()
    nvlink_split: bool = False


class InsufficientCapacity(Exception):
    """No schedulable host can take a request (nothing was claimed by the caller's batch)."""

    def __init__(self, request: GpuRequest, placed: int, total: int) -> None:
        self.request = request
        self.placed = placed
        self.total = total
        where = f"zone {request.zone!r}" if request.zone else f"region {request.region!r}"
        super().__init__(
            f"no free host with {request.gpus} x {request.gpu_model} GPU(s) in {where} "
            f"({placed} of {total} node(s) could be placed)"
        )


class PlacementContended(Exception):
    """The batch did not fit on the hosts free of other claimants' locks, but would fit if
    those locks were released (their transactions may free or take the GPUs): retry shortly.
    Nothing was claimed by the caller's batch."""

    def __init__(self, request: GpuRequest, locked_hosts: int) -> None:
        self.request = request
        self.locked_hosts = locked_hosts
        super().__init__(
            f"{request.gpus} x {request.gpu_model} GPU(s): every fitting host is being claimed "
            f"by another request right now ({locked_hosts} host(s) locked); retrying"
        )


class PlacementScrubbing(PlacementContended):
    """The batch does not fit now, but free GPUs of the model are being scrubbed after their
    last release (``scrub_state`` PENDING until the agent's report confirms the scrub): they
    come back within an agent interval or two, so this is not a lack of capacity. Retryable
    like contention (the caller backs off until ``NVKE_PROVIDER_RETRY_DEADLINE_S``)."""

    def __init__(self, request: GpuRequest, scrubbing: int) -> None:
        self.request = request
        self.locked_hosts = 0
        self.scrubbing = scrubbing
        Exception.__init__(
            self,
            f"{request.gpus} x {request.gpu_model} GPU(s): {scrubbing} free GPU(s) of the model "
            "are being scrubbed after their last release (waiting for the agent's report); "
            "retrying",
        )


def scrubbing_gpus(request: GpuRequest) -> int:
    """:func:`scrubbing_count` of ``request``'s model in its region (zone)."""
    return scrubbing_count(request.gpu_model, request.region, request.zone)


def scrubbing_count(gpu_model: str, region: str, zone: str | None = None) -> int:
    """Free, healthy, listed GPUs of ``gpu_model`` in ``region`` (``zone``) on schedulable
    dedicated hosts whose scrub is not confirmed yet (``scrub_state`` PENDING): not placeable
    now (:mod:`fleet.placeable`), free once the agent reports the scrub. One count for the
    placement's retry (:class:`PlacementScrubbing`) and the dry run's free GPUs."""
    return _scrubbing_q(gpu_model, region, zone).count()


def _scrubbing_q(gpu_model: str, region: str, zone: str | None):
    hosts = Host.objects.filter(
        Host.in_region_q(region),
        gpu_model_id=gpu_model,
        state__in=SCHEDULABLE_HOST_STATES,
        tenancy=HostTenancy.DEDICATED,
    )
    if zone:
        hosts = hosts.filter(zone=zone)
    return Gpu.objects.filter(
        host__in=hosts,
        holder_id__isnull=True,
        health="HEALTHY",
        scrub_state=ScrubState.PENDING,
        missing_since__isnull=True,
    )


# --- the in-memory model ------------------------------------------------------------------------


@dataclass
class GpuSlot:
    """One GPU of a :class:`HostView`. ``holder`` is None when free."""

    index: int
    uuid: str
    island: int
    usable: bool  # healthy, scrubbed, reported: may be handed out when free
    holder: uuid.UUID | None = None
    tenant: uuid.UUID | None = None
    shares: bool = False
    group: uuid.UUID | None = None
    #: the driver its holder pins ("" none; :data:`fleet.host_driver.HOLDER_PINS`)
    pin: str = ""


@dataclass
class HostView:
    """A host as placement sees it (a snapshot; the planner updates it as it places)."""

    id: uuid.UUID
    hostname: str
    zone: str
    region: str
    gpu_model: str
    gpus: list[GpuSlot]
    schedulable: bool = True
    #: the driver the host's agent last reported ("" never)
    driver_version: str = ""

    # derived
    free_by_island: dict[int, list[int]] = field(default_factory=dict)
    free: int = 0

    def __post_init__(self) -> None:
        self.gpus.sort(key=lambda g: g.index)
        self.refresh()

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def free_gpus(self) -> list[GpuSlot]:
        """The GPUs held by nobody and usable (those :attr:`free` counts), by index."""
        return [g for g in self.gpus if g.holder is None and g.usable]

    def refresh(self) -> None:
        """Recompute the free GPU sets after a change."""
        by_island: dict[int, list[int]] = defaultdict(list)
        for g in self.free_gpus():
            by_island[g.island].append(g.index)
        self.free_by_island = dict(by_island)
        self.free = sum(len(v) for v in by_island.values())

    def tenancy(self) -> str | uuid.UUID:
        """FREE (nothing held), SHARED (every holder allows sharing, or holders of several
        tenants), or the one tenant that holds GPUs here without sharing."""
        held = [g for g in self.gpus if g.holder is not None]
        if not held:
            return FREE
        tenants = {g.tenant for g in held}
        if all(g.shares for g in held) or len(tenants) > 1:
            return SHARED
        return next(iter(tenants))  # type: ignore[return-value]

    def admits(self, tenant: uuid.UUID, shares: bool) -> bool:
        """Whether ``tenant`` may get GPUs here under the tenancy rule."""
        for g in self.gpus:
            if g.holder is None or g.tenant == tenant:
                continue
            if not (shares and g.shares):
                return False
        return True

    def takes_driver(self, pin: str) -> bool:
        """Whether a node pinning ``pin`` ("" none) may go here without changing the driver
        under a node already here (rule 6, :func:`fleet.host_driver.may_place`)."""
        held = [g.pin for g in self.gpus if g.holder is not None]
        return host_driver.may_place(pin, self.driver_version, held)

    def choose(self, k: int, allow_split: bool) -> tuple[tuple[int, ...], bool, int] | None:
        """The GPU indexes for a ``k``-GPU node, whether they span islands, island leftover.

        Tightest island first (fewest free GPUs left in it), lowest index on ties.
        """
        best: tuple[int, int] | None = None  # (leftover, island)
        for island, free in self.free_by_island.items():
            if len(free) >= k:
                key = (len(free) - k, min(free))
                if best is None or key < best:
                    best = key
                    chosen_island = island
        if best is not None:
            indexes = tuple(sorted(self.free_by_island[chosen_island])[:k])
            return indexes, False, best[0]
        if allow_split and self.free >= k:
            # Fill from the largest islands, so the set touches as few islands as possible.
            islands = sorted(self.free_by_island.values(), key=lambda f: (-len(f), min(f)))
            indexes_list: list[int] = []
            for free in islands:
                indexes_list.extend(sorted(free)[: k - len(indexes_list)])
                if len(indexes_list) == k:
                    break
            return tuple(sorted(indexes_list)), True, 0
        return None


# --- the planner --------------------------------------------------------------------------------


def _signature(host: HostView) -> tuple[int, ...]:
    """Free GPUs per island, largest first: hosts with one signature fit a node equally."""
    return tuple(sorted((len(f) for f in host.free_by_island.values()), reverse=True))


def _leftover(signature: tuple[int, ...], k: int, allow_split: bool) -> int | None:
    """How well a ``k``-GPU node fits: GPUs left free in the chosen island, or for a split the
    number of islands it spans (fewer is better; 0 and 1 never occur for splits); None when it
    does not fit."""
    fits = [size - k for size in signature if size >= k]
    if fits:
        return min(fits)
    if allow_split and sum(signature) >= k:
        taken = 0
        for islands, size in enumerate(signature, start=1):  # largest first, as choose() does
            taken += size
            if taken >= k:
                return islands
    return None


class Planner:
    """Best-fit, NVLink- and tenancy-aware planning over :class:`HostView` snapshots.

    Hosts are indexed by ``(model, zone, tenancy, free GPUs, island signature)`` where the
    signature is the free GPU count of each island; hosts sharing a key fit any node equally
    well, so a request looks at one host per non-empty key (the first by hostname) and the
    cost depends on the number of distinct keys, not on the fleet size.
    """

    def __init__(self, hosts: Iterable[HostView]) -> None:
        self.hosts: dict[uuid.UUID, HostView] = {}
        self._index: dict[tuple, list[tuple[str, uuid.UUID]]] = defaultdict(list)
        self._signatures: dict[tuple, set[tuple[int, ...]]] = defaultdict(set)
        self._key: dict[uuid.UUID, tuple] = {}
        self._zones: dict[str, set[tuple[str, str]]] = defaultdict(set)  # model -> (zone, region)
        self._max_free: dict[str, int] = defaultdict(int)  # model -> largest host size
        self.group_zones: dict[uuid.UUID, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.holders: dict[uuid.UUID, Placement] = {}
        for host in hosts:
            self.add(host)

    # index maintenance

    def add(self, host: HostView) -> None:
        """Add a host; the nodes already on it count towards their groups' zones."""
        self.hosts[host.id] = host
        self._zones[host.gpu_model].add((host.zone, host.region))
        self._max_free[host.gpu_model] = max(self._max_free[host.gpu_model], host.gpu_count)
        for group in {(g.group, g.holder) for g in host.gpus if g.group and g.holder}:
            self.group_zones[group[0]][host.zone] += 1
        self._reindex(host)

    def remove(self, host_id: uuid.UUID) -> None:
        """Take a host out of consideration (locked by someone else, or changed)."""
        host = self.hosts.pop(host_id, None)
        if host is not None:
            self._unindex(host)
            for group in {(g.group, g.holder) for g in host.gpus if g.group and g.holder}:
                self.group_zones[group[0]][host.zone] -= 1

    def _unindex(self, host: HostView) -> None:
        key = self._key.pop(host.id, None)
        if key is None:
            return
        bucket = self._index[key]
        item = (host.hostname, host.id)
        pos = bisect.bisect_left(bucket, item)
        if pos < len(bucket) and bucket[pos] == item:
            bucket.pop(pos)
        if not bucket:
            del self._index[key]
            self._signatures[key[:4]].discard(key[4])

    def _reindex(self, host: HostView) -> None:
        self._unindex(host)
        if not host.schedulable or host.free == 0:
            return
        key = (host.gpu_model, host.zone, host.tenancy(), host.free, _signature(host))
        bisect.insort(self._index[key], (host.hostname, host.id))
        self._signatures[key[:4]].add(key[4])
        self._key[host.id] = key

    # planning

    def zones_for(self, request: GpuRequest) -> list[str]:
        """Zones of the request's model inside its region (or just its zone)."""
        zones = self._zones.get(request.gpu_model, set())
        if request.zone:
            return [request.zone] if any(z == request.zone for z, _ in zones) else []
        region = request.region
        return sorted({z for z, r in zones if host_in_region(r, z, region)})

    def find(
        self, request: GpuRequest, *, allow_split: bool = True, use_free_hosts: bool = True
    ) -> tuple[HostView, tuple[int, ...], bool] | None:
        """Where ``request`` would go now (nothing is changed), or None.

        ``allow_split=False`` never spans NVLink islands; ``use_free_hosts=False`` only fills
        hosts that already hold GPUs (used to plan defragmenting moves).
        """
        zones = self.zones_for(request)
        if not zones:
            return None
        if request.spread_zones and request.group_id is not None:
            counts = self.group_zones.get(request.group_id, {})
            zone_groups = [
                [z for z in zones if counts.get(z, 0) == c]
                for c in sorted({counts.get(z, 0) for z in zones})
            ]
        else:
            zone_groups = [zones]
        tenancies: tuple[str | uuid.UUID, ...] = (request.tenant_id, SHARED) + (
            (FREE,) if use_free_hosts else ()
        )
        for group in zone_groups:  # an explicit spread request wins over NVLink preference
            for split in (False, True) if allow_split else (False,):
                found = self._best_in(request, group, split, tenancies)
                if found is not None:
                    return found
        return None

    def _best_in(
        self,
        request: GpuRequest,
        zones: Sequence[str],
        allow_split: bool,
        tenancies: tuple[str | uuid.UUID, ...],
    ) -> tuple[HostView, tuple[int, ...], bool] | None:
        k = request.gpus
        best: tuple[int, str, HostView] | None = None
        for free in range(k, self._max_free.get(request.gpu_model, 0) + 1):
            if not allow_split:
                best = None  # without splits, the first free level that fits is the best fit
            for zone in zones:
                for tenancy in tenancies:
                    head = (request.gpu_model, zone, tenancy, free)
                    for signature in self._signatures.get(head, ()):
                        leftover = _leftover(signature, k, allow_split)
                        if leftover is None:
                            continue
                        for hostname, host_id in self._index[(*head, signature)]:
                            if best is not None and (leftover, hostname) >= best[:2]:
                                break
                            host = self.hosts[host_id]
                            if tenancy == SHARED and not host.admits(
                                request.tenant_id, request.shares_host
                            ):
                                continue
                            if not host.takes_driver(request.driver_version):
                                continue
                            best = (leftover, hostname, host)
                            break
            if best is not None and not allow_split:
                break
        if best is None:
            return None
        choice = best[2].choose(k, allow_split)
        if choice is None:  # cannot happen: the signature said it fits
            raise AssertionError(f"index out of date for {best[1]}")
        return best[2], choice[0], choice[1]

    def place(self, request: GpuRequest) -> Placement | None:
        """Place one request and update the views; None when it cannot be placed."""
        if request.holder_id in self.holders:
            return self.holders[request.holder_id]
        found = self.find(request)
        if found is None:
            return None
        host, indexes, split = found
        return self._apply(request, host, indexes, split)

    def _apply(
        self, request: GpuRequest, host: HostView, indexes: tuple[int, ...], split: bool
    ) -> Placement:
        chosen = set(indexes)
        uuids = []
        for g in host.gpus:
            if g.index in chosen:
                g.holder = request.holder_id
                g.tenant = request.tenant_id
                g.shares = request.shares_host
                g.group = request.group_id
                g.pin = request.driver_version
                uuids.append(g.uuid)
        host.refresh()
        self._reindex(host)
        if request.group_id is not None:
            self.group_zones[request.group_id][host.zone] += 1
        placement = Placement(
            request.holder_id, host.id, host.hostname, host.zone, tuple(uuids), indexes, split
        )
        self.holders[request.holder_id] = placement
        return placement

    def unplace(self, placement: Placement) -> None:
        """Undo :meth:`place` (a batch is all-or-nothing in memory too)."""
        host = self.hosts.get(placement.host_id)
        self.holders.pop(placement.holder_id, None)
        if host is None:
            return
        group = None
        for g in host.gpus:
            if g.holder == placement.holder_id:
                group = g.group
                g.holder = g.tenant = g.group = None
                g.shares = False
                g.pin = ""
        if group is not None:
            self.group_zones[group][host.zone] -= 1
        host.refresh()
        self._reindex(host)

    def place_all(self, requests: Sequence[GpuRequest]) -> list[Placement]:
        """Place every request or none: raises :class:`InsufficientCapacity` (views restored)."""
        done: list[Placement] = []
        for index, request in enumerate(requests):
            already = request.holder_id in self.holders
            placement = self.place(request)
            if placement is None:
                for placed in reversed(done):
                    self.unplace(placed)
                raise InsufficientCapacity(request, placed=index, total=len(requests))
            if not already:
                done.append(placement)
        return [self.holders[r.holder_id] for r in requests]


def naive_first_fit(hosts: Sequence[HostView], request: GpuRequest) -> Placement | None:
    """Baseline: the first host (in the given order) with enough free GPUs, lowest indexes.

    Same eligibility and tenancy rules as the planner, no best fit, no NVLink awareness, no
    zone spreading. Mutates the host it places on.
    """
    for host in hosts:
        if (
            host.gpu_model != request.gpu_model
            or not host.schedulable
            or host.free < request.gpus
            or (request.zone and host.zone != request.zone)
            or not host_in_region(host.region, host.zone, request.region)
            or not host.admits(request.tenant_id, request.shares_host)
            or not host.takes_driver(request.driver_version)
        ):
            continue
        free = sorted(i for f in host.free_by_island.values() for i in f)[: request.gpus]
        islands = {g.island for g in host.gpus if g.index in free}
        for g in host.gpus:
            if g.index in free:
                g.holder, g.tenant, g.shares = request.holder_id, request.tenant_id, False
                g.group, g.pin = request.group_id, request.driver_version
        host.refresh()
        uuids = tuple(g.uuid for g in host.gpus if g.index in free)
        return Placement(
            request.holder_id,
            host.id,
            host.hostname,
            host.zone,
            uuids,
            tuple(free),
            len(islands) > 1,
        )
    return None


# --- the database side --------------------------------------------------------------------------


def claim_gpus(requests: Sequence[GpuRequest]) -> list[Placement]:
    """Claim GPUs for every request or raise :class:`InsufficientCapacity`.

    Must be called inside ``transaction.atomic()``: on failure the caller's rollback releases
    whatever this batch had claimed. Requests already holding GPUs (same ``holder_id``) are
    returned as they are, which makes the call idempotent.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("claim_gpus must run inside transaction.atomic()")
    if not requests:
        return []
    existing = _existing_placements([r.holder_id for r in requests])
    todo = [r for r in requests if r.holder_id not in existing]
    placed: dict[uuid.UUID, Placement] = dict(existing)
    if todo:
        claimed = _claim_batch(todo, total=len(requests), done=len(existing))
        for hook in CLAIM_HOOKS:
            hook(todo, [claimed[r.holder_id] for r in todo])
        placed.update(claimed)
    return [placed[r.holder_id] for r in requests]


def fits(
    requests: Sequence[GpuRequest],
    *,
    released: Iterable[uuid.UUID] = (),
    scrubbed: bool = False,
) -> bool:
    """Whether :func:`claim_gpus` would place every request on the hosts as they are now —
    the same candidates (:func:`load_host_views`) and :class:`Planner`, nothing locked or
    claimed: the shape-aware answer of dry runs (a node of ``k`` GPUs needs one host with
    ``k`` free GPUs, not ``k`` free GPUs in all).

    ``released``: holder ids (nodes) whose GPUs count as free — the fleet at a later instant,
    once those nodes are gone (e.g. a reservation's nodes drained at its end); their hosts are
    candidates too even when full now. A GPU freed that way counts as placeable if it is
    healthy and listed now (a held GPU is scrubbed: its scrub comes with its release).
    ``scrubbed``: the free GPUs being scrubbed now (:func:`scrubbing_count`) count as
    scrubbed — the fleet once the agent reports their scrubs."""
    gone = set(released)
    views = load_host_views(requests)
    if scrubbed:
        pending = _pending_scrubs(requests)
        loaded = {v.id for v in views}
        views += _views_for_hosts({h for h, _ in pending} - loaded)
        uuids = {u for _, u in pending}
        for view in views:
            for slot in view.gpus:
                if slot.holder is None and slot.uuid in uuids:
                    slot.usable = True
            view.refresh()
    if gone:
        loaded = {v.id for v in views}
        held_on = set(
            Gpu.objects.filter(holder_id__in=gone).values_list("host_id", flat=True).distinct()
        )
        views += _views_for_hosts(held_on - loaded)
        for view in views:
            for slot in view.gpus:
                if slot.holder in gone:
                    slot.holder = slot.tenant = slot.group = None
                    slot.shares = False  # its health stays as read: unhealthy stays out
                    slot.pin = ""
            view.refresh()
    try:
        Planner(views).place_all(requests)
    except InsufficientCapacity:
        return False
    return True


def _pending_scrubs(requests: Sequence[GpuRequest]) -> set[tuple[uuid.UUID, str]]:
    """``(host id, GPU uuid)`` of the free GPUs being scrubbed that :func:`scrubbing_count`
    counts for the requests' models and regions (zones)."""
    out: set[tuple[uuid.UUID, str]] = set()
    for model, region, zone in {(r.gpu_model, r.region, r.zone) for r in requests}:
        out.update(_scrubbing_q(model, region, zone).values_list("host_id", "uuid"))
    return out


def _claim_batch(
    requests: Sequence[GpuRequest], *, total: int, done: int
) -> dict[uuid.UUID, Placement]:
    by_holder = {r.holder_id: r for r in requests}
    views = load_host_views(requests)
    seen: set[uuid.UUID] = {v.id for v in views}
    planner = Planner(views)
    locked: set[uuid.UUID] = set()  # by this transaction
    skipped: set[uuid.UUID] = set()  # locked by another transaction
    for _round in range(MAX_ROUNDS):
        try:
            plan = planner.place_all(requests)
        except InsufficientCapacity as exc:
            more = load_host_views(requests, exclude=seen) if skipped else []
            if more:  # the locked hosts hid candidates not loaded yet: try them too
                seen.update(v.id for v in more)
                for view in more:
                    planner.add(view)
                continue
            if skipped:
                raise PlacementContended(exc.request, locked_hosts=len(skipped)) from None
            scrubbing = scrubbing_gpus(exc.request)
            if scrubbing:  # released GPUs not confirmed clean yet: they come back shortly
                raise PlacementScrubbing(exc.request, scrubbing) from None
            raise InsufficientCapacity(exc.request, placed=done + exc.placed, total=total) from None
        hosts = {p.host_id for p in plan}
        wanted = hosts - locked
        got = set(
            Host.objects.select_for_update(skip_locked=True, no_key=True)
            .filter(pk__in=wanted, state__in=SCHEDULABLE_HOST_STATES)
            .values_list("pk", flat=True)
        )
        locked |= got
        # Under the lock nobody else can claim on these hosts; check what we read is still so.
        fresh = {v.id: v for v in _views_for_hosts(hosts & locked)}
        stale = {p.host_id for p in plan if not _still_fits(p, fresh, by_holder)}
        bad = (wanted - got) | stale
        if not bad:
            return _write(plan, by_holder)
        # A host missing from ``got`` is locked by another claimant (or left the schedulable
        # states: then it is not capacity either way, and the next snapshot drops it).
        skipped |= wanted - got
        for placement in plan:
            planner.unplace(placement)
        for host_id in bad:
            planner.remove(host_id)
            if host_id in fresh and host_id in locked:
                planner.add(fresh[host_id])
    raise PlacementContended(requests[0], locked_hosts=len(skipped))


def _still_fits(
    placement: Placement, fresh: dict[uuid.UUID, HostView], by_holder: dict[uuid.UUID, GpuRequest]
) -> bool:
    view = fresh.get(placement.host_id)
    if view is None or not view.schedulable:
        return False
    request = by_holder[placement.holder_id]
    slots = {g.index: g for g in view.gpus}
    if any(
        i not in slots or slots[i].holder is not None or not slots[i].usable
        for i in placement.gpu_indexes
    ):
        return False
    return view.admits(request.tenant_id, request.shares_host) and view.takes_driver(
        request.driver_version
    )


def _write(
    plan: Sequence[Placement], by_holder: dict[uuid.UUID, GpuRequest]
) -> dict[uuid.UUID, Placement]:
    now = timezone.now()
    out: dict[uuid.UUID, Placement] = {}
    for placement in plan:
        request = by_holder[placement.holder_id]
        updated = Gpu.objects.filter(
            host_id=placement.host_id, uuid__in=placement.gpu_uuids, holder_id__isnull=True
        ).update(
            holder_id=placement.holder_id,
            holder_tenant_id=request.tenant_id,
            holder_shares_host=request.shares_host,
            holder_group_id=request.group_id,
            claimed_at=now,
        )
        if updated != len(placement.gpu_uuids):  # cannot happen under the host lock
            raise RuntimeError(f"GPUs of {placement.hostname} changed under the host lock")
        out[placement.holder_id] = placement
    for host_id in {p.host_id for p in plan}:
        Host.objects.filter(pk=host_id, state=HostState.AVAILABLE).update(
            state=HostState.ALLOCATED, state_changed_at=now
        )
    return out


_CANDIDATES_SQL = """
WITH eligible AS (
    SELECT id, zone, free_gpus,
           ROW_NUMBER() OVER (PARTITION BY zone, free_gpus ORDER BY hostname) AS rank
      FROM fleet_host
     WHERE gpu_model_id = %(model)s AND state IN ('AVAILABLE', 'ALLOCATED')
       AND tenancy = 'dedicated'  -- shared hosts: fleet/shared_hosts.py
       AND free_gpus >= %(smallest)s
       AND (region = %(where)s OR zone = %(where)s OR zone LIKE %(prefix)s)
       AND (held_tenants <@ ARRAY[%(tenant)s]::uuid[]
            OR (%(shares)s AND exclusive_tenants <@ ARRAY[%(tenant)s]::uuid[]))
       AND NOT (id = ANY(%(exclude)s::uuid[]))
       -- a pinned driver: a host of its branch, or one nobody holds (rule 6; the planner
       -- checks the release and what the holders pin)
       AND (%(branch)s::text IS NULL OR held_gpus = 0
            OR split_part(driver_version, '.', 1) = %(branch)s::text)
       AND (%(cluster)s::uuid IS NULL
            OR (nvlink_cluster_uuid = %(cluster)s::uuid AND nvlink_clique_id = %(clique)s))
       AND NOT EXISTS (SELECT 1 FROM unnest(%(fenced_c)s::uuid[], %(fenced_q)s::bigint[]) f(c, q)
                        WHERE f.c = nvlink_cluster_uuid AND f.q = nvlink_clique_id)
)
SELECT id FROM eligible WHERE rank <= %(per_bucket)s
"""


def load_host_views(
    requests: Sequence[GpuRequest], *, exclude: Iterable[uuid.UUID] = ()
) -> list[HostView]:
    """Snapshots of the hosts that could take ``requests`` (a bounded set, see below), leaving
    out the hosts in ``exclude`` (already loaded: the next ones are returned).

    Per (model, region or zone, tenant, sharing, NVLink domain) of the batch, one query over
    ``fleet_host`` (its GPU summary columns, kept by a trigger) ranks the eligible hosts the
    tenant may use by zone and free GPU count and keeps, for every such bucket, the first
    ``2 * requests + 16`` by hostname: enough for every request of the batch to find its
    best-fit host even when some hosts' NVLink islands do not fit, without reading every GPU
    of the fleet for each claim. Hosts of the NVLink domains fenced for the requests'
    reservation (:data:`DOMAIN_FENCES`) are left out.
    """
    groups: dict[tuple, list[GpuRequest]] = defaultdict(list)
    for r in requests:
        key = (r.gpu_model, r.zone or r.region, r.tenant_id, r.shares_host, r.nvlink_domain)
        branch = host_driver.branch_of(r.driver_version)
        groups[(*key, r.region, r.reservation_id, branch)].append(r)
    ids: set[uuid.UUID] = set()
    excluded = list(exclude)
    with connection.cursor() as cursor:
        for key, members in groups.items():
            model, where, tenant, shares, domain, region, reservation, branch = key
            fenced = sorted(fenced_domains(model, region, reservation))
            cursor.execute(
                _CANDIDATES_SQL,
                {
                    "model": model,
                    "where": where,
                    "prefix": where.replace("%", "").replace("_", "\\_") + "%",
                    "tenant": tenant,
                    "shares": shares,
                    "smallest": min(m.gpus for m in members),
                    "per_bucket": 2 * len(members) + 16,
                    "exclude": excluded,
                    "cluster": domain[0] if domain else None,
                    "clique": domain[1] if domain else None,
                    "fenced_c": [c for c, _ in fenced],
                    "fenced_q": [q for _, q in fenced],
                    "branch": branch,
                },
            )
            ids.update(row[0] for row in cursor.fetchall())
    return _views_for_hosts(ids)


_VIEWS_SQL = """
SELECT h.id, h.hostname, h.zone, h.region, h.gpu_model_id, h.state, h.tenancy,
       h.driver_version, g.index, g.uuid, g.health = 'HEALTHY' AND g.scrub_state = 'CLEAN'
                        AND g.missing_since IS NULL,
       g.holder_id, g.holder_tenant_id, g.holder_shares_host, g.holder_group_id,
       COALESCE(g.nvlink_island, 0)
  FROM fleet_host h JOIN fleet_gpu g ON g.host_id = h.id
 WHERE h.id = ANY(%s)
 ORDER BY h.id, g.index
"""


def _views_for_hosts(host_ids: Iterable[uuid.UUID]) -> list[HostView]:
    """Snapshots of the given hosts (one query; a GPU without a known island is island 0),
    each held GPU with the driver its holder pins (:func:`fleet.host_driver.holder_pins`)."""
    ids = list(host_ids)
    if not ids:
        return []
    views: list[HostView] = []
    current: uuid.UUID | None = None
    gpus: list[GpuSlot] = []
    head: tuple = ()
    with connection.cursor() as cursor:
        cursor.execute(_VIEWS_SQL, [ids])
        rows = cursor.fetchall()
    pins = host_driver.holder_pins(row[11] for row in rows if row[11] is not None)
    for hid, hostname, zone, region, model, state, tenancy, driver, *gpu in rows:
        if hid != current:
            if current is not None:
                views.append(_view(head, gpus))
            current, gpus = hid, []
            # a shared host's GPUs are handed out as MIG instances only (shared_hosts.py)
            schedulable = state if tenancy == "dedicated" else ""
            head = (hid, hostname, zone, region, model, schedulable, driver)
        index, gpu_uuid, usable, holder, tenant, shares, group, island = gpu
        pin = pins.get(holder, "") if holder is not None else ""
        gpus.append(GpuSlot(index, gpu_uuid, island, usable, holder, tenant, shares, group, pin))
    if current is not None:
        views.append(_view(head, gpus))
    return views


def _view(head: tuple, gpus: list[GpuSlot]) -> HostView:
    hid, hostname, zone, region, model, state, driver = head
    return HostView(
        id=hid,
        hostname=hostname,
        zone=zone,
        region=region or region_of_zone(zone),
        gpu_model=model,
        gpus=gpus,
        schedulable=state in SCHEDULABLE_HOST_STATES,
        driver_version=driver or "",
    )


def _existing_placements(holder_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Placement]:
    gpus = list(
        Gpu.objects.filter(holder_id__in=holder_ids)
        .select_related("host")
        .order_by("holder_id", "index")
    )
    grouped: dict[uuid.UUID, list[Gpu]] = defaultdict(list)
    for g in gpus:
        grouped[g.holder_id].append(g)  # type: ignore[index]
    out = {}
    for holder_id, held in grouped.items():
        host = held[0].host
        islands = {g.nvlink_island for g in held}
        out[holder_id] = Placement(
            holder_id,
            host.id,
            host.hostname,
            host.zone,
            tuple(g.uuid for g in held),
            tuple(g.index for g in held),
            len(islands) > 1,
        )
    return out


def release_gpus(holder_id: uuid.UUID) -> list[str]:
    """Free every GPU held by ``holder_id``; returns their UUIDs. Idempotent.

    The GPUs are not handed to anyone until scrubbed (:func:`fleet.hygiene.request_scrubs`);
    a draining host whose last GPU this was enters its drain target state.
    """
    from .hygiene import request_scrubs
    from .services import settle_host_state

    with transaction.atomic():
        host_ids = list(
            Gpu.objects.filter(holder_id=holder_id).values_list("host_id", flat=True).distinct()
        )
        # Lock the hosts first (same order as claims), then the GPUs.
        list(
            Host.objects.select_for_update(no_key=True)
            .filter(pk__in=host_ids)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        gpus = list(
            Gpu.objects.select_for_update().filter(holder_id=holder_id).order_by("host_id", "index")
        )
        if not gpus:
            return []
        now = timezone.now()
        Gpu.objects.filter(pk__in=[g.pk for g in gpus]).update(
            holder_id=None,
            holder_tenant=None,
            holder_shares_host=False,
            holder_group_id=None,
            claimed_at=None,
            last_tenant_id=gpus[0].holder_tenant_id,
            scrub_state=ScrubState.PENDING,
        )
        request_scrubs(gpus, now=now)
        for host_id in {g.host_id for g in gpus}:
            settle_host_state(host_id, now=now)
        return [g.uuid for g in gpus]


def max_host_gpus(gpu_model: str) -> int:
    """The most GPUs any non-retired host of ``gpu_model`` has (0 when there is none)."""
    counts = (
        Host.objects.filter(gpu_model_id=gpu_model)
        .exclude(state=HostState.RETIRED)
        .values_list("gpu_count", flat=True)
    )
    return max(counts, default=0)
