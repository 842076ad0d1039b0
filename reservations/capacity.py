"""Counting capacity over time for one (GPU model, region) and, inside it, one zone.

Terms (whole GPUs of the model, on dedicated hosts (a shared host sells MIG instances, never whole
GPUs: fleet.shared_hosts) in a schedulable state, ``AVAILABLE``/``ALLOCATED``):

* **capacity** ``C``: GPUs that can be handed out or are held (healthy and listed by the
  agent, or held by a node). Counted now; a host lost later lowers it (the calendar then shows
  ``overcommitted`` and the operator's fleet is short, see the README).
* **on-demand** ``D``: GPUs held now by nodes that do not draw from an active reservation.
  On-demand nodes have no end time, so ``D`` counts at *every* future instant.
* **reserved** ``R(t)``: the sum of ``gpus`` of the reservations in force at ``t``. A
  ``keep`` reservation that has not ended yet counts for every instant after its ``end`` too
  (its nodes may continue on-demand, up to its size); once it ended its nodes are in ``D``.

The invariant admission keeps (:mod:`reservations.admission`) and placement checks
(:mod:`reservations.guard`): ``D + R(t) <= C`` for every ``t >= now``, in the region and in
every zone that has zone-scoped reservations (the region-wide ones may use any zone, so those
two checks are enough for the counts to fit). Counts, not host shapes: a pool whose nodes
need whole hosts can still meet fragmentation (``GET /api/v1/fleet/fragmentation``), so *when*
on-demand nodes become placeable (:func:`placeable_from`) asks the placement planner too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.models import Q

from fleet import placement
from fleet.models import host_in_region
from fleet.placement import GpuRequest

from .choices import EndAction
from .models import Reservation


@dataclass(frozen=True)
class Demand:
    """One reservation's count over ``[start, end)`` (``end`` None: for ever)."""

    reservation_id: object
    gpus: int
    start: datetime
    end: datetime | None
    zone: str = ""


_COUNTS_SQL = """
SELECT h.zone, h.region,
       count(*) FILTER (WHERE (g.health = 'HEALTHY' AND g.missing_since IS NULL)
                              OR g.holder_id IS NOT NULL),
       count(*) FILTER (WHERE g.holder_id IS NOT NULL AND r.id IS NULL)
  FROM fleet_gpu g
  JOIN fleet_host h ON h.id = g.host_id
  LEFT JOIN reservations_reservationclaim c ON c.holder_id = g.holder_id
  LEFT JOIN reservations_reservation r
         ON r.id = c.reservation_id AND r.start <= %(now)s
        AND (r.end IS NULL OR r.end > %(now)s)
        AND (r.cancelled_at IS NULL OR r.cancelled_at > %(now)s)
 WHERE h.gpu_model_id = %(model)s AND h.state IN ('AVAILABLE', 'ALLOCATED')
   AND h.tenancy = 'dedicated'
   AND (h.region = %(region)s OR h.zone LIKE %(prefix)s)
 GROUP BY h.zone, h.region
"""


def fleet_counts(model: str, region: str, now: datetime) -> dict[str, tuple[int, int]]:
    """``{zone: (capacity, on_demand)}`` of ``model`` in ``region`` now (one query)."""
    prefix = region.replace("%", "").replace("_", "\\_") + "%"
    with connection.cursor() as cursor:
        cursor.execute(
            _COUNTS_SQL, {"model": model, "region": region, "prefix": prefix, "now": now}
        )
        rows = cursor.fetchall()
    counts: dict[str, tuple[int, int]] = {}
    for zone, host_region, cap, held in rows:  # the SQL's candidates; the rule decides
        if host_in_region(host_region, zone, region):
            before = counts.get(zone, (0, 0))
            counts[zone] = (before[0] + int(cap), before[1] + int(held))
    return counts


def totals(counts: dict[str, tuple[int, int]], zone: str = "") -> tuple[int, int]:
    """``(capacity, on_demand)`` of the region (``zone`` "") or of one zone."""
    rows = [v for z, v in counts.items() if not zone or z == zone]
    return sum(c for c, _ in rows), sum(d for _, d in rows)


def live_reservations(model: str, region: str, now: datetime):
    """Reservations of ``model`` in ``region`` that still count at or after ``now``."""
    return Reservation.objects.filter(gpu_model_id=model, region=region).filter(
        Q(cancelled_at__isnull=True) | Q(cancelled_at__gt=now),
        Q(end__isnull=True) | Q(end__gt=now) | Q(end_action=EndAction.KEEP, ended_at__isnull=True),
    )


