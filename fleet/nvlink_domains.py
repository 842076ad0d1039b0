"""Multi-node NVLink domains: which hosts share one NVLink fabric, and placing a node pool
inside one of them.

**What a domain is.** On multi-node NVLink systems (a GB200 NVL72 rack: 18 compute trays of
4 GPUs, one 72-GPU NVLink domain; ``catalog.GpuSystem``) NVML reports, per GPU, its fabric
information (``nvmlDeviceGetGpuFabricInfo`` / ``nvmlDeviceGetGpuFabricInfoV``:
``clusterUuid`` (16 bytes), ``cliqueId`` (unsigned int), ``state`` (``NVML_GPU_FABRIC_STATE_*``:
0 not supported, 1 not started, 2 in progress, 3 completed) and ``status`` (an NVML return code,
meaningful once the state is completed); NVML API reference, ``nvmlGpuFabricInfo_t``). GPUs
with the same cluster UUID and clique id can reach each other over NVLink. NVKE's label for a
domain is ``<clusterUuid>.<cliqueId>``, the value GPU Feature Discovery gives the node label
``nvidia.com/gpu.clique`` (shared catalog ``gpu_operator.md``) and NVIDIA's DRA driver writes
as a ComputeDomain node's ``cliqueID``.

**One truth.** A host's domain is stored once, on the host (``Host.nvlink_cluster_uuid`` +
``Host.nvlink_clique_id``): an operator may give it at import; the agent's per-GPU fabric
info then decides (:func:`apply_reported_fabric`): when every GPU reports a completed
registration with the same domain, that is the host's domain; when its GPUs disagree, or a
registration is not complete or failed, the host has no domain (it cannot take part in a
multi-node pool) and carries a warning saying why. Per-GPU fabric info is not stored.

**Placement.** A node pool with ``same_nvlink_domain`` places all its nodes in one domain
(:func:`claim_in_one_domain`): a pool that already has nodes stays in their domain (scale-up,
replacements); a new one goes to the domain that fits it most tightly (fewest nodes of its
shape left over, so large domains stay free for large pools). When no domain has room,
:class:`NvlinkDomainFull` names the largest free domain and how many nodes of the shape fit
there.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.db import connection, transaction

from . import host_warnings, placement
from .choices import SCHEDULABLE_HOST_STATES
from .formats import FormatError
from .models import Gpu, Host

#: NVML_GPU_FABRIC_STATE_* (nvml.h), by value, as the wire names them
FABRIC_STATES = ("not_supported", "not_started", "in_progress", "completed")
#: NVML's cliqueId is an unsigned int
MAX_CLIQUE_ID = 2**32 - 1
#: nvmlReturn_t values are small non-negative ints (NVML_SUCCESS 0 … NVML_ERROR_UNKNOWN 999)
MAX_NVML_RETURN = 999
#: the warning prefix on hosts whose domain the agent's report could not settle
WARNING_PREFIX = host_warnings.NVLINK_DOMAIN


@dataclass(frozen=True, order=True)
class Domain:
    """One NVLink domain: fabric cluster UUID + clique id."""

    cluster_uuid: uuid.UUID
    clique_id: int

    @property
    def label(self) -> str:
        """``<clusterUuid>.<cliqueId>`` (GFD's ``nvidia.com/gpu.clique`` value)."""
        return f"{self.cluster_uuid}.{self.clique_id}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "cluster_uuid": str(self.cluster_uuid),
            "clique_id": self.clique_id,
            "label": self.label,
        }


def host_domain(host: Host) -> Domain | None:
    """The domain stored on ``host`` (None when it has none)."""
    if host.nvlink_cluster_uuid is None or host.nvlink_clique_id is None:
        return None
    return Domain(host.nvlink_cluster_uuid, int(host.nvlink_clique_id))


# --- formats ------------------------------------------------------------------------------------


