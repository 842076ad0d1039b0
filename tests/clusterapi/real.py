"""Helpers of the tests against the real Cluster API testbed (conftest.py starts it)."""

from __future__ import annotations

import time

from kubernetes import client as k8s
from kubernetes import config as k8s_config

NS = "nvke-test"
SINGLE = {"mode": "mig", "mig_profile": "1g.10gb"}
CAPI = ("cluster.x-k8s.io", "v1beta2")
KCP = ("controlplane.cluster.x-k8s.io", "v1beta2")


class Apis:
    """kubernetes clients for the testbed's management and workload API servers."""

    def __init__(self, bed) -> None:
        self.mgmt = k8s_config.new_client_from_config(config_file=bed.management_kubeconfig)
        self.work = k8s_config.new_client_from_config(config_file=bed.workload_kubeconfig)
        self.custom = k8s.CustomObjectsApi(self.mgmt)
        self.core = k8s.CoreV1Api(self.work)
        self.policy = k8s.PolicyV1Api(self.work)

    def machines(self, cluster_name: str, *, pool: str | None = None) -> list[dict]:
        selector = f"cluster.x-k8s.io/cluster-name={cluster_name}"
        if pool:
            selector += f",nvke.io/nodepool-id={pool}"
        items = self.custom.list_namespaced_custom_object(
            *CAPI, NS, "machines", label_selector=selector
        )["items"]
        return sorted(items, key=lambda m: m["metadata"]["name"])

    def get(self, plural: str, name: str, group=CAPI) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(*group, NS, plural, name)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise


def wait_for(what: str, check, reconcile, timeout: float = 240.0):
    """Call ``reconcile()`` (the reconcilers, with their on-commit work run) until
    ``check()`` is truthy; returns what it returned."""
    deadline = time.monotonic() + timeout
    while True:
        reconcile()
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def capi_name(cluster) -> str:
    return f"{cluster.name}-{cluster.id.hex[:8]}"


def phase_of(model, pk) -> str:
    return model.objects.get(pk=pk).phase


def make_cluster(owner, name: str, version: str = "1.36"):
    from clusters.models import Cluster

    response = owner.post(
        "/api/v1/clusters",
        {"name": name, "kubernetes_version": version, "region": "us-east-1"},
        format="json",
    )
    assert response.status_code == 202, response.content
    return Cluster.objects.get(pk=response.json()["target_id"])


def make_pool(owner, cluster, count: int) -> str:
    response = owner.post(
        f"/api/v1/clusters/{cluster.id}/nodepools",
        {
            "name": "mig",
            "gpu_model": "h100-sxm5-80gb",
            "gpus_per_node": 2,
            "node_count": count,
            "isolation": SINGLE,
        },
        format="json",
    )
    assert response.status_code == 202, response.content
    return response.json()["target_id"]


def running_cluster(owner, drive, name: str, version: str = "1.36"):
    from clusters.models import Cluster

    cluster = make_cluster(owner, name, version)
    assert cluster.provider == "clusterapi"
    wait_for(
        f"cluster {name} RUNNING",
        lambda: phase_of(Cluster, cluster.id) == "RUNNING",
        lambda: drive(cluster.id),
    )
    return Cluster.objects.get(pk=cluster.id)


def running_pool(owner, drive, cluster, count: int):
    from nodepools.models import NodePool

    pool_id = make_pool(owner, cluster, count)
    wait_for(
        f"pool of {count} RUNNING",
        lambda: phase_of(NodePool, pool_id) == "RUNNING",
        lambda: drive(cluster.id, pool_id),
    )
    return pool_id


def live_nodes(pool_id):
    from nodepools.models import Node

    return list(
        Node.objects.filter(nodepool_id=pool_id)
        .exclude(phase="DELETED")
        .order_by("created_at", "name")
    )


def bound(machines: list[dict]) -> dict[str, dict]:
    """{NVKE node id: Machine} of the live Machines NVKE bound."""
    return {
        m["metadata"]["annotations"]["nvke.io/node-id"]: m
        for m in machines
        if "nvke.io/node-id" in (m["metadata"].get("annotations") or {})
        and not m["metadata"].get("deletionTimestamp")
    }
