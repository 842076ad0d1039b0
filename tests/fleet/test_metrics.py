"""``/metrics`` (nvke/metrics.py) with the fleet gauges and counters (fleet/metrics.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import transaction
from prometheus_client.parser import text_string_to_metric_families

from fleet import ingest, placement
from fleet.models import Gpu

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def scrape(client) -> dict[tuple[str, tuple], float]:
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp["Content-Type"].startswith("text/plain; version=")
    out = {}
    for family in text_string_to_metric_families(resp.content.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_fleet_gauges_by_hand(anonymous, make_host, tenant_a):
    host = make_host("h100-sxm5-80gb", gpus=4, hostname="gpu-01")
    make_host("h100-sxm5-80gb", gpus=2, hostname="gpu-02")
    with transaction.atomic():
        placement.claim_gpus(
            [placement.GpuRequest(uuid.uuid4(), tenant_a.id, "h100-sxm5-80gb", 3, "us-east-1")]
        )
    Gpu.objects.filter(host=host, index=3).update(health="UNHEALTHY")
    now = datetime.now(UTC)
    uuids = list(host.gpus.order_by("index").values_list("uuid", flat=True))
    samples = [
        {"ts": (now - timedelta(seconds=12 + i)).isoformat(), "gpu_uuid": uuids[i % 4]}
        for i in range(30)
    ]
    ingest.ingest_report(host, {"seq": 1, "samples": samples}, now=now)

    m = scrape(anonymous)  # no credentials needed, like /healthz
    assert m[("nvke_fleet_hosts", (("gpu_model", "h100-sxm5-80gb"), ("state", "ALLOCATED")))] == 1
    assert m[("nvke_fleet_hosts", (("gpu_model", "h100-sxm5-80gb"), ("state", "AVAILABLE")))] == 1
    gpus = {labels: value for (name, labels), value in m.items() if name == "nvke_fleet_gpus"}
    assert gpus == {
        (
            ("gpu_model", "h100-sxm5-80gb"),
            ("health", "HEALTHY"),
            ("held", "true"),
            ("host_state", "ALLOCATED"),
        ): 3,
        (
            ("gpu_model", "h100-sxm5-80gb"),
            ("health", "UNHEALTHY"),
            ("held", "false"),
            ("host_state", "ALLOCATED"),
        ): 1,
        (
            ("gpu_model", "h100-sxm5-80gb"),
            ("health", "HEALTHY"),
            ("held", "false"),
            ("host_state", "AVAILABLE"),
        ): 2,
    }
    # 30 samples stored in the last 60 s -> 0.5 samples/s; the newest is 12 s old on arrival
    assert m[("nvke_fleet_samples_per_second", ())] == 0.5
    assert m[("nvke_fleet_ingest_lag_seconds", (("stat", "avg"),))] == pytest.approx(12.0)
    assert m[("nvke_fleet_ingest_lag_seconds", (("stat", "max"),))] == pytest.approx(12.0)
    assert m[("nvke_gpu_samples_total", (("outcome", "stored"),))] >= 30


def test_counters_of_other_processes_are_summed_in_multiprocess_mode(tmp_path):
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "nvke.settings",
    }
    bump = (
        "import django; django.setup(); from fleet import metrics; "
        "metrics.SAMPLES.labels(outcome='stored').inc({n})"
    )
    for n in (240, 60):  # two worker processes
        subprocess.run([sys.executable, "-c", bump.format(n=n)], env=env, cwd=ROOT, check=True)
    read = (
        "import django; django.setup(); from nvke import metrics; "
        "from prometheus_client import generate_latest; "
        "print(generate_latest(metrics.build_registry(include_collectors=False)).decode())"
    )
    out = subprocess.run(
        [sys.executable, "-c", read], env=env, cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    assert 'nvke_gpu_samples_total{outcome="stored"} 300.0' in out