def parse_cluster_uuid(value: Any, field: str) -> uuid.UUID:
    """A fabric cluster UUID: the canonical ``8-4-4-4-12`` hex form (NVML gives 16 bytes; the
    agent sends them formatted). The all-zero UUID means "no cluster" and is refused.
    Raises FormatError ``invalid_cluster_uuid``."""
    text = value if isinstance(value, str) else None
    try:
        if text is None or len(text) != 36:
            raise ValueError(text)
        parsed = uuid.UUID(text)
    except ValueError:
        raise FormatError(
            field,
            "invalid_cluster_uuid",
            f"{str(value)[:80]!r} is not a fabric cluster UUID "
            "(xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
        ) from None
    if parsed.int == 0:
        raise FormatError(field, "invalid_cluster_uuid", "the all-zero UUID names no cluster")
    return parsed


def parse_clique_id(value: Any, field: str, *, text: bool = False) -> int:
    """A fabric clique id: an integer in [0, 2^32 - 1] (NVML's unsigned int); with ``text``
    also its decimal digits (a form post). Raises FormatError ``invalid_clique_id``."""
    if text and isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CLIQUE_ID:
        raise FormatError(
            field, "invalid_clique_id", f"clique id must be an integer in [0, {MAX_CLIQUE_ID}]"
        )
    return value


