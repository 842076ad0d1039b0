"""GPU-utilization autoscaling of node pools, between ``min_node_count`` and ``max_node_count``.

Every minute (beat) each autoscaled, RUNNING pool is sized by its measured GPU utilization
over the last ``NVKE_AUTOSCALE_WINDOW_S`` (600 s): the mean of the whole-GPU samples its nodes'
agents reported (utilization %, as NVML gives it). Above ``NVKE_AUTOSCALE_UP_PCT`` (80) and
under the maximum: one node more; below ``NVKE_AUTOSCALE_DOWN_PCT`` (20) and over the minimum:
one node less (scale-down drains the newest node first). No samples, or only ``N/A`` (MIG mode
reports no utilization), means no decision — never a guess. Resizes go through
:func:`nodepools.scaling.set_node_pool_size` (quota, one operation per cluster, audit) as
``system:autoscaler``; a cluster busy with another operation is simply skipped this round.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection

from clusters.choices import Phase
from nvke.errors import ApiError, InvalidInput
from tenants.choices import Role
from tenants.principal import Principal

from .models import Node, NodePool


def validate_autoscaling(value: Any, node_count: int) -> dict[str, Any]:
    """Normalise ``{"enabled", "min_node_count", "max_node_count"}`` (raises InvalidInput)."""
    if value in (None, {}):
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(
            "autoscaling must be an object", code="invalid_autoscaling", field="autoscaling"
        )
    enabled = bool(value.get("enabled", True))
    low, high = value.get("min_node_count", 1), value.get("max_node_count", node_count)
    for name, number in (("min_node_count", low), ("max_node_count", high)):
        if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number <= 1000:
            raise InvalidInput(
                f"{name} must be an integer from 0 to 1000",
                code="invalid_autoscaling",
                field=f"autoscaling.{name}",
            )
    if low > high:
        raise InvalidInput(
            "min_node_count cannot exceed max_node_count",
            code="invalid_autoscaling",
            field="autoscaling.min_node_count",
        )
    return {"enabled": enabled, "min_node_count": low, "max_node_count": high}


@dataclass(frozen=True)
class Decision:
    pool_id: Any
    utilization_pct: float | None
    samples: int
    node_count: int
    target: int


def utilization(pool: NodePool, now: datetime) -> tuple[float | None, int]:
    """Mean whole-GPU utilization (%) of the pool's live nodes in the window, and the count of
    samples that had a value."""
    uuids = [u for n in Node.objects.filter(nodepool=pool, phase="READY") for u in n.gpu_uuids]
    if not uuids:
        return None, 0
    since = now - timedelta(seconds=settings.NVKE_AUTOSCALE_WINDOW_S)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT AVG(utilization_gpu_pct), COUNT(utilization_gpu_pct)
              FROM fleet_gpusample
             WHERE gpu_uuid = ANY(%s) AND mig_gpu_instance_id IS NULL
               AND ts >= %s AND ts <= %s
            """,
            [uuids, since, now],
        )
        mean, count = cursor.fetchone()
    return (float(mean) if mean is not None else None), int(count)


def decide(pool: NodePool, now: datetime) -> Decision:
    """The node count the autoscaler wants for ``pool`` now."""
    mean, count = utilization(pool, now)
    target = pool.node_count
    if mean is not None:
        if mean > settings.NVKE_AUTOSCALE_UP_PCT:
            target = min(pool.node_count + 1, pool.autoscaling["max_node_count"])
        elif mean < settings.NVKE_AUTOSCALE_DOWN_PCT:
            target = max(pool.node_count - 1, pool.autoscaling["min_node_count"])
    return Decision(pool.id, mean, count, pool.node_count, target)


def autoscale(now: datetime) -> list[Decision]:
    """Beat: resize every autoscaled pool that needs it; returns the decisions that resized."""
    from .scaling import set_node_pool_size

    done = []
    for pool in NodePool.objects.filter(
        phase=Phase.RUNNING, autoscaling__enabled=True
    ).select_related("tenant"):
        decision = decide(pool, now)
        if decision.target == pool.node_count:
            continue
        principal = Principal(pool.tenant, Role.OWNER, False, "system:autoscaler")
        try:
            set_node_pool_size(principal=principal, pool=pool, node_count=decision.target)
        except ApiError:  # busy cluster, quota: try again next round
            continue
        done.append(decision)
    return done


def set_autoscaling(*, principal: Principal, pool: NodePool, autoscaling: Any):
    """Turn autoscaling on/off or change its bounds; a node count outside the new bounds is
    resized into them. Returns the SET_NODE_POOL_SIZE operation (DONE at once when no resize)."""
    from django.db import transaction
    from django.utils import timezone

    from clusters.choices import OperationType
    from clusters.operations import start_operation

    from .scaling import set_node_pool_size
    from .services import set_pool_setting

    config = validate_autoscaling(autoscaling, pool.node_count)
    with transaction.atomic():
        locked = set_pool_setting(principal, pool, "autoscaling", config)
        if config.get("enabled"):
            clamped = min(
                max(locked.node_count, config["min_node_count"]), config["max_node_count"]
            )
            if clamped != locked.node_count:
                return set_node_pool_size(principal=principal, pool=locked, node_count=clamped)
        # one instant: it started when it was created, not before
        return start_operation(
            **locked.operation_target(),
            type=OperationType.SET_NODE_POOL_SIZE,
            requested_by=principal.label,
            total=locked.node_count,
            done=True,
            now=timezone.now(),
        )
