"""Benchmark: what storing samples once costs — the staging path of ingestion
(:func:`fleet.ingest.store_samples`: COPY into a per-transaction staging table, then
``INSERT … ON CONFLICT DO NOTHING`` against the unique index) against a raw COPY of the same
number of rows into ``fleet_gpusample``, in the same run, without HTTP (so the difference is
the database work alone). Batches of 240 rows (one report: 8 GPUs x 30 samples), one
transaction each; SIMULATED rows of one host.

Run: ``make bench`` (or ``pytest tests/bench/test_bench_sample_store.py -s``).
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from tests.bench.size import pick

pytestmark = pytest.mark.django_db(transaction=True)

BATCHES = pick(150, 10)
ROWS = 240
ROUNDS = pick(3, 1)


def batches(host_id, gpus: list[str], start: datetime) -> list[list[tuple]]:
    out = []
    for b in range(BATCHES):
        rows = []
        for i in range(ROWS):
            ts = start + timedelta(seconds=b * 30 + i // len(gpus))
            values = (50.0, 10.0, 2**30, 2**36, 250_000, 10**9, 60.0, 0, 0, 1980, 2619, 0)
            rows.append((ts, host_id, gpus[i % len(gpus)], None, *values, b + 1))
        out.append(rows)
    return out


def timed(fn, work) -> float:
    from django.db import transaction

    began = time.perf_counter()
    for rows in work:
        with transaction.atomic():
            fn(rows)
    return time.perf_counter() - began


def test_storing_samples_once_against_raw_copy(make_host):
    from fleet import ingest, partitions

    host = make_host("h100-sxm5-80gb", gpus=8)
    gpus = list(host.gpus.order_by("index").values_list("uuid", flat=True))
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=6)
    partitions.ensure_partitions_around(start, days_back=1)
    raw_t, store_t, resend_t = [], [], []
    for r in range(ROUNDS):
        base = start + timedelta(hours=2 * r)  # 150 x 30 s = 75 min per round
        raw = batches(uuid.UUID(str(host.id)), gpus, base)
        new = batches(uuid.UUID(str(host.id)), gpus, base + timedelta(microseconds=1))
        raw_t.append(timed(ingest.copy_samples, raw))
        stored = []
        store_t.append(timed(lambda rows, out=stored: out.append(ingest.store_samples(rows)), new))
        assert stored == [ROWS] * BATCHES
        again = []
        resend_t.append(timed(lambda rows, out=again: out.append(ingest.store_samples(rows)), new))
        assert again == [0] * BATCHES  # all already stored: none twice
    n = BATCHES * ROWS
    best = {"raw": min(raw_t), "store": min(store_t), "resend": min(resend_t)}
    print()
    print(f"{BATCHES} batches x {ROWS} rows per transaction, best of {ROUNDS} rounds")
    print(f"{'path':<52}{'seconds':>9}{'rows/s':>11}{'vs raw':>8}")
    for label, key in (
        ("raw COPY into fleet_gpusample", "raw"),
        ("store_samples (staging COPY + ON CONFLICT), new rows", "store"),
        ("store_samples, every row already stored", "resend"),
    ):
        print(f"{label:<52}{best[key]:>9.2f}{n / best[key]:>11,.0f}{best['raw'] / best[key]:>8.2f}")