def check_fabric(value: Any, field: str) -> None:
    """The wire format of ``inventory.gpus[i].fabric`` (agent/README.md): null, or
    ``{"state": one of FABRIC_STATES, "status": int | null, "cluster_uuid": str | null,
    "clique_id": int | null}``; the two ids come together (NVML's all-zero cluster UUID is sent
    as null: no cluster). Raises FormatError naming the field."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise FormatError(field, "invalid_type", "fabric must be an object or null")
    unknown = sorted(set(value) - {"state", "status", "cluster_uuid", "clique_id"})
    if unknown:
        raise FormatError(f"{field}.{unknown[0]}"[:200], "unknown_field", "not a fabric field")
    if value.get("state") not in FABRIC_STATES:
        raise FormatError(f"{field}.state", "invalid_value", f"one of {', '.join(FABRIC_STATES)}")
    status = value.get("status")
    if status is not None and (
        isinstance(status, bool)
        or not isinstance(status, int)
        or not 0 <= status <= MAX_NVML_RETURN
    ):
        raise FormatError(
            f"{field}.status", "invalid_value", f"an NVML return code in [0, {MAX_NVML_RETURN}]"
        )
    for key, parse in (("cluster_uuid", parse_cluster_uuid), ("clique_id", parse_clique_id)):
        if value.get(key) is not None:
            parse(value[key], f"{field}.{key}")
    if (value.get("cluster_uuid") is None) != (value.get("clique_id") is None):
        missing = "clique_id" if value.get("clique_id") is None else "cluster_uuid"
        raise FormatError(
            f"{field}.{missing}", "required", "cluster_uuid and clique_id come together"
        )


# --- the host's domain from the agent -----------------------------------------------------------


@dataclass(frozen=True)
class ReportedDomain:
    """What a report says of the host's domain: ``known`` False when no GPU reported fabric
    info (or every GPU says not supported: not a multi-node NVLink system), so the stored
    domain stays; otherwise ``domain`` (None: no usable domain) and ``problem`` in words."""

    known: bool
    domain: Domain | None = None
    problem: str = ""


def domain_from_gpus(gpus: Sequence[dict[str, Any]]) -> ReportedDomain:
    """The host's domain from its GPUs' (validated) ``fabric`` entries (see the module
    docstring for the rule)."""
    fabrics = [(g.get("uuid"), g.get("fabric")) for g in gpus]
    reported = [(u, f) for u, f in fabrics if isinstance(f, dict)]
    if not reported or all(f["state"] == "not_supported" for _, f in reported):
        return ReportedDomain(known=False)
    pending = [
        str(u)
        for u, f in reported
        if f["state"] != "completed" or (f.get("status") or 0) != 0 or f.get("clique_id") is None
    ]
    if pending or len(reported) < len(fabrics):
        names = pending + [str(u) for u, f in fabrics if not isinstance(f, dict)]
        return ReportedDomain(
            known=True,
            problem=f"fabric registration not complete or failed on GPU(s) {', '.join(names)}",
        )
    domains = {Domain(uuid.UUID(f["cluster_uuid"]), int(f["clique_id"])): u for u, f in reported}
    if len(domains) > 1:
        listed = ", ".join(f"{gpu} in {d.label}" for d, gpu in sorted(domains.items()))
        return ReportedDomain(known=True, problem=f"GPUs disagree on the domain: {listed}")
    return ReportedDomain(known=True, domain=next(iter(domains)))


def apply_reported_fabric(host: Host, gpus: Sequence[dict[str, Any]]) -> dict[str, str | None]:
    """Store the domain the agent's inventory (``gpus``, validated) gives ``host``; returns the
    change of the host's ``nvlink domain:`` warning for :func:`fleet.host_warnings.
    set_host_warnings` (``{}``: the inventory does not tell; ``{prefix: None}``: clear it).
    Runs inside ingestion's transaction."""
    reported = domain_from_gpus(gpus)
    if not reported.known:
        return {}
    out: dict[str, str | None] = {WARNING_PREFIX: None}
    if reported.problem:
        out[WARNING_PREFIX] = (
            f"{WARNING_PREFIX} {reported.problem}; the host is in no NVLink domain"
        )
    domain = reported.domain
    if domain != host_domain(host):
        Host.objects.filter(pk=host.pk).update(
            nvlink_cluster_uuid=domain.cluster_uuid if domain else None,
            nvlink_clique_id=domain.clique_id if domain else None,
        )
        host.nvlink_cluster_uuid = domain.cluster_uuid if domain else None
        host.nvlink_clique_id = domain.clique_id if domain else None
    return out


# --- capacity per domain ------------------------------------------------------------------------


@dataclass(frozen=True)
class DomainRoom:
    """Free room of one domain for nodes of one shape: ``hosts`` schedulable hosts the tenant
    may use, ``free_gpus`` usable free GPUs on them, ``nodes`` how many ``gpus_per_node``
    nodes fit (sum over hosts of free GPUs // GPUs per node: a node never spans hosts)."""

    domain: Domain
    hosts: int
    free_gpus: int
    nodes: int

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.domain.as_dict(),
            "hosts": self.hosts,
            "free_gpus": self.free_gpus,
            "nodes_that_fit": self.nodes,
        }


_ROOMS_SQL = """
SELECT nvlink_cluster_uuid, nvlink_clique_id, COUNT(*), SUM(free_gpus), SUM(free_gpus / %(k)s)
  FROM fleet_host
 WHERE gpu_model_id = %(model)s AND state = ANY(%(states)s)
   AND nvlink_cluster_uuid IS NOT NULL
   AND (region = %(where)s OR zone = %(where)s OR zone LIKE %(prefix)s)
   AND (held_tenants <@ ARRAY[%(tenant)s]::uuid[]
        OR (%(shares)s AND exclusive_tenants <@ ARRAY[%(tenant)s]::uuid[]))
   AND NOT EXISTS (SELECT 1 FROM unnest(%(fenced_c)s::uuid[], %(fenced_q)s::bigint[]) f(c, q)
                    WHERE f.c = nvlink_cluster_uuid AND f.q = nvlink_clique_id)
   AND (%(only_c)s::uuid IS NULL
        OR (nvlink_cluster_uuid = %(only_c)s::uuid AND nvlink_clique_id = %(only_q)s))
 GROUP BY nvlink_cluster_uuid, nvlink_clique_id
"""


def domain_rooms(
    *,
    gpu_model: str,
    region: str,
    tenant_id: uuid.UUID,
    gpus_per_node: int,
    shares: bool = False,
    reservation_id: uuid.UUID | None = None,
    only: tuple[uuid.UUID, int] | None = None,
) -> list[DomainRoom]:
    """Every domain of ``gpu_model`` hosts in ``region`` (or a zone of it), with its free room
    for ``gpus_per_node``-GPU nodes of ``tenant_id`` (same tenancy rule as placement), most
    room first. One query over the hosts' trigger-kept GPU summary. Domains fenced for a claim
    of ``reservation_id`` (:func:`fleet.placement.fenced_domains`) are left out; ``only``
    keeps one domain (a pool on a reservation of that whole domain)."""
    fenced = sorted(placement.fenced_domains(gpu_model, _region(region), reservation_id))
    with connection.cursor() as cursor:
        cursor.execute(
            _ROOMS_SQL,
            {
                "k": gpus_per_node,
                "model": gpu_model,
                "states": [str(s) for s in SCHEDULABLE_HOST_STATES],
                "where": region,
                "prefix": region.replace("%", "").replace("_", "\\_") + "%",
                "tenant": tenant_id,
                "shares": shares,
                "fenced_c": [c for c, _ in fenced],
                "fenced_q": [q for _, q in fenced],
                "only_c": only[0] if only else None,
                "only_q": only[1] if only else None,
            },
        )
        rows = cursor.fetchall()
    rooms = [
        DomainRoom(Domain(cluster, int(clique)), int(hosts), int(free or 0), int(nodes or 0))
        for cluster, clique, hosts, free, nodes in rows
    ]
    return sorted(rooms, key=lambda r: (-r.nodes, r.domain))


def _region(where: str) -> str:
    """The region of a region or zone name (a reservation is per region)."""
    from .models import region_of_zone

    return region_of_zone(where) or where


def pool_domains(group_id: uuid.UUID) -> set[Domain | None]:
    """The domains of the hosts holding GPUs of group ``group_id`` (a node pool); None stands
    for a host without a domain. Empty when the group holds nothing."""
    rows = (
        Host.objects.filter(gpus__holder_group_id=group_id)
        .values_list("nvlink_cluster_uuid", "nvlink_clique_id")
        .distinct()
    )
    return {Domain(c, int(q)) if c is not None and q is not None else None for c, q in rows}


def held_nodes(group_id: uuid.UUID) -> int:
    """How many holders (nodes) of group ``group_id`` hold GPUs now."""
    return Gpu.objects.filter(holder_group_id=group_id).values("holder_id").distinct().count()


class NvlinkDomainFull(Exception):
    """No NVLink domain has room for the nodes (nothing was claimed). ``largest`` is the
    domain with the most room for this shape (None when there is no domain at all);
    ``pinned`` the pool's own domain when it already has nodes."""

    code = "nvlink_domain_full"

    def __init__(
        self,
        *,
        nodes: int,
        gpus_per_node: int,
        gpu_model: str,
        largest: DomainRoom | None,
        pinned: DomainRoom | None = None,
        split: bool = False,
    ) -> None:
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.gpu_model = gpu_model
        self.largest = largest
        self.pinned = pinned
        shape = f"{nodes} node(s) of {gpus_per_node} x {gpu_model}"
        if split:
            text = (
                "the pool's nodes are not in one NVLink domain (a host of theirs has no "
                f"domain or their hosts disagree); {shape} cannot be added to it"
            )
        elif pinned is not None:
            text = (
                f"the pool's NVLink domain {pinned.domain.label} has room for "
                f"{pinned.nodes} more node(s) of that shape; {shape} were asked for"
            )
        elif largest is None:
            text = f"no NVLink domain of {gpu_model} hosts in this region for {shape}"
        else:
            text = (
                f"no NVLink domain has room for {shape}; the largest free domain is "
                f"{largest.domain.label} with room for {largest.nodes} node(s) of that shape "
                f"({largest.free_gpus} free GPUs on {largest.hosts} host(s))"
            )
        super().__init__(text)

    def as_extra(self) -> dict[str, Any]:
        """Problem details for the API's 409."""
        return {
            "nodes_requested": self.nodes,
            "largest_free_domain": self.largest.as_dict() if self.largest else None,
            "pool_domain": self.pinned.as_dict() if self.pinned else None,
        }


def check_room(
    *,
    gpu_model: str,
    region: str,
    tenant_id: uuid.UUID,
    gpus_per_node: int,
    nodes: int,
    group_id: uuid.UUID | None = None,
    reservation_id: uuid.UUID | None = None,
    only: tuple[uuid.UUID, int] | None = None,
) -> DomainRoom:
    """The domain ``nodes`` more nodes would go to now (advisory: placement decides under
    host locks). A pool that already holds GPUs (``group_id``) is pinned to its domain;
    ``reservation_id`` / ``only`` as in :func:`domain_rooms`. Raises NvlinkDomainFull."""
    rooms = domain_rooms(
        gpu_model=gpu_model,
        region=region,
        tenant_id=tenant_id,
        gpus_per_node=gpus_per_node,
        reservation_id=reservation_id,
        only=only,
    )
    candidates = _candidates(rooms, nodes, group_id, gpu_model, gpus_per_node)
    return candidates[0]


def _candidates(
    rooms: list[DomainRoom],
    nodes: int,
    group_id: uuid.UUID | None,
    gpu_model: str,
    gpus_per_node: int,
) -> list[DomainRoom]:
    """Domains to try, best fit first; raises NvlinkDomainFull when none has room."""
    largest = rooms[0] if rooms else None
    pinned = pool_domains(group_id) if group_id is not None else set()
    if pinned:
        domain = next(iter(pinned)) if len(pinned) == 1 else None
        if domain is None:
            raise NvlinkDomainFull(
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                gpu_model=gpu_model,
                largest=largest,
                split=True,
            )
        room = next((r for r in rooms if r.domain == domain), DomainRoom(domain, 0, 0, 0))
        if room.nodes >= nodes:
            return [room]
        raise NvlinkDomainFull(
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            gpu_model=gpu_model,
            largest=largest,
            pinned=room,
        )
    fitting = sorted((r for r in rooms if r.nodes >= nodes), key=lambda r: (r.nodes, r.domain))
    if not fitting:
        raise NvlinkDomainFull(
            nodes=nodes, gpus_per_node=gpus_per_node, gpu_model=gpu_model, largest=largest
        )
    return fitting


def claim_in_one_domain(
    requests: Sequence[placement.GpuRequest], *, group_id: uuid.UUID
) -> list[placement.Placement]:
    """:func:`fleet.placement.claim_gpus` for a node pool whose nodes must share one NVLink
    domain (``requests`` all of one shape, ``group_id`` the pool). Must run inside the
    caller's transaction, like claim_gpus; idempotent per holder.

    The pool's domain if it already holds GPUs, else the best-fitting domain with room (then
    the next, should the claim find it fuller than its summary said). Raises
    NvlinkDomainFull, or PlacementContended from claim_gpus (retry shortly).
    """
    if not requests:
        return []
    first = requests[0]
    holding = set(
        Gpu.objects.filter(holder_id__in=[r.holder_id for r in requests])
        .values_list("holder_id", flat=True)
        .distinct()
    )
    needed = sum(1 for r in requests if r.holder_id not in holding)
    rooms = domain_rooms(
        gpu_model=first.gpu_model,
        region=first.zone or first.region,
        tenant_id=first.tenant_id,
        gpus_per_node=first.gpus,
        shares=first.shares_host,
        reservation_id=first.reservation_id,
        only=first.nvlink_domain,  # a pool on a reservation of one whole domain
    )
    candidates = _candidates(rooms, needed, group_id, first.gpu_model, first.gpus)
    for room in candidates:
        pinned = [
            replace(
                r,
                group_id=group_id,
                nvlink_domain=(room.domain.cluster_uuid, room.domain.clique_id),
            )
            for r in requests
        ]
        try:
            with transaction.atomic():  # a savepoint: a failed try leaves nothing behind
                return placement.claim_gpus(pinned)
        except (placement.InsufficientCapacity, placement.PlacementScrubbing):
            continue  # the next domain (a scrub anywhere in the region says nothing of this one)
    raise NvlinkDomainFull(
        nodes=needed,
        gpus_per_node=first.gpus,
        gpu_model=first.gpu_model,
        largest=rooms[0] if rooms else None,
    )
