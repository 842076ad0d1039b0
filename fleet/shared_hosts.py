"""Shared hosts: MIG GPU instances of one physical GPU sold to several tenants (DESIGN §4).

A host an operator marks ``tenancy = shared`` (:func:`set_host_tenancy`) is a hypervisor whose
tenant nodes are VMs holding MIG GPU instances (or MIG-backed vGPUs) of its GPUs, as NVIDIA's
multi-tenant reference architecture describes. Whole-GPU placement (:mod:`fleet.placement`)
never uses such a host; ``tenancy: shared`` MIG / vGPU pools are placed only there, by this
module. NVKE owns each shared GPU's MIG layout across tenants: one :class:`GpuInstance` row per
GPU instance, created for a tenant's node at a free valid placement and destroyed when the node
releases it.

Placement (:func:`claim_gpu_instances`), per node (all instances of one VM node on one host):

1. **Eligible**: shared hosts of the pool's GPU model in its region (or zone), schedulable
   (``AVAILABLE``/``ALLOCATED``); GPUs healthy and listed by the agent. A GPU may also be held
   whole by nobody (a shared host's GPUs are never claimed whole).
2. **Valid placements**: each instance goes at the lowest free valid start of the catalog's
   ``-lgipp`` placement table given the instances already on the GPU, every MIG rule checked
   (:func:`catalog.mig.place_layout` with ``existing``); instances being scrubbed count as taken.
3. **Best fit, fewest opened**: instances are placed largest first, each on the GPU that
   already holds instances (an opened GPU before an empty one) with the fewest compute slices
   left after it; a host is chosen by: already holds instances (opened) first, then the
   fewest GPUs newly opened, then the fewest compute slices left free, then the hostname.
4. **Driver** (:mod:`fleet.host_driver`): the hypervisor's driver is one for every VM node on
   it. A node whose pool pins a driver goes onto a shared host reporting a matching driver, or
   one holding no other node; a node without a pin takes the host's driver.

:func:`shared_room` is the same plan as a look (nothing locked or written): a dry run of a
shared pool answers with it, in GPU instances of its profiles on shared hosts.

Concurrency: the candidate hosts are locked (``SELECT … FOR NO KEY UPDATE``, in primary-key
order like :func:`fleet.placement.release_gpus`, so lockers never deadlock) before their
instances are read, so two concurrent claims on one host run one after the other and the second
sees the first's instances. The exclusion constraint ``gpuinstance_no_overlap`` (no two
non-FREE rows of a GPU with overlapping memory slices) is the last line of defence. Waiting on
the lock (not SKIP LOCKED) is deliberate: shared hosts are few and a claim is short.

Release (:func:`release_gpu_instances`) turns the node's instances SCRUBBING, each with a new
``scrub_id``; the provider destroys the GPU instance on the host and clears its memory, naming
that scrub id. :func:`confirm_scrubs` (called by ingestion for every report with an inventory)
reads the agent's facts (:func:`fleet.agent_facts.host_facts`) and makes an instance FREE only when
the report shows no GPU instance left on its slices *and* a completed scrub with its scrub id.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from catalog.mig import LayoutDoesNotFit, MigTable, place_layout
from catalog.mig import Placement as MigPlacement
from catalog.models import GpuModel
from nvke.errors import Conflict, InvalidInput

from . import host_driver, host_warnings
from .choices import (
    SCHEDULABLE_HOST_STATES,
    GpuHealth,
    GpuInstanceState,
    HostEventKind,
    HostTenancy,
)
from .models import Gpu, GpuInstance, Host, HostEvent


@dataclass(frozen=True)
class GpuInstanceRequest:
    """A VM node of a ``tenancy: shared`` pool: ``instances`` (canonical MIG profile names,
    e.g. ``("1g.10gb", "1g.10gb")``) of ``gpu_model`` GPUs in ``region`` (or ``zone``)."""

    holder_id: uuid.UUID
    tenant_id: uuid.UUID
    gpu_model: str
    region: str
    instances: tuple[str, ...]
    zone: str | None = None
    #: the driver the node's pool pins ("" none): rule 4
    driver_version: str = ""


@dataclass(frozen=True)
class PlacedInstance:
    """One GPU instance of a placement: the GPU and the catalog placement (start, size)."""

    gpu_uuid: str
    gpu_index: int
    profile: str
    start: int
    size: int


@dataclass(frozen=True)
class GpuInstancePlacement:
    """Where a node's instances landed (one host). ``gpu_uuids``: the GPUs touched, by index."""

    holder_id: uuid.UUID
    host_id: uuid.UUID
    hostname: str
    zone: str
    instances: tuple[PlacedInstance, ...]

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        seen: dict[str, int] = {}
        for i in self.instances:
            seen.setdefault(i.gpu_uuid, i.gpu_index)
        return tuple(sorted(seen, key=seen.__getitem__))


