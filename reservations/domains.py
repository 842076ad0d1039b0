"""Reserving a whole multi-node NVLink domain (``nvlink_domain`` on a reservation request).

A domain is the set of hosts sharing one fabric cluster UUID and clique id
(:mod:`fleet.nvlink_domains`; the label ``<clusterUuid>.<cliqueId>`` is GPU Feature
Discovery's ``nvidia.com/gpu.clique``). Its reservation holds *every* GPU of those hosts that
counts as capacity (:mod:`reservations.capacity`: schedulable dedicated hosts, GPUs healthy or
held) for the window, and fences the hosts (:mod:`reservations.fences`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q

from fleet.formats import FormatError
from fleet.models import Gpu, Host, host_in_region
from fleet.nvlink_domains import parse_clique_id, parse_cluster_uuid
from nvke.errors import Conflict, InvalidInput

from . import capacity
from .models import ReservationClaim

FIELD = "nvlink_domain"


@dataclass(frozen=True)
class DomainScope:
    cluster_uuid: uuid.UUID
    clique_id: int
    gpus: int
    host_ids: tuple

    @property
    def label(self) -> str:
        return f"{self.cluster_uuid}.{self.clique_id}"


def parse_label(label: str) -> tuple[uuid.UUID, int]:
    """``<clusterUuid>.<cliqueId>`` -> (UUID, clique id). InvalidInput naming ``nvlink_domain``
    (``invalid_cluster_uuid`` / ``invalid_clique_id``)."""
    cluster, _, clique = str(label).rpartition(".")
    try:
        return parse_cluster_uuid(cluster, FIELD), parse_clique_id(clique, FIELD, text=True)
    except FormatError as exc:
        raise InvalidInput(
            f"{exc}; nvlink_domain is <clusterUuid>.<cliqueId>", code=exc.code, field=FIELD
        ) from exc


def resolve(*, gpu_model: str, region: str, zone: str, label: str, gpus: int | None) -> DomainScope:
    """The domain named by ``label``, checked against the request. InvalidInput:
    ``zone_with_nvlink_domain`` (``zone``: a domain is its own scope),
    ``unknown_nvlink_domain`` (no host has it), ``nvlink_domain_mismatch`` (its hosts are of
    another GPU model or outside ``region``), ``nvlink_domain_gpus`` (``gpus`` given and not
    the domain's count); Conflict ``nvlink_domain_unavailable`` (no GPU of it counts as
    capacity now: hosts cordoned, failed …)."""
    if zone:
        raise InvalidInput(
            "a reservation of a whole NVLink domain takes no zone (the domain is its scope)",
            code="zone_with_nvlink_domain",
            field="zone",
        )
    cluster, clique = parse_label(label)
    hosts = list(
        Host.objects.filter(nvlink_cluster_uuid=cluster, nvlink_clique_id=clique).values_list(
            "id", "gpu_model_id", "zone", "region"
        )
    )
    if not hosts:
        raise InvalidInput(
            f"no host is in NVLink domain {cluster}.{clique}",
            code="unknown_nvlink_domain",
            field=FIELD,
        )
    foreign = [(m, z) for _, m, z, r in hosts if m != gpu_model or not host_in_region(r, z, region)]
    if foreign:
        m, z = foreign[0]
        raise InvalidInput(
            f"NVLink domain {cluster}.{clique} has {m} hosts in {z}; the reservation is for "
            f"{gpu_model} in {region}",
            code="nvlink_domain_mismatch",
            field=FIELD,
        )
    host_ids = tuple(h for h, *_ in hosts)
    count = (
        Gpu.objects.filter(
            host_id__in=host_ids,
            host__state__in=("AVAILABLE", "ALLOCATED"),
            host__tenancy="dedicated",
        )
        .filter(Q(health="HEALTHY", missing_since__isnull=True) | Q(holder_id__isnull=False))
        .count()
    )
    if gpus is not None and gpus != count:
        raise InvalidInput(
            f"NVLink domain {cluster}.{clique} has {count} GPU(s); leave gpus out or give {count}",
            code="nvlink_domain_gpus",
            field="gpus",
            extra={"domain_gpus": count},
        )
    if count == 0:
        raise Conflict(
            f"no GPU of NVLink domain {cluster}.{clique} can be handed out now",
            code="nvlink_domain_unavailable",
            field=FIELD,
        )
    return DomainScope(cluster, clique, count, host_ids)


def check_free(
    scope: DomainScope,
    live: list,
    demand: list[capacity.Demand],
    start: datetime,
    end: datetime | None,
) -> None:
    """Under the (model, region) lock: no other reservation of this domain over the window
    (Conflict ``nvlink_domain_reserved``, with its ``reserved_from`` / ``reserved_until``), and
    no GPU of it held by a node that is not on an earlier reservation of this same domain
    (Conflict ``nvlink_domain_in_use``, ``held_gpus``): an on-demand node has no end, so it
    would hold the GPU into the window."""
    same = {r.id for r in live if r.nvlink_domain == (scope.cluster_uuid, scope.clique_id)}
    for d in demand:
        if d.reservation_id not in same:
            continue
        if (end is None or d.start < end) and (d.end is None or d.end > start):
            raise Conflict(
                f"NVLink domain {scope.label} is reserved from {d.start.isoformat()}"
                + (f" until {d.end.isoformat()}" if d.end else " with no end"),
                code="nvlink_domain_reserved",
                field=FIELD,
                extra={
                    "reserved_from": d.start.isoformat(),
                    "reserved_until": d.end.isoformat() if d.end else None,
                },
            )
    mine = ReservationClaim.objects.filter(reservation_id__in=same).values("holder_id")
    held = (
        Gpu.objects.filter(host_id__in=scope.host_ids, holder_id__isnull=False)
        .exclude(holder_id__in=mine)
        .count()
    )
    if held:
        raise Conflict(
            f"{held} GPU(s) of NVLink domain {scope.label} are held by running nodes; a whole "
            "domain can only be reserved while none of its GPUs is in use",
            code="nvlink_domain_in_use",
            field=FIELD,
            extra={"held_gpus": held},
        )
