"""Benchmark: N GPU nodes in one hosted cluster, and the real kube-scheduler placing 2N
one-GPU pods on them, against the same run with N plain CPU nodes (issue 31, "Done when").

N = ``NVKE_BENCH_SCHEDULER_NODES`` (0: 500 under ``make bench``, 20 under ``make bench-ci``).

REAL: etcd, and each cluster's kube-apiserver, kube-controller-manager and kube-scheduler
(1.36, built by deploy/k8s/build.sh), run by a real control-plane manager
(``manage.py run_control_planes``); NVKE's node pool reconciler (run in this process, as a
worker would), its placement on the fleet inventory, and the one writer of the tenant's Nodes
(:func:`nodepools.tenant_nodes.sync_cluster_nodes`). The scheduler places the pods by the
Nodes' allocatable, taints and tolerations exactly as it would on a real cluster.

SIMULATED: the N GPU hosts (8 x H100 SXM5 rows in the fleet, their agents' reports run
in-process, :mod:`clusters.providers.simhosts`) and every kubelet: one KWOK process per cluster
keeps the Nodes Ready (Lease heartbeats every 10 s: the 40 s default) and marks the bound pods
Running. No container runs.

Two clusters on one manager:

- ``gpu``: POST one exclusive pool of N nodes (8 GPUs each) -> seconds until all N Nodes are
  Ready in the tenant's API (listed with the tenant's kubeconfig); then 2N pods asking for one
  ``nvidia.com/gpu`` (limits, with the GPU taint's toleration) -> seconds until the scheduler
  has bound them all (from the first create; pods are created by 4 threads);
- ``cpu`` (the baseline): N Nodes of 32 CPUs / 256 GiB written straight into its API by the
  same writer NVKE uses (:func:`clusters.hosted.nodes.sync`: there are no CPU node pools in
  NVKE) -> seconds until all Ready; then 2N pods requesting 4 CPUs (so 8 fit a node, as 8 GPUs
  do) -> seconds until all bound.

Checked: every pod bound, none left Pending with the scheduler's reason, no node holds more
than 8 of them. Printed: both figures and their ratio; pods bound per second, which is bounded
by how fast this process creates them (the last pod is bound within seconds of the last create,
also printed); each pod's create -> bound time from the API's own timestamps (whole seconds);
the resident memory (RSS) of each cluster's kube-apiserver, kube-scheduler and KWOK; and the
load average (the machine may be shared: read the figures beside it). Nothing is judged: the
issue asks for the figures, not a target.

Run: ``make bench`` (or ``pytest tests/bench/test_bench_hosted_scheduler.py -s
-p nvke.embedded.pytest_plugin``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import psutil
import pytest
from kubernetes import client as k8s

from nvke.settings_registry import read
from tests.bench.size import pick
from tests.hosted.conftest import (
    Manager,
    api_client,
    kubeconfig_of,
    reconcile_until,
    require_binaries,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(pick(5400, 300))]

MIB = 2**20
GPU_MODEL = "h100-sxm5-80gb"
GPUS_PER_NODE = 8
CPUS_PER_NODE, CPUS_PER_POD = 32, 4  # 8 CPU pods fill a CPU node, as 8 GPU pods fill a GPU one
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
#: seconds the Nodes may take to be Ready, the pods to be bound, per 100 of them (+ a minute)
PER_100_S = 60


def _deadline(count: int) -> float:
    return time.monotonic() + 60 + PER_100_S * count / 100


def _items(core: k8s.CoreV1Api, kind: str, **kwargs) -> list[dict]:
    """Nodes or pods as plain JSON (the client's models are slow to build by the thousand)."""
    if kind == "node":
        resp = core.list_node(_preload_content=False, **kwargs)
    else:
        resp = core.list_namespaced_pod("default", _preload_content=False, **kwargs)
    return json.loads(resp.data)["items"]


def _ready(node: dict) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _wait_ready(
    core: k8s.CoreV1Api, n: int, t0: float, selector: str, step=None
) -> tuple[float, float]:
    """Seconds from ``t0`` until ``n`` Nodes matching ``selector`` are in the API (written by
    NVKE) and until all are Ready (KWOK's heartbeat); ``step()`` (a reconcile) runs before
    each look, when given."""
    deadline = _deadline(n)
    written = None
    while True:
        if step is not None:
            step()
        nodes = _items(core, "node", label_selector=selector)
        if written is None and len(nodes) >= n:
            written = time.monotonic() - t0
        ready = sum(1 for node in nodes if _ready(node))
        if ready >= n:
            return written if written is not None else time.monotonic() - t0, time.monotonic() - t0
        assert time.monotonic() < deadline, f"{ready}/{n} Nodes Ready ({selector})"
        time.sleep(0.2)


def _pod(name: str, resources: dict[str, str], tolerations: list[dict]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {
            "tolerations": tolerations,
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04",
                    "resources": {"limits": resources, "requests": resources},
                }
            ],
        },
    }