class SharedCapacityShort(Exception):
    """No shared host can take a node's instances (nothing of the batch was claimed)."""

    def __init__(self, request: GpuInstanceRequest, placed: int, total: int) -> None:
        self.request = request
        where = f"zone {request.zone!r}" if request.zone else f"region {request.region!r}"
        super().__init__(
            f"no shared host with room for {' + '.join(request.instances)} on "
            f"{request.gpu_model} in {where} ({placed} of {total} node(s) could be placed)"
        )


def is_shared_policy(isolation: dict[str, Any]) -> bool:
    """A ``tenancy: shared`` MIG or vGPU pool (the only kind placed on shared hosts)."""
    return isolation.get("tenancy") == "shared" and isolation.get("mode") in ("mig", "vgpu")


def instances_for_policy(
    gpu_model: str, isolation: dict[str, Any], per_node: int
) -> tuple[str, ...]:
    """The GPU instances (MIG profile names, canonical) one VM node of a shared pool holds.

    ``mig_profile: P`` -> ``per_node`` instances of P; ``mig_layout: {P: n, …}`` -> the layout
    ``per_node`` times; a MIG-backed ``vgpu_profile`` / ``vgpu_layout`` -> the MIG profiles
    behind its vGPU types likewise (catalog ``VgpuProfile.mig_profile``). ``per_node`` is the
    pool's ``gpus_per_node``: a VM sees each instance (vGPU) as one GPU. The policy is the
    validated one (nodepools.isolation), so names are canonical.
    """
    from catalog.models import VgpuProfile

    layout: dict[str, int]
    if isolation.get("mode") == "mig":
        if "mig_profile" in isolation:
            layout = {isolation["mig_profile"]: 1}
        else:
            layout = dict(isolation.get("mig_layout") or {})
    else:
        wanted = (
            {isolation["vgpu_profile"]: 1}
            if "vgpu_profile" in isolation
            else dict(isolation.get("vgpu_layout") or {})
        )
        backing = dict(
            VgpuProfile.objects.filter(
                gpu_model_id=gpu_model, name__in=list(wanted), mig_profile__isnull=False
            ).values_list("name", "mig_profile__name")
        )
        layout = {}
        for name, count in wanted.items():
            if name in backing:
                layout[backing[name]] = layout.get(backing[name], 0) + count
    return tuple(name for _ in range(per_node) for name, n in layout.items() for _ in range(n))


# --- the in-memory plan ---------------------------------------------------------------------


@dataclass
class SharedGpu:
    """A GPU of a shared host as the planner sees it: the instances that occupy it."""

    uuid: str
    index: int
    usable: bool
    taken: list[MigPlacement]


@dataclass
class SharedHost:
    id: uuid.UUID
    hostname: str
    zone: str
    gpus: list[SharedGpu]
    #: the driver the host's agent last reported, and what each GPU instance's holder pins
    #: (one entry per held instance; :func:`fleet.host_driver.may_place`)
    driver_version: str = ""
    pins: list[str] = field(default_factory=list)

    @property
    def opened(self) -> bool:
        return any(g.taken for g in self.gpus)


