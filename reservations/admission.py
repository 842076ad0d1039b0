"""Admitting reservations atomically, and the free-capacity calendar.

**Atomicity.** Everything that can change the invariant of :mod:`reservations.capacity` for a
(GPU model, region) serialises on one PostgreSQL advisory lock, taken inside the caller's
transaction (``pg_advisory_xact_lock``, released at commit or rollback):

* admitting a reservation takes it **exclusively**, then reads ``C``, ``D`` and the
  reservations, checks the peak and inserts: two admissions cannot both read the state
  before the other's insert;
* an on-demand GPU claim (:mod:`reservations.guard`) takes it exclusively when reservations
  exist for the pair, else **shared** (claims without reservations around never wait for each
  other); an admission therefore waits for in-flight claims to commit, and reads their GPUs
  in ``D``.

The lock never waits on a host row lock while holding it in the admission path (admission
locks no host), so it cannot deadlock with placement.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from catalog.services import UnknownGpuModel, get_gpu_model
from fleet.models import Host, zone_in_region
from nvke.errors import Conflict, InvalidInput
from tenants import audit
from tenants.models import Tenant

from . import capacity, domains
from .choices import EndAction
from .models import Reservation

#: Tests switch this off to show the race test fails without the lock.
LOCK_ADMISSION = True
#: Test hook called between reading the state and inserting (None in production).
_after_read = None


def default_name(reservation_id: uuid.UUID) -> str:
    """The name of a reservation created without one: ``r-`` and its id's first 8 hex digits
    (``r-5f0c2a9e``), so every view (nvkectl's NAME, the console, usage's
    ``reservation_name``) names it (a fresh-user trial read blank labels, issue 33)."""
    return f"r-{reservation_id.hex[:8]}"


def lock_pair(model: str, region: str, *, shared: bool = False) -> None:
    """Take the (model, region) advisory lock for the rest of the transaction."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("lock_pair must run inside transaction.atomic()")
    fn = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {fn}(hashtext('nvke.reservations'), hashtext(%s))", [f"{model}/{region}"]
        )


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime | None


def validate_window(start: datetime, end: datetime | None, now: datetime) -> Window:
    """Bounds (400 naming the field): ``start`` not in the past (a minute of clock skew
    allowed) and at most ``NVKE_RESERVATION_MAX_LEAD_DAYS`` ahead; ``end`` after ``start`` by
    at least ``NVKE_RESERVATION_MIN_S`` and at most ``NVKE_RESERVATION_MAX_DAYS``."""
    if start < now - timedelta(minutes=1):
        raise InvalidInput("start is in the past", code="reservation_start_past", field="start")
    if start > now + timedelta(days=settings.NVKE_RESERVATION_MAX_LEAD_DAYS):
        raise InvalidInput(
            f"start is more than {settings.NVKE_RESERVATION_MAX_LEAD_DAYS} days ahead",
            code="reservation_start_too_far",
            field="start",
        )
    if end is not None:
        if (end - start).total_seconds() < settings.NVKE_RESERVATION_MIN_S:
            raise InvalidInput(
                f"end must be at least {settings.NVKE_RESERVATION_MIN_S} s after start",
                code="reservation_too_short",
                field="end",
            )
        if end - start > timedelta(days=settings.NVKE_RESERVATION_MAX_DAYS):
            raise InvalidInput(
                f"a reservation lasts at most {settings.NVKE_RESERVATION_MAX_DAYS} days",
                code="reservation_too_long",
                field="end",
            )
    return Window(start, end)


