"""Usage of a cluster over a window ``[start, end)``: GPU-hours from the allocation ledger,
utilization from GPU telemetry (never used for the bill).

GPU-seconds are computed in SQL from the ledger's time ranges, exactly (numeric arithmetic on
``tstzrange`` bounds, an open allocation counted up to ``min(end, now)``). Mean utilization is
the plain mean of the allocation's samples (a whole GPU's, or a MIG GPU instance's own:
:mod:`billing.samples`) taken while allocated to this cluster inside the window; samples whose
utilization is null (``N/A`` in MIG mode) count as samples but not in the mean.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.db import connection

from .samples import samples_of

HOUR = Decimal(3600)
HOURS_PLACES = Decimal("0.000001")


@dataclass
class ModelUsage:
    gpu_model: str
    gpu_seconds: Decimal = Decimal(0)
    sample_count: int = 0
    utilization_sample_count: int = 0
    mean_gpu_utilization_pct: float | None = None

    @property
    def gpu_hours(self) -> Decimal:
        return (self.gpu_seconds / HOUR).quantize(HOURS_PLACES)

    def as_dict(self) -> dict:
        return {
            "gpu_model": self.gpu_model,
            "gpu_hours": self.gpu_hours,
            "gpu_seconds": self.gpu_seconds,
            "mean_gpu_utilization_pct": self.mean_gpu_utilization_pct,
            "sample_count": self.sample_count,
            "utilization_sample_count": self.utilization_sample_count,
        }


@dataclass
class Usage:
    start: datetime
    end: datetime
    by_model: dict[str, ModelUsage] = field(default_factory=dict)

    @property
    def gpu_seconds(self) -> Decimal:
        return sum((m.gpu_seconds for m in self.by_model.values()), Decimal(0))

    def as_dict(self) -> dict:
        samples = sum(m.sample_count for m in self.by_model.values())
        util_samples = sum(m.utilization_sample_count for m in self.by_model.values())
        weighted = sum(
            (m.mean_gpu_utilization_pct or 0.0) * m.utilization_sample_count
            for m in self.by_model.values()
        )
        return {
            "start": self.start,
            "end": self.end,
            "gpu_hours": (self.gpu_seconds / HOUR).quantize(HOURS_PLACES),
            "gpu_seconds": self.gpu_seconds,
            "mean_gpu_utilization_pct": (weighted / util_samples) if util_samples else None,
            "sample_count": samples,
            "utilization_sample_count": util_samples,
            "by_gpu_model": [
                m.as_dict() for m in sorted(self.by_model.values(), key=lambda m: m.gpu_model)
            ],
        }


_GPU_SECONDS_SQL = """
SELECT gpu_model,
       SUM(billable_fraction * EXTRACT(EPOCH FROM (
             LEAST(COALESCE(upper(period), %(now)s), %(end)s) - GREATEST(lower(period), %(start)s)
       )))
  FROM billing_ledgerentry
 WHERE cluster_id = %(cluster)s
   AND period && tstzrange(%(start)s, %(end)s, '[)')
   AND lower(period) < %(now)s
 GROUP BY gpu_model
"""

_UTILIZATION_SQL = (
    """
SELECT l.gpu_model, COUNT(*), COUNT(s.utilization_gpu_pct), AVG(s.utilization_gpu_pct)
  FROM billing_ledgerentry l
  JOIN fleet_gpusample s
    ON """
    + samples_of("l")
    + """
   AND s.ts <@ l.period
 WHERE l.cluster_id = %(cluster)s
   AND s.ts >= %(start)s AND s.ts < %(end)s
 GROUP BY l.gpu_model
"""
)


def cluster_usage(cluster_id: uuid.UUID, start: datetime, end: datetime, now: datetime) -> Usage:
    """Usage of one cluster in ``[start, end)`` as of ``now`` (open allocations end at now)."""
    params = {"cluster": cluster_id, "start": start, "end": end, "now": now}
    usage = Usage(start=start, end=end)
    with connection.cursor() as cursor:
        cursor.execute(_GPU_SECONDS_SQL, params)
        for model, seconds in cursor.fetchall():
            seconds = Decimal(seconds or 0)
            usage.by_model[model] = ModelUsage(model, gpu_seconds=max(seconds, Decimal(0)))
        cursor.execute(_UTILIZATION_SQL, params)
        for model, count, util_count, mean in cursor.fetchall():
            entry = usage.by_model.setdefault(model, ModelUsage(model))
            entry.sample_count = count
            entry.utilization_sample_count = util_count
            entry.mean_gpu_utilization_pct = float(mean) if mean is not None else None
    return usage
