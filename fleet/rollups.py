"""1-minute and 1-hour rollups of GPU samples, for dashboards (DESIGN §5).

:func:`rollup_pending` (beat, every minute) finds the reports received since it last ran
(``AgentReport.received_at``, re-reading a minute of overlap so a report that committed late is
not missed), takes the minutes their samples cover (``min_ts``..``max_ts`` per host) and
recomputes exactly those minutes from ``fleet_gpusample``, then the hours that contain them
from the minutes. Recomputing is idempotent (``INSERT … ON CONFLICT DO UPDATE`` with the
whole bucket's values), so late data — an agent emptying its spool after an outage — simply
updates its buckets, and running the task twice changes nothing.

Each rollup row is one GPU (``mig_gpu_instance_id`` null) or one MIG device per bucket, so a
physical GPU is counted once however many MIG devices it has; dashboards read the GPU rows for
GPU figures and the MIG rows for per-instance memory.

Energy: NVML's counter is mJ since the driver loaded (nvml.md §3), so a bucket's energy is the
sum of the deltas between consecutive samples of the GPU ending in it. A delta that is negative
(the counter reset: driver reload) or implausible (more than ``NVKE_MAX_GPU_POWER_W`` over the
time between the readings) counts nothing and is recorded as an
:class:`~fleet.models.EnergyCounterReset`. The previous reading is looked for up to
``ENERGY_LOOKBACK`` before the bucket; after a longer gap the first delta is unknown.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from . import conf
from .models import AgentReport, GpuRollup1h, GpuRollup1m, RollupCursor

ENERGY_LOOKBACK = timedelta(minutes=10)
OVERLAP = timedelta(minutes=1)
SETTLE = timedelta(seconds=2)
CURSOR = "gpu-samples"

_MINUTES_SQL = """
WITH ranges(host_id, lo, hi) AS (SELECT * FROM unnest(%(hosts)s::uuid[], %(los)s::timestamptz[],
                                                      %(his)s::timestamptz[])),
raw AS (
    SELECT s.*, r.lo AS range_lo, r.hi AS range_hi,
           LAG(s.energy_mj) OVER w AS prev_energy_mj,
           LAG(s.ts) OVER w AS prev_ts
      FROM fleet_gpusample s
      JOIN ranges r ON s.host_id = r.host_id
                   AND s.ts >= r.lo - %(lookback)s::interval AND s.ts < r.hi
    WINDOW w AS (PARTITION BY s.gpu_uuid, s.mig_gpu_instance_id, r.lo ORDER BY s.ts)
),
deltas AS (
    SELECT raw.*,
           CASE
             WHEN energy_mj IS NULL OR prev_energy_mj IS NULL THEN NULL
             WHEN energy_mj < prev_energy_mj THEN NULL
             WHEN energy_mj::numeric - prev_energy_mj
                  > %(max_w)s * EXTRACT(EPOCH FROM ts - prev_ts) * 1000 + %(max_w)s * 1000
               THEN NULL
             ELSE energy_mj::numeric - prev_energy_mj
           END AS energy_delta_mj
      FROM raw
     WHERE ts >= range_lo
)
INSERT INTO fleet_gpurollup1m
    (bucket, host_id, gpu_uuid, mig_gpu_instance_id, samples, utilization_samples,
     utilization_gpu_pct_sum, utilization_gpu_pct_max, memory_used_bytes_sum, memory_samples,
     memory_used_bytes_max, memory_total_bytes, power_mw_sum, power_samples, power_mw_max,
     energy_mj, temperature_c_max, ecc_volatile_uncorrected_max)
SELECT date_trunc('minute', ts), host_id, gpu_uuid, mig_gpu_instance_id,
       COUNT(*), COUNT(utilization_gpu_pct), SUM(utilization_gpu_pct), MAX(utilization_gpu_pct),
       SUM(memory_used_bytes), COUNT(memory_used_bytes), MAX(memory_used_bytes),
       MAX(memory_total_bytes), SUM(power_mw), COUNT(power_mw), MAX(power_mw),
       SUM(energy_delta_mj), MAX(temperature_c), MAX(ecc_volatile_uncorrected)
  FROM deltas
 GROUP BY 1, 2, 3, 4
ON CONFLICT (gpu_uuid, mig_gpu_instance_id, bucket) DO UPDATE SET
    host_id = EXCLUDED.host_id,
    samples = EXCLUDED.samples,
    utilization_samples = EXCLUDED.utilization_samples,
    utilization_gpu_pct_sum = EXCLUDED.utilization_gpu_pct_sum,
    utilization_gpu_pct_max = EXCLUDED.utilization_gpu_pct_max,
    memory_used_bytes_sum = EXCLUDED.memory_used_bytes_sum,
    memory_samples = EXCLUDED.memory_samples,
    memory_used_bytes_max = EXCLUDED.memory_used_bytes_max,
    memory_total_bytes = EXCLUDED.memory_total_bytes,
    power_mw_sum = EXCLUDED.power_mw_sum,
    power_samples = EXCLUDED.power_samples,
    power_mw_max = EXCLUDED.power_mw_max,
    energy_mj = EXCLUDED.energy_mj,
    temperature_c_max = EXCLUDED.temperature_c_max,
    ecc_volatile_uncorrected_max = EXCLUDED.ecc_volatile_uncorrected_max