def create_reservation(
    *,
    actor: str,
    tenant: Tenant,
    gpu_model: str,
    region: str,
    gpus: int | None,
    start: datetime,
    end: datetime | None,
    zone: str = "",
    nvlink_domain: str = "",
    end_action: str = EndAction.KEEP,
    notice_lead_s: int | None = None,
    name: str = "",
    now: datetime | None = None,
) -> Reservation:
    """Admit a reservation or raise.

    InvalidInput: ``unknown_gpu_model`` (field ``gpu_model``), ``zone_not_in_region``
    (``zone``), ``reservation_too_large`` (``gpus``, over ``NVKE_RESERVATION_MAX_GPUS``) and
    the window codes of :func:`validate_window`. Conflict ``reservation_capacity``: at the
    busiest instant of the window the region (or zone) would need more GPUs than it has; the
    error gives ``capacity``, ``on_demand``, ``reserved_peak`` and ``free`` (what could still
    be reserved over that window).

    ``nvlink_domain`` (``<clusterUuid>.<cliqueId>``) reserves every GPU of that multi-node
    NVLink domain's hosts instead of a count (``gpus`` left out, or equal to the domain's
    count): the codes of :func:`reservations.domains.resolve` and
    :func:`reservations.domains.check_free` (``nvlink_domain_reserved``,
    ``nvlink_domain_in_use``), then the same count check as any reservation.
    """
    now = now or timezone.now()
    model = _gpu_model(gpu_model)
    scope = None
    if nvlink_domain:
        scope = domains.resolve(
            gpu_model=model.slug, region=region, zone=zone, label=nvlink_domain, gpus=gpus
        )
        gpus = scope.gpus
    if gpus is None:
        raise InvalidInput(
            "gpus is required (or nvlink_domain, to reserve a whole domain)",
            code="gpus_required",
            field="gpus",
        )
    if not 1 <= gpus <= settings.NVKE_RESERVATION_MAX_GPUS:
        raise InvalidInput(
            f"gpus must be 1..{settings.NVKE_RESERVATION_MAX_GPUS}",
            code="reservation_too_large",
            field="gpus",
        )
    check_zone(zone, region)
    window = validate_window(start, end, now)
    lead = settings.NVKE_RESERVATION_NOTICE_LEAD_S if notice_lead_s is None else notice_lead_s
    with transaction.atomic():
        if LOCK_ADMISSION:
            lock_pair(model.slug, region)
        counts = capacity.fleet_counts(model.slug, region, now)
        live = list(capacity.live_reservations(model.slug, region, now))
        demand = capacity.demands(live, now)
        new = capacity.Demand(None, gpus, window.start, _accounting_end(end, end_action), zone)
        if scope is not None:
            domains.check_free(scope, live, demand, window.start, new.end)
        checks = [("", [*demand, new])]
        if zone:
            checks.append((zone, [*[d for d in demand if d.zone == zone], new]))
        if _after_read is not None:
            _after_read()
        for where, scoped in checks:
            cap, held = capacity.totals(counts, where)
            top = capacity.peak(scoped, window.start, window.end)
            if held + top > cap:
                free = max(cap - held - (top - gpus), 0)
                raise Conflict(
                    f"{gpus} x {model.slug} cannot be reserved in {where or region} over "
                    f"this window: at its busiest instant {held} GPU(s) run on-demand and "
                    f"{top - gpus} are reserved, of {cap}; at most {free} can be reserved",
                    code="reservation_capacity",
                    field="gpus",
                    extra={
                        "capacity": cap,
                        "on_demand": held,
                        "reserved_peak": top - gpus,
                        "free": free,
                    },
                )
        rid = uuid.uuid4()
        reservation = Reservation.objects.create(
            id=rid,
            tenant=tenant,
            name=name or default_name(rid),
            gpu_model=model,
            region=region,
            zone=zone,
            gpus=gpus,
            start=window.start,
            end=end,
            end_action=end_action,
            notice_lead_s=lead,
            nvlink_cluster_uuid=scope.cluster_uuid if scope else None,
            nvlink_clique_id=scope.clique_id if scope else None,
            created_by=actor,
            created_at=now,
        )
        audit.record(
            actor=actor,
            action="reservation.create",
            target_type="reservation",
            target_id=reservation.id,
            tenant_id=tenant.id,
            after={
                "gpu_model": model.slug,
                "region": region,
                "zone": zone,
                "gpus": gpus,
                "start": window.start.isoformat(),
                "end": end.isoformat() if end else None,
                "end_action": end_action,
                "nvlink_domain": scope.label if scope else None,
            },
        )
    return reservation


def _gpu_model(slug: str):
    """The catalog's GPU model ``slug``; InvalidInput ``unknown_gpu_model`` (``gpu_model``)."""
    try:
        return get_gpu_model(slug)
    except UnknownGpuModel as exc:
        raise InvalidInput(
            f"unknown GPU model {slug!r}", code="unknown_gpu_model", field="gpu_model"
        ) from exc


def check_zone(zone: str, region: str) -> None:
    """A zone, when given, is one of ``region``'s: by its name
    (:func:`fleet.models.zone_in_region`, the placement rule), or a host in it was given that
    region (Azure's zone ``1`` of ``eastus``). InvalidInput ``zone_not_in_region`` (field
    ``zone``)."""
    if zone and not (
        zone_in_region(zone, region) or Host.objects.filter(zone=zone, region=region).exists()
    ):
        raise InvalidInput(
            f"zone {zone!r} is not in region {region!r}", code="zone_not_in_region", field="zone"
        )


def _accounting_end(end: datetime | None, end_action: str) -> datetime | None:
    return None if end_action == EndAction.KEEP else end


def calendar(
    *, gpu_model: str, region: str, start: datetime, end: datetime, zone: str = "", now=None
) -> dict:
    """Free capacity of ``gpu_model`` in ``region`` (``zone``) over ``[start, end)``.

    ``{"gpu_model", "region", "zone", "start", "end", "capacity", "on_demand",
    "intervals": [{"start", "end", "capacity", "on_demand", "reserved", "free",
    "overcommitted"}]}`` — one interval per stretch where the reserved count is constant.
    ``free`` = what a reservation covering that interval could still get. Other tenants'
    reservations appear as counts only. ``start`` before now is read from now.

    InvalidInput ``unknown_gpu_model`` (field ``gpu_model``) and ``zone_not_in_region``
    (field ``zone``): a model the catalog does not have, or a zone of another region, would
    answer a calendar of nothing.
    """
    _gpu_model(gpu_model)
    check_zone(zone, region)
    now = now or timezone.now()
    start = max(start, now)
    counts = capacity.fleet_counts(gpu_model, region, now)
    cap, held = capacity.totals(counts, zone)
    live = list(capacity.live_reservations(gpu_model, region, now))
    demand = [d for d in capacity.demands(live, now) if not zone or not d.zone or d.zone == zone]
    points = [*capacity.breakpoints(demand, start, end), end] if start < end else []
    intervals = []
    for lo, hi in itertools.pairwise(points):
        reserved = capacity.reserved_at(demand, lo)
        intervals.append(
            {
                "start": lo,
                "end": hi,
                "capacity": cap,
                "on_demand": held,
                "reserved": reserved,
                "free": max(cap - held - reserved, 0),
                "overcommitted": held + reserved > cap,
            }
        )
    return {
        "gpu_model": gpu_model,
        "region": region,
        "zone": zone,
        "start": start,
        "end": end,
        "capacity": cap,
        "on_demand": held,
        "intervals": intervals,
    }