def _free_compute(table: MigTable, taken: Iterable[MigPlacement]) -> int:
    used = 0
    for p in taken:
        spec = table.profile(p.profile)
        used += spec.compute_slices if spec else 0
    return table.compute_slices - used


def plan_on_host(
    host: SharedHost, profiles: Sequence[str], table: MigTable
) -> tuple[list[PlacedInstance], tuple] | None:
    """Place ``profiles`` on ``host`` (nothing is changed): the instances and the host's
    best-fit key ``(not opened, GPUs newly opened, compute slices left, hostname)``, or None."""
    taken = {g.uuid: list(g.taken) for g in host.gpus}
    order = sorted(
        profiles,
        key=lambda n: (
            -(table.profile(n).memory_slices if table.profile(n) else 0),
            -(table.profile(n).compute_slices if table.profile(n) else 0),
            n,
        ),
    )
    placed: list[PlacedInstance] = []
    for name in order:
        best: tuple | None = None
        for gpu in host.gpus:
            if not gpu.usable:
                continue
            try:
                (new,) = place_layout({name: 1}, table, existing=taken[gpu.uuid])
            except LayoutDoesNotFit:
                continue
            left = _free_compute(table, [*taken[gpu.uuid], new])
            key = (not taken[gpu.uuid], left, gpu.index)
            if best is None or key < best[0]:
                best = (key, gpu, new)
        if best is None:
            return None
        _, gpu, new = best
        taken[gpu.uuid].append(new)
        placed.append(PlacedInstance(gpu.uuid, gpu.index, new.profile, new.start, new.size))
    newly_opened = sum(1 for g in host.gpus if taken[g.uuid] and not g.taken)
    left = sum(_free_compute(table, taken[g.uuid]) for g in host.gpus if g.usable)
    return placed, (not host.opened, newly_opened, left, host.hostname)


def plan_gpu_instances(
    hosts: Sequence[SharedHost], request: GpuInstanceRequest, table: MigTable
) -> tuple[SharedHost, list[PlacedInstance]] | None:
    """The best-fit host for ``request`` and its instances (see the module docstring)."""
    best: tuple | None = None
    for host in hosts:
        if request.zone and host.zone != request.zone:
            continue
        if not host_driver.may_place(request.driver_version, host.driver_version, host.pins):
            continue
        found = plan_on_host(host, request.instances, table)
        if found is not None and (best is None or found[1] < best[0]):
            best = (found[1], host, found[0])
    if best is None:
        return None
    return best[1], best[2]


# --- the database side ------------------------------------------------------------------------


def _table(gpu_model: str) -> MigTable:
    return MigTable.from_gpu_model(GpuModel.objects.get(slug=gpu_model))


def _load_hosts(request: GpuInstanceRequest, *, lock: bool = True) -> list[SharedHost]:
    """Lock (pk order; ``lock=False``: a look, nothing locked) and read the shared hosts that
    could take ``request``."""
    found = Host.objects.select_for_update(no_key=True) if lock else Host.objects.all()
    hosts = list(
        found.filter(
            Host.in_region_q(request.zone or request.region),
            tenancy=HostTenancy.SHARED,
            gpu_model_id=request.gpu_model,
            state__in=SCHEDULABLE_HOST_STATES,
        )
        .order_by("pk")
        .values("id", "hostname", "zone", "driver_version")
    )
    ids = [h["id"] for h in hosts]
    taken: dict[int, list[MigPlacement]] = {}
    holders: dict[uuid.UUID, list[uuid.UUID]] = {}
    for row in GpuInstance.objects.filter(host_id__in=ids).exclude(state=GpuInstanceState.FREE):
        taken.setdefault(row.gpu_id, []).append(MigPlacement(row.profile, row.start, row.size))
        if row.holder_id is not None:
            holders.setdefault(row.host_id, []).append(row.holder_id)
    pins = host_driver.holder_pins(h for held in holders.values() for h in held)
    gpus: dict[uuid.UUID, list[SharedGpu]] = {}
    for g in Gpu.objects.filter(host_id__in=ids).order_by("host_id", "index"):
        usable = g.health == GpuHealth.HEALTHY and g.missing_since is None and g.holder_id is None
        gpus.setdefault(g.host_id, []).append(
            SharedGpu(g.uuid, g.index, usable, taken.get(g.pk, []))
        )
    return [
        SharedHost(
            h["id"],
            h["hostname"],
            h["zone"],
            gpus.get(h["id"], []),
            h["driver_version"],
            [pins.get(holder, "") for holder in holders.get(h["id"], [])],
        )
        for h in hosts
    ]