def demands(reservations: Iterable[Reservation], now: datetime) -> list[Demand]:
    """Each reservation's accounting interval (see the module docstring for ``keep``)."""
    out = []
    for r in reservations:
        end = r.effective_end()
        cancelled = r.cancelled_at is not None and (r.end is None or r.cancelled_at < r.end)
        if r.end_action == EndAction.KEEP and not cancelled and r.ended_at is None:
            end = None  # its nodes may carry on on-demand after the end
        if end is not None and end <= now:
            continue
        out.append(Demand(r.id, r.gpus, r.start, end, r.zone))
    return out


def reserved_at(demand: Sequence[Demand], t: datetime) -> int:
    return sum(d.gpus for d in demand if d.start <= t and (d.end is None or t < d.end))


def breakpoints(demand: Sequence[Demand], start: datetime, end: datetime | None) -> list[datetime]:
    """``start`` and every demand boundary inside ``(start, end)``, sorted."""
    points = {start}
    for d in demand:
        for t in (d.start, d.end):
            if t is not None and t > start and (end is None or t < end):
                points.add(t)
    return sorted(points)


def peak(demand: Sequence[Demand], start: datetime, end: datetime | None) -> int:
    """The largest ``R(t)`` for ``t`` in ``[start, end)`` (``end`` None: for ever).

    ``R`` is a step function that only changes at demand boundaries, so its maximum over a
    window is its maximum at the window's start and at the boundaries inside it.
    """
    return max((reserved_at(demand, t) for t in breakpoints(demand, start, end)), default=0)


@dataclass(frozen=True)
class OnDemandRoom:
    """What an on-demand (unreserved) claim may take in a region now.

    ``held_by_reservations``: GPUs that nodes of active reservations hold now
    (:func:`held_by_reservations`): a fact of the fleet, whatever is asked of it.
    ``scrubbing``: free GPUs of ``C`` whose scrub after their last release is not confirmed
    yet (:func:`fleet.placement.scrubbing_gpus`): capacity, but placement hands none out
    until the scrub is done, so they are not free now."""

    capacity: int
    on_demand: int
    reserved_peak: int
    reservation_ids: tuple
    held_by_reservations: int
    scrubbing: int = 0

    @property
    def unreserved(self) -> int:
        """GPUs no on-demand node and no reservation counts on: ``C - D - max_{t >= now}
        R(t)`` (the guard's counts; scrubbing GPUs included: they come back)."""
        return max(self.capacity - self.on_demand - self.reserved_peak, 0)

    @property
    def free(self) -> int:
        """GPUs an on-demand pool may take now: :attr:`unreserved` less the GPUs being
        scrubbed (the placement, :mod:`fleet.placeable` and the fragmentation report do not
        count those as free either)."""
        return max(self.unreserved - self.scrubbing, 0)


def on_demand_room(model: str, region: str, now: datetime, zone: str = "") -> OnDemandRoom:
    """Room for on-demand GPUs of ``model`` in ``region`` (or ``zone``) now."""
    counts = fleet_counts(model, region, now)
    capacity, held = totals(counts, zone)
    live = list(live_reservations(model, region, now))
    demand = [d for d in demands(live, now) if not zone or not d.zone or d.zone == zone]
    top = peak(demand, now, None)
    return OnDemandRoom(
        capacity=capacity,
        on_demand=held,
        reserved_peak=top,
        reservation_ids=tuple(d.reservation_id for d in demand),
        held_by_reservations=_held_by_active(live, now, zone),
        scrubbing=placement.scrubbing_count(model, region, zone or None),
    )


def held_by_reservations(
    model: str, region: str, now: datetime, *, zone: str = "", other_than=None
) -> int:
    """GPUs of ``model`` in ``region`` (or ``zone``) on schedulable hosts that nodes drawing
    from reservations active at ``now`` hold, leaving out reservation ``other_than`` (a pool's
    own): the same figure whatever size of pool asks."""
    live = [r for r in live_reservations(model, region, now) if r.pk != other_than]
    return _held_by_active(live, now, zone)


def _held_by_active(reservations: Sequence[Reservation], now: datetime, zone: str) -> int:
    from fleet.models import Gpu

    active = [r.id for r in reservations if r.is_active(now)]
    if not active:
        return 0
    qs = Gpu.objects.filter(
        holder_id__in=claim_holders(active), host__state__in=("AVAILABLE", "ALLOCATED")
    )
    if zone:
        qs = qs.filter(host__zone=zone)
    return qs.count()


