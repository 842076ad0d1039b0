"""Quotas: check and reserve inside the caller's transaction, under the quota row's lock.

A create or scale calls :func:`reserve` in the same transaction that writes the spec; the
tenant's :class:`~tenants.models.Quota` row is locked ``FOR UPDATE`` first, so two concurrent
requests serialise on it and can never both pass (``tests/tenants/test_quota_race.py`` fires
20 concurrent requests through separate connections and shows that without the lock the limit
is overrun). Deleting or scaling down calls :func:`release`.

Lock order everywhere: the object's own row (cluster / node pool) first, then the quota row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from nvke.errors import Conflict

from .models import Quota, Tenant

#: Tests switch this off to prove that the race test really tests the lock.
LOCK_QUOTA_ROW = True
#: Test hook called between reading the reservations and writing them (None in production).
_after_read = None


@dataclass(frozen=True)
class Limits:
    max_clusters: int
    max_nodes: int
    max_gpus: dict[str, int]


def default_limits() -> Limits:
    return Limits(
        max_clusters=settings.NVKE_DEFAULT_MAX_CLUSTERS,
        max_nodes=settings.NVKE_DEFAULT_MAX_NODES,
        max_gpus={},
    )


def quota_for(tenant_id: Any, *, lock: bool) -> Quota:
    """The tenant's quota row (created with the default limits on first use), optionally locked."""
    defaults = default_limits()
    Quota.objects.get_or_create(
        tenant_id=tenant_id,
        defaults={"max_clusters": defaults.max_clusters, "max_nodes": defaults.max_nodes},
    )
    qs = Quota.objects.select_for_update() if lock else Quota.objects
    return qs.get(tenant_id=tenant_id)


def gpu_limit(quota: Quota, gpu_model: str) -> int:
    """GPUs of ``gpu_model`` the tenant may hold (explicit limit or the default per model)."""
    return int(quota.max_gpus.get(gpu_model, settings.NVKE_DEFAULT_MAX_GPUS_PER_MODEL))