def _place(core: k8s.CoreV1Api, count: int, resources: dict, tolerations: list) -> dict:
    """Create ``count`` pods (4 threads) and wait until the scheduler has bound them all.
    Returns seconds to create them, seconds from the first create to the last bound, and the
    pods per node."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        list(
            pool.map(
                lambda i: core.create_namespaced_pod(
                    "default", _pod(f"p-{i:05d}", resources, tolerations)
                ),
                range(count),
            )
        )
    created = time.monotonic() - t0
    deadline = _deadline(count)
    while True:
        pods = _items(core, "pod", label_selector="app=bench")
        bound = [p for p in pods if p["spec"].get("nodeName")]
        if len(bound) == count:
            placed = time.monotonic() - t0
            break
        if time.monotonic() > deadline:
            reasons = Counter(
                c.get("message", "")[:120]
                for p in pods
                for c in (p.get("status") or {}).get("conditions") or []
                if c["type"] == "PodScheduled" and c["status"] == "False"
            )
            raise AssertionError(f"{len(bound)}/{count} pods bound; Pending: {dict(reasons)}")
        time.sleep(0.2)
    unschedulable = [
        p["metadata"]["name"]
        for p in pods
        for c in (p.get("status") or {}).get("conditions") or []
        if c["type"] == "PodScheduled" and c["status"] == "False"
    ]
    assert unschedulable == []
    latencies = sorted(
        (_time(c["lastTransitionTime"]) - _time(p["metadata"]["creationTimestamp"]))
        for p in bound
        for c in p["status"]["conditions"]
        if c["type"] == "PodScheduled" and c["status"] == "True"
    )
    return {
        "created": created,
        "placed": placed,
        "per_node": Counter(p["spec"]["nodeName"] for p in bound),
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))],
    }


def _time(text: str) -> float:
    """An API timestamp (whole seconds, ``2026-12-06T07:10:17Z``) as epoch seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _rss(cluster) -> dict[str, float]:
    """MiB resident of the cluster's kube-apiserver, kube-scheduler and KWOK (psutil)."""
    from clusters.models import HostedControlPlane

    pids = HostedControlPlane.objects.get(cluster=cluster).pids
    return {
        c: psutil.Process(pids[c]).memory_info().rss / MIB if c in pids else float("nan")
        for c in ("kube-apiserver", "kube-scheduler", "kwok")
    }