def claim_holders(reservation_ids):
    """Subquery: the holder ids (nodes) placed on these reservations."""
    from .models import ReservationClaim

    return ReservationClaim.objects.filter(reservation_id__in=reservation_ids).values("holder_id")


def placeable_from(
    requests: Sequence[GpuRequest], now: datetime, zone: str = ""
) -> datetime | None:
    """The earliest instant ``t >= now`` from which the on-demand nodes ``requests`` (one
    model and region, no reservation) fit for good, or None when they never do as the fleet is
    now. ``now`` itself when they fit now.

    At each instant a reservation boundary can change things (``now``, then each start and
    end), both must hold: the counts (``D + needed + max_{s >= t} R(s) <= C``, the guard's
    invariant, :mod:`reservations.guard`) and the shapes — the placement planner places every
    node (:func:`fleet.placement.fits`) on the fleet as it will be at ``t``: the nodes of the
    reservations whose demand ended by ``t`` gone (drained at the end; a ``keep``
    reservation's nodes stay and its demand never ends here). So two hosts with 4 GPUs freed
    each do not make an 8-GPU node placeable. Fenced NVLink domains are taken as they are now.
    """
    if not requests:
        return now
    model, region = requests[0].gpu_model, requests[0].region
    needed = sum(r.gpus for r in requests)
    capacity, held = totals(fleet_counts(model, region, now), zone)
    live = list(live_reservations(model, region, now))
    demand = [d for d in demands(live, now) if not zone or not d.zone or d.zone == zone]
    for t in breakpoints(demand, now, None):
        if held + needed + peak(demand, t, None) > capacity:
            continue
        ended = [d.reservation_id for d in demand if d.end is not None and d.end <= t]
        gone = claim_holders(ended).values_list("holder_id", flat=True) if ended else []
        if placement.fits(requests, released=list(gone)):
            return t
    return None


def reservation_used(reservation: Reservation) -> int:
    """GPUs held now by nodes drawing from ``reservation`` (the fleet's holder rows)."""
    from fleet.models import Gpu

    return Gpu.objects.filter(holder_id__in=claim_holders([reservation.id])).count()


@dataclass(frozen=True)
class ReservedBlock:
    """Why ``needed`` on-demand GPUs do not fit now although the fleet has them: reservations.

    ``reserved``: the most GPUs reserved from now on; ``held_by_reservations``: GPUs their
    pools hold now; ``free_on_demand``: what unreserved pools may take; ``until``: from when
    the nodes fit for good, by counts and host shapes (:func:`placeable_from`; None: never as
    the fleet is now — open-ended or ``keep`` reservations that have not ended, or no host
    shape freed by their ends fits the nodes).
    """

    needed: int
    capacity: int
    on_demand: int
    reserved: int
    held_by_reservations: int
    free_on_demand: int
    until: datetime | None

    def message(self, model: str, where: str) -> str:
        """Words for a tenant: counts and until when (other tenants are never named)."""
        held = (
            f", {self.held_by_reservations} of them held by reservation pools now"
            if self.held_by_reservations
            else ""
        )
        until = (
            f"; placeable from {self.until.isoformat()}, when reservations end"
            if self.until
            else "; no reservation end frees room for the nodes (open-ended or keep "
            "reservations, or no host with room for a node once they end)"
        )
        return (
            f"{self.needed} x {model} GPU(s) on-demand do not fit in {where}: "
            f"{self.reserved} of {self.capacity} GPU(s) are reserved{held}, unreserved pools "
            f"may take {self.free_on_demand}{until}"
        )


def reserved_block(
    requests: Sequence[GpuRequest], now: datetime, zone: str = ""
) -> ReservedBlock | None:
    """A :class:`ReservedBlock` when the on-demand nodes ``requests`` (one model and region)
    would fit in the region (``zone``) by count without the reservations but do not with them;
    None when they fit, or when the fleet is too small for them anyway (``C - D < needed``)."""
    if not requests:
        return None
    model, region = requests[0].gpu_model, requests[0].region
    needed = sum(r.gpus for r in requests)
    if not live_reservations(model, region, now).exists():
        return None
    room = on_demand_room(model, region, now, zone)
    # GPUs being scrubbed come back shortly: only the reservations' counts block here
    if room.unreserved >= needed or room.capacity - room.on_demand < needed:
        return None
    return ReservedBlock(
        needed=needed,
        capacity=room.capacity,
        on_demand=room.on_demand,
        reserved=room.reserved_peak,
        held_by_reservations=room.held_by_reservations,
        free_on_demand=room.unreserved,
        until=placeable_from(requests, now, zone),
    )
