"""Benchmark: hosted control planes on this machine (DESIGN §9, issue 30).

N clusters (``NVKE_BENCH_HOSTED_CLUSTERS``, default 10) are created one after another through
the HTTP API's view (APIClient) at Kubernetes 1.36 with warm binaries; a real control-plane
manager runs their kube-apiserver, controller-manager and scheduler on one etcd; the reconciler
runs in this process as a worker would. For each cluster: seconds from ``POST /clusters`` to
its kube-apiserver answering the tenant's kubeconfig (a namespace list). With all N alive:
resident memory per control plane (the three processes, psutil), etcd's, and the latency of
``GET /version`` across all of them (is every API still responsive?). Prints a table.

Run: ``make bench``
(or ``pytest tests/bench/test_bench_hosted.py -s -p nvke.embedded.pytest_plugin``).
"""

from __future__ import annotations

import os
import statistics
import time

import psutil
import pytest
from kubernetes import client as k8s

from tests.hosted.conftest import (
    Manager,
    api_client,
    kubeconfig_of,
    reconcile_until,
    require_binaries,
)

pytestmark = pytest.mark.django_db(transaction=True)

GIB = 1024**3


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def test_post_clusters_to_api_answering_memory_and_side_by_side(
    make_host, owner, settings, tmp_path
):
    require_binaries(("etcd", "v1.36"))
    n = int(os.environ.get("NVKE_BENCH_HOSTED_CLUSTERS", "10"))
    settings.NVKE_DEFAULT_PROVIDER = "hosted"
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    manager = Manager(tmp_path / "planes", tmp_path / "manager.log")
    manager.start()
    try:
        seconds, apis = [], []
        for i in range(n):
            t0 = time.monotonic()
            resp = owner.post(
                "/api/v1/clusters",
                {"name": f"bench-{i}", "kubernetes_version": "1.36", "region": "us-east-1"},
                format="json",
            )
            assert resp.status_code == 202, resp.content
            cluster = reconcile_until(
                resp.json()["target_id"], lambda c: c.phase == "RUNNING", timeout=300
            )
            api = api_client(kubeconfig_of(owner, cluster))
            assert k8s.CoreV1Api(api).list_namespace().items
            seconds.append(time.monotonic() - t0)
            apis.append(api)

        from clusters.models import HostedControlPlane

        rss = []
        for row in HostedControlPlane.objects.all():
            rss.append(sum(psutil.Process(pid).memory_info().rss for pid in row.pids.values()))
        etcd = [
            p
            for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"]
            and p.info["cmdline"][0].endswith("/etcd")
            and str(tmp_path) in " ".join(p.info["cmdline"])
        ]
        etcd_rss = sum(p.memory_info().rss for p in etcd)
        latencies = []
        for _ in range(5):
            for api in apis:
                t = time.monotonic()
                assert k8s.VersionApi(api).get_code().git_version.startswith("v1.36.")
                latencies.append((time.monotonic() - t) * 1000)
        mean_rss = statistics.mean(rss)
        fit = int((24 * GIB - etcd_rss) // mean_rss)
        print(
            f"\nhosted control planes, {n} clusters, 1.36, warm binaries, this machine\n"
            f"  POST /clusters -> API answering: p50 {statistics.median(seconds):.1f} s, "
            f"p95 {_pct(seconds, 95):.1f} s, max {max(seconds):.1f} s (goal p50 < 30 s)\n"
            f"  resident memory per control plane (apiserver+kcm+scheduler): "
            f"mean {mean_rss / 2**20:.0f} MiB, max {max(rss) / 2**20:.0f} MiB (goal <= 400 MB); "
            f"etcd {etcd_rss / 2**20:.0f} MiB\n"
            f"  {n} side by side: GET /version p50 {statistics.median(latencies):.1f} ms, "
            f"p95 {_pct(latencies, 95):.1f} ms over {len(latencies)} calls; "
            f"24 GiB / mean resident = {fit} control planes (memory bound, estimate)"
        )
        assert len(apis) == n
    finally:
        manager.stop()
