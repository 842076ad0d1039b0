"""Benchmark: 500 clusters with 2 node pools each, created through the HTTP API and driven to
RUNNING by 2 real Celery worker processes on the simulated provider (DESIGN §9: < 60 s with
2 workers). Prints total time, reconcile steps per second and p50/p99 API latency.

SIMULATED infrastructure: 130 hosts x 8 H100 rows; control planes and machines are ready at
once (delays 0). A cluster runs one mutating operation at a time, so the first pools are
created once the clusters run and the second pools once the first are done — as GKE does.

Run: ``make bench`` (or ``pytest tests/bench/test_bench_reconcile.py -s``).
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.e2e.conftest import BIN, ROOT, service_env, stop, wait_for
from tests.helpers import broker_client

pytestmark = pytest.mark.django_db(transaction=True)

TENANTS, PER_TENANT = 25, 20  # 500 clusters
HOSTS = 130


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_500_clusters_x_2_pools_to_running(catalog, make_host, tmp_path):

    from clusters.models import Cluster, Operation
    from nodepools.models import NodePool
    from tenants import quotas
    from tenants.services import create_api_key, create_tenant

    broker_client().flushdb()
    for _ in range(HOSTS):
        make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    keys = []
    for i in range(TENANTS):
        tenant = create_tenant(name=f"bench-{i}")
        quotas.set_limits(tenant, max_clusters=PER_TENANT)
        keys.append(create_api_key(tenant=tenant, name="k", role="owner")[1])
    env = service_env(
        NVKE_SIMULATED_CONTROL_PLANE_DELAY_S="0",
        NVKE_SIMULATED_NODE_DELAY_S="0",
        NVKE_THROTTLE_PRINCIPAL="1000000/min",
        NVKE_THROTTLE_TENANT="1000000/min",
        LOG_LEVEL="WARNING",
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prom"),
    )
    (tmp_path / "prom").mkdir()
    port = _free_port()
    procs = []
    logs = []

    def start(name, args):
        log = (tmp_path / f"{name}.log").open("w")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                args,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    start(
        "web",
        [
            str(BIN / "gunicorn"),
            "nvke.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
            "--threads",
            "4",
            "--log-level",
            "warning",
        ],
    )
    for i in (1, 2):
        start(
            f"worker-{i}",
            [
                str(BIN / "celery"),
                "-A",
                "nvke",
                "worker",
                "-Q",
                "reconcile,telemetry,billing,default",
                "--concurrency",
                "1",
                "--hostname",
                f"w{i}@bench",
                "--without-heartbeat",
                "--without-mingle",
                "--without-gossip",
                "--loglevel",
                "WARNING",
            ],
        )
    url = f"http://127.0.0.1:{port}"
    latencies: list[float] = []
    session = requests.Session()

    def call(method, path, key, **kw):
        started = time.perf_counter()
        resp = session.request(
            method, url + path, headers={"Authorization": f"Bearer {key}"}, timeout=60, **kw
        )
        latencies.append(time.perf_counter() - started)
        assert resp.status_code < 500, resp.text
        return resp

    try:
        wait_for(lambda: _up(url), what="web up")
        total_started = time.perf_counter()

        def create_cluster(n):
            return call(
                "POST",
                "/api/v1/clusters",
                keys[n % TENANTS],
                json={"name": f"c{n}", "kubernetes_version": "1.36", "region": "us-east-1"},
            ).json()["target_id"], keys[n % TENANTS]

        with ThreadPoolExecutor(8) as pool:
            clusters = list(pool.map(create_cluster, range(TENANTS * PER_TENANT)))
        wait_for(
            lambda: Cluster.objects.filter(phase="RUNNING").count() == len(clusters),
            timeout=600,
            interval=0.5,
            what="clusters RUNNING",
        )
        for round_ in (1, 2):

            def create_pool(item, r=round_):
                cluster_id, key = item
                call(
                    "POST",
                    f"/api/v1/clusters/{cluster_id}/nodepools",
                    key,
                    json={
                        "name": f"p{r}",
                        "gpu_model": "h100-sxm5-80gb",
                        "gpus_per_node": 1,
                        "node_count": 1,
                    },
                )

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(create_pool, clusters))
            expected = round_ * len(clusters)
            wait_for(
                lambda e=expected: NodePool.objects.filter(phase="RUNNING").count() == e,
                timeout=900,
                interval=0.5,
                what=f"round {round_} pools RUNNING",
            )
        total = time.perf_counter() - total_started
        metrics = requests.get(f"{url}/metrics", timeout=30).text
        task_runs = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("nvke_celery_tasks_total{") and "reconcile_" in line
        )
    finally:
        for proc in procs:
            stop(proc)
        for log in logs:
            log.close()
    steps = Operation.objects.count()
    lat = sorted(latencies)
    p50 = statistics.median(lat) * 1000
    p99 = lat[int(len(lat) * 0.99) - 1] * 1000
    print()
    print("| what | value |")
    print("| --- | --- |")
    print(f"| clusters / node pools to RUNNING | {len(clusters)} / {2 * len(clusters)} |")
    print(f"| total time (2 workers) | {total:.1f} s (target < 60 s) |")
    print(f"| operations completed | {steps} |")
    print(f"| reconcile steps (task runs) | {task_runs:.0f} |")
    print(f"| reconcile steps per second | {task_runs / total:.1f} |")
    print(f"| API requests | {len(lat)} |")
    print(f"| API latency p50 / p99 | {p50:.1f} ms / {p99:.1f} ms |")
    assert NodePool.objects.filter(phase="RUNNING").count() == 2 * len(clusters)


def _up(url: str) -> bool:
    try:
        return requests.get(f"{url}/healthz", timeout=5).ok
    except requests.RequestException:
        return False