"""

_RESETS_SQL = """
WITH ranges(host_id, lo, hi) AS (SELECT * FROM unnest(%(hosts)s::uuid[], %(los)s::timestamptz[],
                                                      %(his)s::timestamptz[])),
raw AS (
    SELECT s.host_id, s.gpu_uuid, s.ts, s.energy_mj, r.lo AS range_lo,
           LAG(s.energy_mj) OVER w AS prev_energy_mj, LAG(s.ts) OVER w AS prev_ts
      FROM fleet_gpusample s
      JOIN ranges r ON s.host_id = r.host_id
                   AND s.ts >= r.lo - %(lookback)s::interval AND s.ts < r.hi
     WHERE s.mig_gpu_instance_id IS NULL AND s.energy_mj IS NOT NULL
    WINDOW w AS (PARTITION BY s.gpu_uuid, r.lo ORDER BY s.ts)
)
INSERT INTO fleet_energycounterreset
    (host_id, gpu_uuid, ts, previous_ts, previous_mj, current_mj, kind)
SELECT host_id, gpu_uuid, ts, prev_ts, prev_energy_mj, energy_mj,
       CASE WHEN energy_mj < prev_energy_mj THEN 'went_backwards' ELSE 'implausible_jump' END
  FROM raw
 WHERE ts >= range_lo AND prev_energy_mj IS NOT NULL
   AND (energy_mj < prev_energy_mj
        OR energy_mj::numeric - prev_energy_mj
           > %(max_w)s * EXTRACT(EPOCH FROM ts - prev_ts) * 1000 + %(max_w)s * 1000)
ON CONFLICT (gpu_uuid, ts) DO NOTHING
"""

_HOURS_SQL = """
WITH hours(host_id, lo, hi) AS (SELECT * FROM unnest(%(hosts)s::uuid[], %(los)s::timestamptz[],
                                                     %(his)s::timestamptz[]))
INSERT INTO fleet_gpurollup1h
    (bucket, host_id, gpu_uuid, mig_gpu_instance_id, samples, utilization_samples,
     utilization_gpu_pct_sum, utilization_gpu_pct_max, memory_used_bytes_sum, memory_samples,
     memory_used_bytes_max, memory_total_bytes, power_mw_sum, power_samples, power_mw_max,
     energy_mj, temperature_c_max, ecc_volatile_uncorrected_max)
SELECT date_trunc('hour', m.bucket), m.host_id, m.gpu_uuid, m.mig_gpu_instance_id,
       SUM(m.samples), SUM(m.utilization_samples), SUM(m.utilization_gpu_pct_sum),
       MAX(m.utilization_gpu_pct_max), SUM(m.memory_used_bytes_sum), SUM(m.memory_samples),
       MAX(m.memory_used_bytes_max), MAX(m.memory_total_bytes), SUM(m.power_mw_sum),
       SUM(m.power_samples), MAX(m.power_mw_max), SUM(m.energy_mj), MAX(m.temperature_c_max),
       MAX(m.ecc_volatile_uncorrected_max)
  FROM fleet_gpurollup1m m
  JOIN hours h ON m.host_id = h.host_id AND m.bucket >= h.lo AND m.bucket < h.hi
 GROUP BY 1, 2, 3, 4
ON CONFLICT (gpu_uuid, mig_gpu_instance_id, bucket) DO UPDATE SET
    host_id = EXCLUDED.host_id,
    samples = EXCLUDED.samples,
    utilization_samples = EXCLUDED.utilization_samples,
    utilization_gpu_pct_sum = EXCLUDED.utilization_gpu_pct_sum,
    utilization_gpu_pct_max = EXCLUDED.utilization_gpu_pct_max,
    memory_used_bytes_sum = EXCLUDED.memory_used_bytes_sum,
    memory_samples = EXCLUDED.memory_samples,
    memory_used_bytes_max = EXCLUDED.memory_used_bytes_max,
    memory_total_bytes = EXCLUDED.memory_total_bytes,
    power_mw_sum = EXCLUDED.power_mw_sum,
    power_samples = EXCLUDED.power_samples,
    power_mw_max = EXCLUDED.power_mw_max,
    energy_mj = EXCLUDED.energy_mj,
    temperature_c_max = EXCLUDED.temperature_c_max,
    ecc_volatile_uncorrected_max = EXCLUDED.ecc_volatile_uncorrected_max
