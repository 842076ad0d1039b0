"""1-minute / 1-hour rollups (fleet/rollups.py) and sample partitions, by hand.

One GPU reports every 20 s from 10:00:00; its energy counter (mJ since driver load) resets at
10:01:00 (a driver reload) and jumps implausibly at 10:01:40::

    ts        util  power_mW  energy_mJ   delta counted
    10:00:00   10   100000    1000000     - (no earlier reading)
    10:00:20   20   200000    1004000     4000
    10:00:40   N/A  300000    1010000     6000
    10:01:00   40   100000        500     - went backwards: reset recorded
    10:01:20   50   100000       2500     2000
    10:01:40   60   100000  100002500     - 100,000 J in 20 s = 5,000 W > 2,000 W: recorded

    minute 10:00: 3 samples, 2 with utilization (sum 30, mean 15), power sum 600000, 10000 mJ
    minute 10:01: 3 samples, 3 with utilization (sum 150, mean 50), power sum 300000, 2000 mJ
    hour 10:00:   6 samples, 5 with utilization (sum 180, mean 36), power sum 900000, 12000 mJ
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from fleet import ingest, partitions, rollups
from fleet.models import EnergyCounterReset, GpuRollup1h, GpuRollup1m, Host

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
RECEIVED = T0 + timedelta(minutes=2)
READINGS = [
    (0, 10.0, 100000, 1000000),
    (20, 20.0, 200000, 1004000),
    (40, None, 300000, 1010000),
    (60, 40.0, 100000, 500),
    (80, 50.0, 100000, 2500),
    (100, 60.0, 100000, 100002500),
]


@pytest.fixture
def host(make_host):
    return make_host("h100-sxm5-80gb", gpus=1, hostname="gpu-01")


def send(host, seq, samples, received=RECEIVED):
    return ingest.ingest_report(host, {"seq": seq, "samples": samples}, now=received)


def sample(uuid, seconds, util, power, energy, **extra):
    return {
        "ts": (T0 + timedelta(seconds=seconds)).isoformat(),
        "gpu_uuid": uuid,
        "utilization_gpu_pct": util,
        "power_mw": power,
        "energy_mj": energy,
        **extra,
    }


def minute(uuid, at, gi=None):
    row = GpuRollup1m.objects.get(gpu_uuid=uuid, bucket=at, mig_gpu_instance_id=gi)
    return (
        row.samples,
        row.utilization_samples,
        row.utilization_gpu_pct_sum,
        row.utilization_gpu_pct_avg,
        row.utilization_gpu_pct_max,
        int(row.power_mw_sum),
        row.energy_mj,
    )


def test_minutes_hours_and_energy_by_hand(host):
    uuid = host.gpus.get().uuid
    samples = [sample(uuid, *r) for r in READINGS]
    samples.append(sample(uuid, 0, None, None, None, mig_gpu_instance_id=3, memory_used_bytes=7))
    send(host, 1, samples)
    result = rollups.rollup_pending(now=RECEIVED + timedelta(seconds=10))
    assert result == {"minute_rows": 3, "hour_rows": 2, "energy_resets": 2, "reports": 1}
    assert minute(uuid, T0) == (3, 2, 30.0, 15.0, 20.0, 600000, 10000)
    assert minute(uuid, T0 + timedelta(minutes=1)) == (3, 3, 150.0, 50.0, 60.0, 300000, 2000)
    # the MIG device is its own row: the physical GPU is counted once
    mig = GpuRollup1m.objects.get(gpu_uuid=uuid, mig_gpu_instance_id=3)
    assert (mig.samples, mig.memory_used_bytes_max, mig.utilization_gpu_pct_avg) == (1, 7, None)
    hour = GpuRollup1h.objects.get(gpu_uuid=uuid, mig_gpu_instance_id=None)
    assert (hour.bucket, hour.samples, hour.utilization_samples, hour.utilization_gpu_pct_avg) == (
        T0,
        6,
        5,
        36.0,
    )
    assert (int(hour.power_mw_sum), hour.energy_mj) == (900000, 12000)
    resets = list(EnergyCounterReset.objects.values_list("ts", "previous_mj", "current_mj", "kind"))
    assert resets == [
        (T0 + timedelta(seconds=60), 1010000, 500, "went_backwards"),
        (T0 + timedelta(seconds=100), 2500, 100002500, "implausible_jump"),
    ]
    # nothing new arrived: a second run changes nothing
    assert rollups.rollup_pending(now=RECEIVED + timedelta(seconds=70))["reports"] == 1
    assert minute(uuid, T0) == (3, 2, 30.0, 15.0, 20.0, 600000, 10000)
    assert EnergyCounterReset.objects.count() == 2


def test_late_samples_update_their_minutes(host):
    uuid = host.gpus.get().uuid
    send(host, 1, [sample(uuid, *r) for r in READINGS])
    rollups.rollup_pending(now=RECEIVED + timedelta(seconds=10))
    # an agent back from an outage sends 10:00:50 (util 100, energy 1012000) 5 minutes later
    late = RECEIVED + timedelta(minutes=5)
    send(host, 2, [sample(uuid, 50, 100.0, 100000, 1012000)], received=late)
    # the late report, and the first one again (received within the minute of overlap)
    assert rollups.rollup_pending(now=late + timedelta(seconds=10))["reports"] == 2
    # minute 10:00 now: 4 samples, utilization 10+20+100 over 3, energy 4000+6000+2000
    assert minute(uuid, T0) == (4, 3, 130.0, 130.0 / 3, 100.0, 700000, 12000)
    hour = GpuRollup1h.objects.get(gpu_uuid=uuid)
    assert (hour.samples, hour.energy_mj) == (7, 14000)


def test_series_reads_rollups_for_dashboards(host, operator):
    uuid = host.gpus.get().uuid
    send(host, 1, [sample(uuid, *r) for r in READINGS])
    rollups.rollup_pending(now=RECEIVED + timedelta(seconds=10))
    resp = operator.get(
        f"/api/v1/fleet/hosts/{host.id}/telemetry",
        {"resolution": "1m", "start": T0.isoformat(), "end": (T0 + timedelta(hours=1)).isoformat()},
    )
    assert resp.status_code == 200, resp.content
    points = resp.json()
    assert [
        (p["bucket"], p["samples"], p["utilization_gpu_pct"], p["power_mw"], p["energy_mj"])
        for p in points
    ] == [
        ("2026-11-02T10:00:00Z", 3, 15.0, 200000, 10000),
        ("2026-11-02T10:01:00Z", 3, 50.0, 100000, 2000),
    ]
    bad = operator.get(
        f"/api/v1/fleet/hosts/{host.id}/telemetry",
        {"start": T0.isoformat(), "end": (T0 - timedelta(hours=1)).isoformat()},
    )
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_time_range")


def test_partitions_are_made_ahead_and_dropped_after_retention(host):
    partitions.forget_cache()
    created = partitions.ensure_partitions_around(T0, days_ahead=3, days_back=1)
    assert created == [f"fleet_gpusample_p2026110{d}" for d in (1, 2, 3, 4, 5)]
    assert partitions.ensure_partitions_around(T0) == []  # idempotent
    dropped = partitions.drop_partitions_before(datetime(2026, 11, 3).date())
    assert dropped == ["fleet_gpusample_p20261101", "fleet_gpusample_p20261102"]
    names = [name for name, _day in partitions.existing_partitions()]
    assert "fleet_gpusample_p20261103" in names and "fleet_gpusample_p20261102" not in names
    partitions.forget_cache()


def test_old_rollups_are_pruned(host, settings):
    settings.NVKE_ROLLUP_1M_RETENTION_DAYS = 2
    uuid = host.gpus.get().uuid
    send(host, 1, [sample(uuid, *r) for r in READINGS])
    rollups.rollup_pending(now=RECEIVED + timedelta(seconds=10))
    assert rollups.prune_rollups(T0 + timedelta(days=1)) == {"minute_rows": 0, "hour_rows": 0}
    assert rollups.prune_rollups(T0 + timedelta(days=3)) == {"minute_rows": 2, "hour_rows": 0}
    assert GpuRollup1h.objects.count() == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM fleet_gpusample")
        assert cursor.fetchone() == (6,)  # raw samples follow their own (partition) retention
    assert Host.objects.count() == 1