def existing_gpu_instances(holder_id: uuid.UUID) -> GpuInstancePlacement | None:
    """The node's ACTIVE instances as a placement, or None when it holds none."""
    rows = list(
        GpuInstance.objects.filter(holder_id=holder_id, state=GpuInstanceState.ACTIVE)
        .select_related("host", "gpu")
        .order_by("gpu__index", "start")
    )
    if not rows:
        return None
    host = rows[0].host
    return GpuInstancePlacement(
        holder_id,
        host.id,
        host.hostname,
        host.zone,
        tuple(PlacedInstance(r.gpu.uuid, r.gpu.index, r.profile, r.start, r.size) for r in rows),
    )


def claim_gpu_instances(requests: Sequence[GpuInstanceRequest]) -> list[GpuInstancePlacement]:
    """Create the GPU instances of every request or raise :class:`SharedCapacityShort`.

    Must run inside ``transaction.atomic()`` (the caller's rollback undoes a partial batch).
    Idempotent: a request whose node already holds instances gets them back unchanged.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("claim_gpu_instances must run inside transaction.atomic()")
    out: list[GpuInstancePlacement] = []
    tables: dict[str, MigTable] = {}
    views: dict[tuple, list[SharedHost]] = {}
    now = timezone.now()
    for number, request in enumerate(requests):
        held = existing_gpu_instances(request.holder_id)
        if held is not None:
            out.append(held)
            continue
        table = tables.setdefault(request.gpu_model, _table(request.gpu_model))
        key = (request.gpu_model, request.zone or request.region)
        if key not in views:
            views[key] = _load_hosts(request)
        found = plan_gpu_instances(views[key], request, table)
        if found is None:
            raise SharedCapacityShort(request, placed=number, total=len(requests))
        host, placed = found
        _take(host, placed, request.driver_version)  # the next request of the batch sees them
        gpu_pks = dict(
            Gpu.objects.filter(host_id=host.id, uuid__in=[p.gpu_uuid for p in placed]).values_list(
                "uuid", "pk"
            )
        )
        GpuInstance.objects.bulk_create(
            [
                GpuInstance(
                    host_id=host.id,
                    gpu_id=gpu_pks[p.gpu_uuid],
                    profile=p.profile,
                    start=p.start,
                    size=p.size,
                    compute_slices=table.profile(p.profile).compute_slices,  # type: ignore[union-attr]
                    holder_id=request.holder_id,
                    tenant_id=request.tenant_id,
                    created_at=now,
                )
                for p in placed
            ]
        )
        Host.objects.filter(pk=host.id, state="AVAILABLE").update(
            state="ALLOCATED", state_changed_at=now
        )
        out.append(
            GpuInstancePlacement(
                request.holder_id, host.id, host.hostname, host.zone, tuple(placed)
            )
        )
    return out


def _take(host: SharedHost, placed: Iterable[PlacedInstance], pin: str) -> None:
    """Mark ``placed`` taken on the snapshot ``host`` by a node pinning driver ``pin`` (the
    plan's next node sees them)."""
    by_uuid = {g.uuid: g for g in host.gpus}
    for p in placed:
        by_uuid[p.gpu_uuid].taken.append(MigPlacement(p.profile, p.start, p.size))
        host.pins.append(pin)


@dataclass(frozen=True)
class SharedRoom:
    """What the shared hosts can take now for one kind of VM node (a dry run's capacity).

    ``free``: per MIG profile of the node, GPU instances of that profile the shared hosts'
    usable GPUs can still hold, each at the lowest free valid start beside the instances there
    (``catalog.mig.place_layout``, as placement puts them; each profile counted alone);
    ``nodes_placed``: how many of the asked nodes :func:`claim_gpu_instances` would place,
    node by node and all of a node's instances on one host, before one does not fit;
    ``hosts``: the shared hosts of the model in the region (or zone) in a schedulable state."""

    free: dict[str, int]
    nodes_placed: int
    hosts: int


def shared_room(requests: Sequence[GpuInstanceRequest]) -> SharedRoom:
    """:class:`SharedRoom` for ``requests`` (VM nodes of one pool: one model, region and
    instance set), from the shared hosts as they are now — the same snapshot and planner as
    :func:`claim_gpu_instances`, nothing locked or written."""
    if not requests:
        return SharedRoom({}, 0, 0)
    first = requests[0]
    hosts = _load_hosts(first, lock=False)
    table = _table(first.gpu_model)
    free = {name: 0 for name in dict.fromkeys(first.instances)}
    for name in free:
        for host in hosts:
            for gpu in host.gpus:
                taken = list(gpu.taken)
                while gpu.usable:
                    try:
                        (new,) = place_layout({name: 1}, table, existing=taken)
                    except LayoutDoesNotFit:
                        break
                    taken.append(new)
                    free[name] += 1
    placed = 0
    for request in requests:
        found = plan_gpu_instances(hosts, request, table)
        if found is None:
            break
        _take(*found, request.driver_version)
        placed += 1
    return SharedRoom(free, placed, len(hosts))


def release_gpu_instances(
    holder_id: uuid.UUID, *, now: datetime | None = None
) -> list[GpuInstance]:
    """The node gives its instances back: each becomes SCRUBBING with a new ``scrub_id``
    (returned, for the provider to destroy and clear). Idempotent: a second call returns []."""
    now = now or timezone.now()
    with transaction.atomic():
        host_ids = list(
            GpuInstance.objects.filter(holder_id=holder_id, state=GpuInstanceState.ACTIVE)
            .values_list("host_id", flat=True)
            .distinct()
        )
        if not host_ids:
            return []
        list(
            Host.objects.select_for_update(no_key=True)
            .filter(pk__in=host_ids)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        rows = list(
            GpuInstance.objects.select_for_update()
            .filter(holder_id=holder_id, state=GpuInstanceState.ACTIVE)
            .select_related("gpu")
            .order_by("gpu__index", "start")
        )
        for row in rows:
            row.state = GpuInstanceState.SCRUBBING
            row.previous_tenant_id = row.tenant_id
            row.tenant_id = None
            row.holder_id = None
            row.scrub_id = uuid.uuid4()
            row.released_at = now
            row.save(
                update_fields=[
                    "state",
                    "previous_tenant",
                    "tenant",
                    "holder_id",
                    "scrub_id",
                    "released_at",
                ]
            )
        from .services import settle_host_state

        for host_id in host_ids:
            HostEvent.objects.create(
                host_id=host_id,
                ts=now,
                kind=HostEventKind.SCRUB,
                message=f"{len(rows)} GPU instance(s) released: scrubbing",
                data={"holder_id": str(holder_id), "instances": [str(r.id) for r in rows]},
            )
            settle_host_state(host_id, now=now)
        return rows


def confirm_scrubs(host: Host, *, now: datetime | None = None) -> int:
    """After an agent report of ``host``: SCRUBBING instances the report shows destroyed and
    cleared (a ``slice_scrubs`` entry with their ``scrub_id``, status ``ok``, same start and
    size) become FREE; ACTIVE ones learn their NVML GPU-instance id. Returns instances freed.

    Reads the agent's facts through :func:`fleet.agent_facts.host_facts` (one truth: what the
    last report said), never what the provider says it did.
    """
    from .agent_facts import host_facts
    from .conf import scrub_timeout_s
    from .host_warnings import set_host_warning

    rows = list(
        GpuInstance.objects.filter(host=host)
        .exclude(state=GpuInstanceState.FREE)
        .filter(~_known_active())
        .select_related("gpu")
    )
    if not rows:
        return 0
    facts = host_facts(host.pk, [r.gpu.uuid for r in rows])
    if facts is None:
        return 0
    now = now or timezone.now()
    freed = 0
    late: list[str] = []
    for row in rows:
        gpu = facts.gpus.get(row.gpu.uuid)
        if gpu is None or gpu.missing:
            continue
        slices = set(range(row.start, row.start + row.size))
        on_slices = [d for d in gpu.devices if set(range(d[1], d[1] + d[2])) & slices]
        if row.state == GpuInstanceState.ACTIVE:
            match = [d for d in gpu.devices if d[:3] == (row.profile, row.start, row.size)]
            if match and match[0][3] is not None:
                GpuInstance.objects.filter(pk=row.pk, state=GpuInstanceState.ACTIVE).update(
                    gpu_instance_id=match[0][3]
                )
            continue
        evidence = next(
            (
                s
                for s in gpu.slice_scrubs
                if s.get("scrub_id") == str(row.scrub_id)
                and s.get("status") == "ok"
                and s.get("start") == row.start
                and s.get("size") == row.size
            ),
            None,
        )
        if on_slices or evidence is None:
            # the instance is still there, or no confirmed clear yet: keep waiting (and say so
            # once NVKE_SCRUB_TIMEOUT_S has passed: its slices are out of service until then)
            if row.released_at and (now - row.released_at).total_seconds() >= scrub_timeout_s():
                late.append(f"{row.profile}@{row.start} of GPU {row.gpu.index}")
            continue
        updated = GpuInstance.objects.filter(pk=row.pk, state=GpuInstanceState.SCRUBBING).update(
            state=GpuInstanceState.FREE, freed_at=now, scrub_evidence=evidence
        )
        if updated:
            freed += 1
            HostEvent.objects.create(
                host=host,
                ts=now,
                kind=HostEventKind.SCRUB,
                actor="agent",
                message=f"{row.profile}@{row.start} of GPU {row.gpu.index} scrubbed and "
                "verified by the agent: free",
                data={"instance": str(row.id), "gpu_uuid": row.gpu.uuid, "evidence": evidence},
            )
    set_host_warning(
        host.pk,
        SCRUB_WARNING,
        f"{SCRUB_WARNING}{', '.join(late)}: the agent has not confirmed them destroyed and "
        "cleared; they stay out of placement"
        if late
        else None,
    )
    return freed


#: prefix of the host warning about released GPU instances whose scrub is overdue
SCRUB_WARNING = host_warnings.SLICE_SCRUB


def _known_active():
    from django.db.models import Q

    return Q(state=GpuInstanceState.ACTIVE, gpu_instance_id__isnull=False)


def instances_of(holder_id: Any) -> list[GpuInstance]:
    """The node's ACTIVE instances (GPU loaded), by GPU index and start."""
    return list(
        GpuInstance.objects.filter(holder_id=holder_id, state=GpuInstanceState.ACTIVE)
        .select_related("gpu")
        .order_by("gpu__index", "start")
    )


def instance_profiles(holder_ids: Iterable[Any]) -> dict[Any, dict[str, int]]:
    """``{holder_id: {profile: count}}`` of the ACTIVE GPU instances these nodes hold (one
    query; a node holding none is left out): what a VM node of a shared pool holds, in the
    words a tenant reads (``{"1g.10gb": 1}``, not "1 GPU")."""
    out: dict[Any, dict[str, int]] = {}
    rows = GpuInstance.objects.filter(
        holder_id__in=list(holder_ids), state=GpuInstanceState.ACTIVE
    ).values_list("holder_id", "profile")
    for holder, profile in rows:
        counts = out.setdefault(holder, {})
        counts[profile] = counts.get(profile, 0) + 1
    return out


def set_host_tenancy(host: Host, *, tenancy: str, actor: str) -> Host:
    """Mark a host dedicated or shared. Idempotent.

    Raises :class:`~nvke.errors.InvalidInput` ``gpu_not_mig_capable`` (400) when making a
    host of a model without MIG shared; :class:`~nvke.errors.Conflict`
    ``host_has_dedicated_nodes`` (409) when making it shared while whole GPUs of it are held,
    and ``host_has_gpu_instances`` when making it dedicated while GPU instances are held or
    being scrubbed. Unknown values are refused by the API serializer (400).
    """
    now = timezone.now()
    with transaction.atomic():
        locked = Host.objects.select_for_update(no_key=True).get(pk=host.pk)
        if locked.tenancy == tenancy:
            return locked
        if tenancy == HostTenancy.SHARED:
            model = locked.gpu_model
            if not model.mig_capable:  # GPUs are shared across tenants only through MIG
                raise InvalidInput(
                    f"{model.name} has no MIG (a per-product fact: NVIDIA MIG user guide), so "
                    f"host {locked.hostname} cannot share its GPUs across tenants",
                    code="gpu_not_mig_capable",
                    field="tenancy",
                )
            held = Gpu.objects.filter(host=locked, holder_id__isnull=False).count()
            if held:
                raise Conflict(
                    f"host {locked.hostname} holds {held} GPU(s) of dedicated nodes; drain it "
                    "before making it shared",
                    code="host_has_dedicated_nodes",
                    field="tenancy",
                    extra={"held_gpus": held},
                )
        else:
            live = (
                GpuInstance.objects.filter(host=locked).exclude(state=GpuInstanceState.FREE).count()
            )
            if live:
                raise Conflict(
                    f"host {locked.hostname} has {live} GPU instance(s) held or being scrubbed; "
                    "release them before making it dedicated",
                    code="host_has_gpu_instances",
                    field="tenancy",
                    extra={"instances": live},
                )
        Host.objects.filter(pk=locked.pk).update(tenancy=tenancy)
        HostEvent.objects.create(
            host=locked,
            ts=now,
            kind=HostEventKind.ACTION,
            actor=actor[:100],
            message=f"tenancy {locked.tenancy} -> {tenancy}",
            data={"from": locked.tenancy, "to": tenancy},
        )
    return Host.objects.get(pk=host.pk)


# --- the slice map (console / API) -----------------------------------------------------------


def slice_map(host: Host) -> list[dict[str, Any]]:
    """Per GPU of ``host``: its memory slices and who holds what.

    ``[{"gpu_uuid", "index", "memory_slices", "instances": [{"id", "profile", "start", "size",
    "state", "tenant_id", "tenant", "holder_id", "gpu_instance_id", "released_at"}], "free":
    [slice numbers not covered by a non-FREE instance]}]`` (operators only: names tenants).
    """
    model = host.gpu_model
    memory_slices = model.mig_memory_slices or 8
    rows = (
        GpuInstance.objects.filter(host=host)
        .exclude(state=GpuInstanceState.FREE)
        .select_related("tenant", "previous_tenant")
        .order_by("start")
    )
    by_gpu: dict[int, list[GpuInstance]] = {}
    for row in rows:
        by_gpu.setdefault(row.gpu_id, []).append(row)
    out = []
    for gpu in Gpu.objects.filter(host=host).order_by("index"):
        instances = by_gpu.get(gpu.pk, [])
        covered = {s for r in instances for s in range(r.start, r.start + r.size)}
        out.append(
            {
                "gpu_uuid": gpu.uuid,
                "index": gpu.index,
                "memory_slices": memory_slices,
                "instances": [
                    {
                        "id": str(r.id),
                        "profile": r.profile,
                        "start": r.start,
                        "size": r.size,
                        "state": r.state,
                        "tenant_id": str(r.tenant_id or r.previous_tenant_id or ""),
                        "tenant": (r.tenant or r.previous_tenant).name
                        if (r.tenant or r.previous_tenant)
                        else "",
                        "holder_id": str(r.holder_id) if r.holder_id else "",
                        "gpu_instance_id": r.gpu_instance_id,
                        "released_at": r.released_at,
                    }
                    for r in instances
                ],
                "free": [s for s in range(memory_slices) if s not in covered],
            }
        )
    return out