"""


def _floor(ts: datetime, unit: timedelta) -> datetime:
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    return epoch + ((ts - epoch) // unit) * unit


def _merge(ranges: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    out: list[tuple[datetime, datetime]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def rollup_ranges(ranges: dict[Any, list[tuple[datetime, datetime]]]) -> dict[str, int]:
    """Recompute the 1-minute buckets touching ``{host_id: [(min_ts, max_ts)]}`` and their hours.

    Returns ``{"minute_rows": n, "hour_rows": n, "energy_resets": n}`` (rows written).
    """
    hosts, los, his = [], [], []
    hour_hosts, hour_los, hour_his = [], [], []
    minute = timedelta(minutes=1)
    hour = timedelta(hours=1)
    for host_id, spans in ranges.items():
        minutes = _merge([(_floor(lo, minute), _floor(hi, minute) + minute) for lo, hi in spans])
        for lo, hi in minutes:
            hosts.append(host_id)
            los.append(lo)
            his.append(hi)
        hours = [(_floor(lo, hour), _floor(hi - minute, hour) + hour) for lo, hi in minutes]
        for lo, hi in _merge(hours):
            hour_hosts.append(host_id)
            hour_los.append(lo)
            hour_his.append(hi)
    if not hosts:
        return {"minute_rows": 0, "hour_rows": 0, "energy_resets": 0}
    params = {
        "hosts": hosts,
        "los": los,
        "his": his,
        "lookback": ENERGY_LOOKBACK,
        "max_w": conf.max_gpu_power_w(),
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_RESETS_SQL, params)
        resets = cursor.rowcount
        cursor.execute(_MINUTES_SQL, params)
        minute_rows = cursor.rowcount
        cursor.execute(_HOURS_SQL, {"hosts": hour_hosts, "los": hour_los, "his": hour_his})
        hour_rows = cursor.rowcount
    return {"minute_rows": minute_rows, "hour_rows": hour_rows, "energy_resets": resets}


def rollup_pending(now: datetime | None = None) -> dict[str, int]:
    """Roll up what arrived since the last run (beat task; see module docstring)."""
    now = now or timezone.now()
    until = now - SETTLE
    with transaction.atomic():
        cursor, _ = RollupCursor.objects.select_for_update().get_or_create(
            name=CURSOR, defaults={"received_until": datetime(2000, 1, 1, tzinfo=UTC)}
        )
        since = cursor.received_until - OVERLAP
        spans: dict[Any, list[tuple[datetime, datetime]]] = defaultdict(list)
        for host_id, lo, hi in AgentReport.objects.filter(
            received_at__gt=since, received_at__lte=until, min_ts__isnull=False
        ).values_list("host_id", "min_ts", "max_ts"):
            spans[host_id].append((lo, hi))
        result = rollup_ranges(spans)
        cursor.received_until = until
        cursor.save(update_fields=["received_until"])
    result["reports"] = sum(len(v) for v in spans.values())
    return result


def prune_rollups(now: datetime | None = None) -> dict[str, int]:
    """Delete rollups past their retention (``NVKE_ROLLUP_1M/1H_RETENTION_DAYS``)."""
    now = now or timezone.now()
    minutes, _ = GpuRollup1m.objects.filter(
        bucket__lt=now - timedelta(days=conf.rollup_1m_retention_days())
    ).delete()
    hours, _ = GpuRollup1h.objects.filter(
        bucket__lt=now - timedelta(days=conf.rollup_1h_retention_days())
    ).delete()
    return {"minute_rows": minutes, "hour_rows": hours}


def series(
    gpu_uuids: list[str], start: datetime, end: datetime, resolution: str = "1m"
) -> list[dict[str, Any]]:
    """Rollup rows of ``gpu_uuids`` in ``[start, end)`` as dicts (dashboards, the API).

    ``utilization_gpu_pct`` is the mean over the samples that had one (null when none did),
    ``memory_used_bytes`` / ``power_mw`` the means, ``energy_mj`` the bucket's energy.
    """
    model = GpuRollup1m if resolution == "1m" else GpuRollup1h
    out = []
    for row in model.objects.filter(
        gpu_uuid__in=gpu_uuids, bucket__gte=start, bucket__lt=end
    ).order_by("gpu_uuid", "mig_gpu_instance_id", "bucket"):
        out.append(
            {
                "bucket": row.bucket,
                "gpu_uuid": row.gpu_uuid,
                "mig_gpu_instance_id": row.mig_gpu_instance_id,
                "samples": row.samples,
                "utilization_gpu_pct": row.utilization_gpu_pct_avg,
                "utilization_gpu_pct_max": row.utilization_gpu_pct_max,
                "memory_used_bytes": (
                    int(row.memory_used_bytes_sum / row.memory_samples)
                    if row.memory_samples and row.memory_used_bytes_sum is not None
                    else None
                ),
                "memory_used_bytes_max": row.memory_used_bytes_max,
                "memory_total_bytes": row.memory_total_bytes,
                "power_mw": (
                    int(row.power_mw_sum / row.power_samples)
                    if row.power_samples and row.power_mw_sum is not None
                    else None
                ),
                "power_mw_max": row.power_mw_max,
                "energy_mj": row.energy_mj,
                "temperature_c_max": row.temperature_c_max,
                "ecc_volatile_uncorrected_max": row.ecc_volatile_uncorrected_max,
            }
        )
    return out
