"""The placement hook: keeps on-demand claims off reserved GPUs, and reservation claims inside
their reservation (registered with :data:`fleet.placement.CLAIM_HOOKS` by the app config).

:func:`check_claims` runs inside :func:`fleet.placement.claim_gpus`'s transaction, after the
GPUs were written, so the counts it reads include this claim. Raising rolls the whole claim
back (the caller's transaction): nothing stays held.

* A request with ``reservation_id``: the reservation row is locked (two pools of one
  reservation serialise on it), must be ACTIVE, of the same tenant, model and region; a
  :class:`~reservations.models.ReservationClaim` row records the node; the GPUs its nodes
  then hold must not exceed ``gpus``.
* An on-demand request: under the (model, region) lock of :mod:`reservations.admission`,
  ``D + max_{t >= now} R(t) <= C`` must still hold in the region and in every zone with
  zone-scoped reservations; otherwise :class:`ReservedCapacity` names the reservations.
* Every claim: no GPU on a host of an NVLink domain reserved as a whole by another
  reservation, and a claim of such a reservation inside its domain
  (:func:`reservations.fences.check_fences`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from django.utils import timezone

from fleet import placement

from . import capacity
from .admission import lock_pair
from .fences import check_fences
from .models import Reservation, ReservationClaim


class ReservedCapacity(placement.InsufficientCapacity):
    """The fleet has the GPUs, but they are reserved (or the reservation is used up)."""

    def __init__(self, request: placement.GpuRequest, message: str, reservation_ids=()) -> None:
        Exception.__init__(self, message)
        self.request = request
        self.placed = 0
        self.total = 0
        self.reservation_ids = tuple(str(r) for r in reservation_ids)


def check_claims(
    requests: Sequence[placement.GpuRequest], placements: Sequence[placement.Placement]
) -> None:
    """Raise :class:`ReservedCapacity` when the claim just written breaks a reservation."""
    now = timezone.now()
    by_reservation: dict = defaultdict(list)
    on_demand: dict = defaultdict(list)
    for r in requests:
        if r.reservation_id is not None:
            by_reservation[r.reservation_id].append(r)
        else:
            on_demand[(r.gpu_model, r.region)].append(r)
    for reservation_id, members in sorted(by_reservation.items(), key=lambda kv: str(kv[0])):
        _check_reserved(reservation_id, members, now)
    for (model, region), members in sorted(on_demand.items()):
        _check_on_demand(model, region, members, now)
    check_fences(requests, placements, now)


def _check_reserved(reservation_id, members: list[placement.GpuRequest], now) -> None:
    first = members[0]
    r = Reservation.objects.select_for_update().filter(pk=reservation_id).first()
    if r is None or r.tenant_id != first.tenant_id:
        raise ReservedCapacity(first, f"reservation {reservation_id} does not exist")
    if not r.is_active(now):
        raise ReservedCapacity(
            first,
            f"reservation {r.label} is {r.state_at(now)} (from {r.start.isoformat()})",
            [r.id],
        )
    if r.gpu_model_id != first.gpu_model or r.region != first.region:
        raise ReservedCapacity(first, f"reservation {r.label} is for {r} ", [r.id])
    ReservationClaim.objects.bulk_create(
        [ReservationClaim(holder_id=m.holder_id, reservation=r, created_at=now) for m in members],
        ignore_conflicts=True,
    )
    used = capacity.reservation_used(r)
    if used > r.gpus:
        raise ReservedCapacity(
            first,
            f"reservation {r.id} holds {r.gpus} GPU(s); its pools would use {used}",
            [r.id],
        )


def _check_on_demand(model: str, region: str, members: list[placement.GpuRequest], now) -> None:
    if not capacity.live_reservations(model, region, now).exists():
        lock_pair(model, region, shared=True)
        if capacity.live_reservations(model, region, now).exists():
            # a reservation was admitted between the look and the lock: decide again, later
            raise placement.PlacementContended(members[0], locked_hosts=0)
        return
    lock_pair(model, region)
    counts = capacity.fleet_counts(model, region, now)
    live = list(capacity.live_reservations(model, region, now))
    demand = capacity.demands(live, now)
    zones = sorted({d.zone for d in demand if d.zone})
    for zone in ["", *zones]:
        scoped = [d for d in demand if d.zone == zone] if zone else demand
        cap, held = capacity.totals(counts, zone)
        top = capacity.peak(scoped, now, None)
        if held + top > cap:
            ids = [d.reservation_id for d in scoped]
            needed = sum(m.gpus for m in members)
            raise ReservedCapacity(
                members[0],
                f"{needed} x {model} GPU(s) on-demand in {zone or region}: {top} of its {cap} "
                f"GPU(s) are reserved ({len(ids)} reservation(s)) and {held - needed} already "
                f"run on-demand; unreserved pools cannot take reserved GPUs",
                ids,
            )
