"""The fleet's beat tasks (fleet/tasks.py) run twice in a row change nothing the second time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import ingest, partitions, tasks
from fleet.models import GpuRollup1m, Host

pytestmark = pytest.mark.django_db


def test_each_task_is_safe_to_run_twice(make_host, settings):
    settings.NVKE_HOST_HEARTBEAT_TIMEOUT_S = 60
    host = make_host("h100-sxm5-80gb", gpus=1, hostname="gpu-01")
    now = timezone.now()
    uuid = host.gpus.get().uuid
    ingest.ingest_report(
        host,
        {"seq": 1, "samples": [{"ts": (now - timedelta(seconds=30)).isoformat(), "gpu_uuid": uuid,
                                "utilization_gpu_pct": 25.0}]},
        now=now - timedelta(seconds=20),
    )  # fmt: skip
    Host.objects.filter(pk=host.pk).update(
        credential_hash="c" * 64, last_seen_at=now - timedelta(minutes=5)
    )

    assert tasks.mark_silent_hosts_not_ready() == {"not_ready": 1, "scrubs_failed": 0}
    assert tasks.mark_silent_hosts_not_ready() == {"not_ready": 0, "scrubs_failed": 0}
    assert Host.objects.get(pk=host.pk).state == "NOT_READY"

    first = tasks.rollup_gpu_samples()
    assert (first["minute_rows"], first["reports"]) == (1, 1)
    rows = list(GpuRollup1m.objects.values_list("bucket", "samples", "utilization_gpu_pct_sum"))
    tasks.rollup_gpu_samples()
    assert (
        list(GpuRollup1m.objects.values_list("bucket", "samples", "utilization_gpu_pct_sum"))
        == rows
    )

    partitions.forget_cache()
    tasks.ensure_sample_partitions()
    again = tasks.ensure_sample_partitions()
    assert (again["created"], again["dropped"]) == ([], [])
    partitions.forget_cache()