def test_n_gpu_nodes_ready_and_2n_one_gpu_pods_placed_against_cpu_nodes(
    owner, tenant_a, make_host, settings, tmp_path
):
    from clusters.hosted.nodes import sync as write_nodes
    from clusters.providers.base import TenantNode
    from clusters.reconcile import reconcile_cluster
    from nodepools.models import NodePool
    from nodepools.reconcile import reconcile_nodepool
    from tenants import quotas

    require_binaries(("etcd", "v1.36", "kwok"))
    n = read("NVKE_BENCH_SCHEDULER_NODES") or pick(500, 20)
    pods = 2 * n
    settings.NVKE_DEFAULT_PROVIDER = "hosted"
    quotas.set_limits(tenant_a, max_nodes=n, max_gpus={GPU_MODEL: n * GPUS_PER_NODE})
    t = time.monotonic()
    for _ in range(n):  # SIMULATED hosts: fleet rows, their agents report in-process
        make_host(GPU_MODEL, gpus=GPUS_PER_NODE, zone="us-east-1a")
    hosts_s = time.monotonic() - t
    manager = Manager(tmp_path / "planes", tmp_path / "manager.log")
    manager.start()
    try:
        # both control planes start side by side: the first reconcile step writes each row
        ids = []
        for name in ("gpu", "cpu"):
            resp = owner.post(
                "/api/v1/clusters",
                {"name": name, "kubernetes_version": "1.36", "region": "us-east-1"},
                format="json",
            )
            assert resp.status_code == 202, resp.content
            ids.append(resp.json()["target_id"])
            reconcile_cluster(ids[-1])
        gpu_cluster, cpu_cluster = (
            reconcile_until(i, lambda c: c.phase == "RUNNING", timeout=300) for i in ids
        )
        gpu = k8s.CoreV1Api(api_client(kubeconfig_of(owner, gpu_cluster)))
        cpu = k8s.CoreV1Api(api_client(kubeconfig_of(owner, cpu_cluster)))
        version = "v" + gpu_cluster.control_plane_version

        # --- GPU: one exclusive pool of N nodes through the API, reconciled here --------------
        t0 = time.monotonic()
        resp = owner.post(
            f"/api/v1/clusters/{gpu_cluster.id}/nodepools",
            {
                "name": "train",
                "gpu_model": GPU_MODEL,
                "gpus_per_node": GPUS_PER_NODE,
                "node_count": n,
                "isolation": {"mode": "exclusive"},
            },
            format="json",
        )
        assert resp.status_code == 202, resp.content
        pool_id = resp.json()["target_id"]
        running: list[float] = []
        steps = Counter()

        def step() -> None:
            if running:
                return
            reconcile_nodepool(pool_id)
            steps["reconcile"] += 1
            if NodePool.objects.get(pk=pool_id).phase == "RUNNING":
                running.append(time.monotonic() - t0)

        gpu_written, gpu_ready = _wait_ready(gpu, n, t0, "nvke.io/nodepool=train", step)
        while not running:  # the Nodes can be Ready a step before the pool says RUNNING
            step()
        nodes = _items(gpu, "node", label_selector="nvke.io/nodepool=train")
        assert {node["status"]["allocatable"]["nvidia.com/gpu"] for node in nodes} == {"8"}
        gpu_pods = _place(gpu, pods, {"nvidia.com/gpu": "1"}, [TOLERATION])
        gpu_rss = _rss(gpu_cluster)

        # --- CPU baseline: N Nodes written by the same writer, no pool --------------------------
        resources = {"cpu": str(CPUS_PER_NODE), "memory": "256Gi", "pods": "110"}
        cpu_nodes = [
            TenantNode(
                name=f"cpu-{i:05d}",
                labels={"nvke.io/nodepool": "cpu", "kubernetes.io/hostname": f"cpu-{i:05d}"},
                taints=(),
                capacity=resources,
                allocatable=resources,
                conditions=(),
                unschedulable=False,
                kubelet_version=version,
            )
            for i in range(n)
        ]
        t0 = time.monotonic()
        write_nodes(cpu.api_client, cpu_nodes)
        cpu_written, cpu_ready = _wait_ready(cpu, n, t0, "nvke.io/nodepool=cpu")
        cpu_pods = _place(cpu, pods, {"cpu": str(CPUS_PER_POD)}, [])
        cpu_rss = _rss(cpu_cluster)
    finally:
        manager.stop()

    names = {node["metadata"]["name"] for node in nodes}
    assert set(gpu_pods["per_node"]) <= names, "a GPU pod bound outside the pool"
    assert max(gpu_pods["per_node"].values()) <= GPUS_PER_NODE
    assert max(cpu_pods["per_node"].values()) <= CPUS_PER_NODE // CPUS_PER_POD
    load = psutil.getloadavg()

    def row(what: str, gpu_s: float, cpu_s: float) -> str:
        ratio = f"{gpu_s / cpu_s:>7.2f}" if cpu_s else "      -"
        return f"  {what:<50} {gpu_s:>9.1f} {cpu_s:>9.1f} {ratio}"

    def lag(p: dict) -> float:
        return p["placed"] - p["created"]

    def spread(p: dict) -> str:
        return f"{len(p['per_node'])} nodes, at most {max(p['per_node'].values())} a node"

    g, c = gpu_pods, cpu_pods
    lines = [
        f"\nhosted scheduler, {n} nodes and {pods} pods per cluster, Kubernetes {version}, "
        f"this machine ({psutil.cpu_count()} CPUs; load average {load[0]:.1f} {load[1]:.1f} "
        f"{load[2]:.1f}; {n} simulated hosts made in {hosts_s:.1f} s)",
        f"  {'':<50} {'GPU':>9} {'CPU':>9} {'ratio':>7}",
        row(f"{n} Nodes in the API, written by NVKE (s)", gpu_written, cpu_written),
        row(f"{n} Nodes Ready in the API (s)", gpu_ready, cpu_ready),
        row(
            "  of which written -> Ready (s, KWOK)",
            gpu_ready - gpu_written,
            cpu_ready - cpu_written,
        ),
        f"  (the GPU pool RUNNING after {running[0]:.1f} s, {steps['reconcile']} reconcile "
        f"steps in this process: placement, each host's agent report and observed-state gate, "
        f"the Node writes; the CPU Nodes have no pool: written in one call)",
        row(f"{pods} pods created (s, 4 threads)", g["created"], c["created"]),
        row(f"{pods} pods bound, from the first create (s)", g["placed"], c["placed"]),
        row("  of which after the last create (s)", lag(g), lag(c)),
        row("pods bound per second", pods / g["placed"], pods / c["placed"]),
        row("create -> bound per pod, p50 (s, API: 1 s steps)", g["p50"], c["p50"]),
        row("create -> bound per pod, p99 (s, API: 1 s steps)", g["p99"], c["p99"]),
        f"  spread: GPU {spread(g)}; CPU {spread(c)}",
        "  RSS, MiB: "
        + "; ".join(
            f"{k.removeprefix('kube-')} GPU {gpu_rss[k]:.0f} / CPU {cpu_rss[k]:.0f}"
            for k in gpu_rss
        ),
    ]
    print("\n".join(lines))