def reserve(
    tenant_id: Any,
    *,
    clusters: int = 0,
    nodes: int = 0,
    gpus: dict[str, int] | None = None,
    enforce: bool = True,
) -> Quota:
    """Reserve capacity against the tenant's quota or raise Conflict ``quota_exceeded``.

    Must run inside ``transaction.atomic()`` (the reservation commits or rolls back with the
    spec change). The error names the resource, its limit, what is reserved and what was
    requested. ``enforce=False`` records a reservation that already exists in the world (a
    cancelled scale-down keeps its nodes) without checking the limits.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("reserve() must run inside transaction.atomic()")
    gpus = {k: v for k, v in (gpus or {}).items() if v}
    quota = quota_for(tenant_id, lock=LOCK_QUOTA_ROW)
    if _after_read is not None:
        _after_read()
    if enforce:
        _check(quota, "clusters", quota.max_clusters, quota.reserved_clusters, clusters)
        _check(quota, "nodes", quota.max_nodes, quota.reserved_nodes, nodes)
    for model, count in gpus.items() if enforce else ():
        _check(
            quota,
            f"gpus.{model}",
            gpu_limit(quota, model),
            quota.reserved_gpus.get(model, 0),
            count,
        )
    changes = [
        ("clusters", quota.max_clusters, quota.reserved_clusters, clusters),
        ("nodes", quota.max_nodes, quota.reserved_nodes, nodes),
        *[
            (f"gpus.{m}", gpu_limit(quota, m), quota.reserved_gpus.get(m, 0), c)
            for m, c in gpus.items()
        ],
    ]
    quota.reserved_clusters += clusters
    quota.reserved_nodes += nodes
    reserved = dict(quota.reserved_gpus)
    for model, count in gpus.items():
        reserved[model] = reserved.get(model, 0) + count
    quota.reserved_gpus = reserved
    quota.save(update_fields=["reserved_clusters", "reserved_nodes", "reserved_gpus", "updated_at"])
    _announce_thresholds(tenant_id, changes)
    return quota


THRESHOLDS_PCT = (80, 100)


def crossed_thresholds(limit: int, before: int, after: int) -> list[int]:
    """The percentages of ``THRESHOLDS_PCT`` that ``before -> after`` reserved units reach:
    ``crossed_thresholds(10, 7, 8) == [80]``, ``(10, 7, 10) == [80, 100]``, ``(10, 8, 9) == []``.
    """
    if limit <= 0 or after <= before:
        return []
    return [t for t in THRESHOLDS_PCT if before * 100 < t * limit <= after * 100]


def _announce_thresholds(tenant_id: Any, changes: list[tuple[str, int, int, int]]) -> None:
    from .signals import quota_threshold_reached

    for resource, limit, before, requested in changes:
        for threshold in crossed_thresholds(limit, before, before + requested):
            transaction.on_commit(
                lambda r=resource, lim=limit, t=threshold, res=before + requested: (
                    quota_threshold_reached.send_robust(
                        sender=Quota,
                        tenant_id=tenant_id,
                        resource=r,
                        limit=lim,
                        reserved=res,
                        threshold=t,
                    )
                )
            )


def release(
    tenant_id: Any, *, clusters: int = 0, nodes: int = 0, gpus: dict[str, int] | None = None
) -> Quota:
    """Give reserved capacity back (never below zero). Same transaction rules as reserve."""
    quota = quota_for(tenant_id, lock=True)
    quota.reserved_clusters = max(quota.reserved_clusters - clusters, 0)
    quota.reserved_nodes = max(quota.reserved_nodes - nodes, 0)
    reserved = dict(quota.reserved_gpus)
    for model, count in (gpus or {}).items():
        left = reserved.get(model, 0) - count
        if left > 0:
            reserved[model] = left
        else:
            reserved.pop(model, None)
    quota.reserved_gpus = reserved
    quota.save(update_fields=["reserved_clusters", "reserved_nodes", "reserved_gpus", "updated_at"])
    return quota


def _check(quota: Quota, resource: str, limit: int, reserved: int, requested: int) -> None:
    if requested > 0 and reserved + requested > limit:
        raise Conflict(
            f"quota exceeded for {resource}: limit {limit}, reserved {reserved}, "
            f"requested {requested}",
            code="quota_exceeded",
            extra={
                "resource": resource,
                "limit": limit,
                "reserved": reserved,
                "requested": requested,
                "available": max(limit - reserved, 0),
            },
        )


def limits_below_use(body: dict, limits: dict) -> list[str]:
    """What new ``limits`` (``max_clusters``, ``max_nodes``, ``max_gpus`` {slug: n}; absent
    keys unchanged; a model missing from ``max_gpus`` gets the default per model) would put
    below the tenant's current use, ``body`` being the API's quota body (``in_use`` and
    ``reserved`` per resource). Use is the larger of the two (reserved = being created).
    Lowering a limit below use is allowed (it blocks new growth only), but a person should
    see it: one sentence per resource, ``[]`` when nothing is below use. Example::

        ["nodes: limit 2 is below the 5 in use (5 reserved)"]
    """
    out: list[str] = []

    def check(name: str, limit: int | None, row: dict) -> None:
        used = max(row.get("in_use", 0), row.get("reserved", 0))
        if limit is not None and limit < used:
            out.append(
                f"{name}: limit {limit} is below the {row.get('in_use', 0)} in use "
                f"({row.get('reserved', 0)} reserved)"
            )

    check("clusters", limits.get("max_clusters"), body["clusters"])
    check("nodes", limits.get("max_nodes"), body["nodes"])
    if "max_gpus" in limits:
        default = settings.NVKE_DEFAULT_MAX_GPUS_PER_MODEL
        for model, row in sorted(body["gpus"].items()):
            check(f"GPUs {model}", int(limits["max_gpus"].get(model, default)), row)
    return out


def set_limits(
    tenant: Tenant,
    *,
    max_clusters: int | None = None,
    max_nodes: int | None = None,
    max_gpus: dict[str, int] | None = None,
) -> Quota:
    """Operators set limits (lowering a limit below what is reserved blocks new growth only)."""
    with transaction.atomic():
        quota = quota_for(tenant.pk, lock=True)
        if max_clusters is not None:
            quota.max_clusters = max_clusters
        if max_nodes is not None:
            quota.max_nodes = max_nodes
        if max_gpus is not None:
            quota.max_gpus = max_gpus
        quota.save()
        return quota
