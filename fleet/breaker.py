"""The circuit breaker: automation never takes down more than a share of a fleet at once.

Automation (auto-repair: the reboot or replacement of a node it starts) may cordon at most
``budget = max(1, floor(NVKE_BREAKER_SHARE x N))`` targets of one scope within the sliding
window ``NVKE_BREAKER_WINDOW_S``, where a scope is one node pool (N = its nodes) or one GPU
model's fleet (N = its hosts, not retired). Every cordon counts — automatic ones and the
operator's drains and planned maintenance (:func:`record_cordon`) — but only automatic ones
are ever refused. The cordon that would exceed a budget is refused and opens the scope's
breaker (:class:`~fleet.breaker_models.BreakerTrip`, the reason in words); automation in that
scope then waits, emergencies included, until an operator resumes it (:func:`resume`, audited),
which also starts the count afresh. Defaults: 5 % over one hour (NVSentinel's circuit breaker
on cordons over a sliding window; NICo's update manager never takes enough machines to breach
the health SLA).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max, Q

from .breaker_models import BreakerTrip, CordonRecord
from .choices import HostState
from .models import Host


def budget(size: int) -> int:
    """``max(1, floor(share x size))`` cordons per window for a scope of ``size`` targets."""
    return max(1, math.floor(float(settings.NVKE_BREAKER_SHARE) * size))


def pool_scope(pool_id: Any) -> str:
    return f"pool:{pool_id}"


def model_scope(gpu_model: str) -> str:
    return f"model:{gpu_model}"


def open_trip(scope: str) -> BreakerTrip | None:
    """The scope's open trip (automation there waits), or None."""
    return BreakerTrip.objects.filter(scope=scope, resumed_at__isnull=True).first()


def _since(scope: str, now: datetime) -> datetime:
    window = now - timedelta(seconds=int(settings.NVKE_BREAKER_WINDOW_S))
    resumed = BreakerTrip.objects.filter(scope=scope).aggregate(at=Max("resumed_at"))["at"]
    return max(window, resumed) if resumed else window


def _counted(scope: str, filt: Q, now: datetime) -> int:
    return CordonRecord.objects.filter(filt, at__gt=_since(scope, now), at__lte=now).count()


def record_cordon(
    *, target: str, gpu_model: str, pool_id: Any, actor: str, automatic: bool, now: datetime
) -> None:
    """Count a cordon against the budgets of its pool and GPU model (never refused: use
    :func:`allow_automatic_cordon` for automation)."""
    CordonRecord.objects.create(
        at=now,
        automatic=automatic,
        gpu_model=gpu_model,
        pool_id=pool_id,
        target=target[:200],
        actor=actor[:100],
    )


def allow_automatic_cordon(
    *,
    target: str,
    gpu_model: str,
    pool_id: Any,
    pool_size: int,
    actor: str,
    now: datetime,
    pool_label: str = "",
) -> tuple[bool, str]:
    """May automation cordon ``target`` now? ``(True, "")`` — and the cordon is counted — or
    ``(False, why)`` when a breaker of its pool or GPU model is open or this cordon would
    exceed a budget. Every budget it would exceed opens its breaker at once (so an operator
    sees, and resumes, all of them together rather than one after another); ``why`` names
    each. ``pool_label`` ("tenant/cluster/pool") names the pool in the reason."""
    scopes: list[tuple[str, Q, int, str]] = []
    if pool_id is not None:
        what = f"node pool {pool_label + ' ' if pool_label else ''}({pool_size} nodes)"
        scopes.append((pool_scope(pool_id), Q(pool_id=pool_id), pool_size, what))
    if gpu_model:
        hosts = Host.objects.filter(gpu_model_id=gpu_model).exclude(state=HostState.RETIRED)
        n = hosts.count()
        scopes.append(
            (model_scope(gpu_model), Q(gpu_model=gpu_model), n, f"{gpu_model} fleet ({n} hosts)")
        )
    with transaction.atomic():
        for scope, _, _, _ in scopes:
            trip = open_trip(scope)
            if trip is not None:
                return False, trip.reason
        reasons = []
        for scope, filt, size, what in scopes:
            used, limit = _counted(scope, filt, now), budget(size)
            if used + 1 > limit:
                reason = (
                    f"circuit breaker open for the {what}: {used} cordon(s) by automation or "
                    f"operators in the last {int(settings.NVKE_BREAKER_WINDOW_S)} s, the "
                    f"budget is {limit} (max(1, floor({float(settings.NVKE_BREAKER_SHARE):g} x "
                    f"{size}))); {target} waits until an operator resumes automation"
                )[:500]
                try:
                    with transaction.atomic():
                        BreakerTrip.objects.create(scope=scope, tripped_at=now, reason=reason)
                except IntegrityError:  # another worker opened it first
                    pass
                reasons.append(reason)
        if reasons:
            return False, "; ".join(reasons)
        record_cordon(
            target=target, gpu_model=gpu_model, pool_id=pool_id, actor=actor, automatic=True,
            now=now,
        )  # fmt: skip
    return True, ""


def resume(scope: str, *, actor: str, now: datetime) -> BreakerTrip | None:
    """An operator resumes automation in ``scope``: the open trip closes and the count starts
    afresh from now. Audited (``breaker.resume``). Returns the trip closed (None: none was
    open)."""
    from tenants import audit

    with transaction.atomic():
        trip = (
            BreakerTrip.objects.select_for_update()
            .filter(scope=scope, resumed_at__isnull=True)
            .first()
        )
        if trip is None:
            return None
        trip.resumed_at, trip.resumed_by = now, actor[:100]
        trip.save(update_fields=["resumed_at", "resumed_by"])
        audit.record(
            actor=actor,
            action="breaker.resume",
            target_type="breaker",
            target_id=scope,
            before={"open": True, "reason": trip.reason},
            after={"open": False},
        )
    return trip
