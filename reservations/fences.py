"""Fenced NVLink domains: the hosts of a reserved multi-node NVLink domain are for that
reservation's pools only, from the moment it is admitted until it ends (registered with
:data:`fleet.placement.DOMAIN_FENCES` by the app config).

Why from admission, not from its start: on-demand nodes have no end, so one placed on a
domain host today would still hold it when the reservation starts — the same reason a future
reservation's count lowers the on-demand room now (:mod:`reservations.capacity`). A ``keep``
domain reservation stays fenced until its end is processed (its nodes may run on there).

:func:`fenced_domains` steers placement (the candidate query leaves fenced hosts out);
:func:`check_fences` is the binding check, run by :func:`reservations.guard.check_claims`
under the (model, region) lock inside the claim's transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from django.utils import timezone

from fleet import placement
from fleet.models import Host

from . import capacity
from .admission import lock_pair

Domain = tuple[uuid.UUID, int]


def live_domain_reservations(gpu_model: str, region: str, now: datetime):
    """Live (not ended, not cancelled) reservations of a whole NVLink domain."""
    return capacity.live_reservations(gpu_model, region, now).filter(
        nvlink_cluster_uuid__isnull=False
    )


def fenced_domains(
    gpu_model: str, region: str, reservation_id: uuid.UUID | None, now: datetime | None = None
) -> set[Domain]:
    """Domains of ``gpu_model`` in ``region`` that a claim of ``reservation_id`` (None:
    on-demand) may not use: those reserved by any other live reservation."""
    now = now or timezone.now()
    rows = (
        live_domain_reservations(gpu_model, region, now)
        .exclude(pk=reservation_id)
        .values_list("nvlink_cluster_uuid", "nvlink_clique_id")
    )
    return {(c, int(q)) for c, q in rows}


def check_fences(
    requests: Sequence[placement.GpuRequest], placements: Sequence[placement.Placement], now
) -> None:
    """Raise :class:`reservations.guard.ReservedCapacity` when a placement just written lies
    on a host of a domain fenced for its request, or a claim of a domain reservation lies
    outside its domain."""
    from .guard import ReservedCapacity
    from .models import Reservation

    pairs = {(r.gpu_model, r.region) for r in requests}
    for model, region in sorted(pairs):
        # an admission of a domain reservation (exclusive) waits for this claim to commit and
        # then sees its GPUs held, or has committed before and its fence is read below
        lock_pair(model, region, shared=True)
    own = {
        r.pk: r.nvlink_domain
        for r in Reservation.objects.filter(
            pk__in={q.reservation_id for q in requests if q.reservation_id is not None},
            nvlink_cluster_uuid__isnull=False,
        )
    }
    fenced_any = any(live_domain_reservations(m, g, now).exists() for m, g in pairs)
    if not fenced_any and not own:
        return
    hosts = {
        h: (c, int(q)) if c is not None and q is not None else None
        for h, c, q in Host.objects.filter(pk__in={p.host_id for p in placements}).values_list(
            "id", "nvlink_cluster_uuid", "nvlink_clique_id"
        )
    }
    fenced: dict[tuple, set[Domain]] = {}
    for request, placed in zip(requests, placements, strict=True):
        key = (request.gpu_model, request.region, request.reservation_id)
        if key not in fenced:
            fenced[key] = fenced_domains(*key, now)
        domain = hosts.get(placed.host_id)
        pinned = own.get(request.reservation_id)
        if pinned is not None and domain != pinned:
            raise ReservedCapacity(
                request,
                f"reservation {request.reservation_id} reserves NVLink domain "
                f"{pinned[0]}.{pinned[1]}; host {placed.hostname} is outside it",
                [request.reservation_id],
            )
        if domain is not None and domain in fenced[key]:
            raise ReservedCapacity(
                request,
                f"NVLink domain {domain[0]}.{domain[1]} of host {placed.hostname} is reserved "
                "as a whole; only its reservation's pools may use it",
            )
