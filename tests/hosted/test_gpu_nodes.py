"""GPU nodes live in the tenant's cluster (issue 31): each node of a pool is a real Node in the
cluster's kube-apiserver, kept alive by the cluster's KWOK, with what the scheduler sees
derived from the host agent's latest report; the cluster's own kube-scheduler places pods by it.

One hosted control plane for the whole module (a real control-plane manager, etcd,
kube-apiserver, controller-manager, scheduler and KWOK); the node pools are reconciled in this
process, their simulated hosts report through the agent's in-process path.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.e2e.conftest import wait_for
from tests.hosted.conftest import api_client, create_cluster, kubeconfig_of, kubectl

pytestmark = pytest.mark.timeout(420)

TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
H100 = "NVIDIA-H100-80GB-HBM3"  # GFD's product label: the NVML name with '-' for blanks


def drive(pool_id, until, timeout: float = 90, what: str = "pool"):
    """Reconcile the pool in this process (as a worker would) until ``until(pool)``."""
    from nodepools.models import NodePool
    from nodepools.reconcile import reconcile_nodepool

    deadline = time.monotonic() + timeout
    while True:
        delay = reconcile_nodepool(pool_id)
        pool = NodePool.objects.get(pk=pool_id)
        if until(pool):
            return pool
        assert time.monotonic() < deadline, f"{what}: {pool.phase} {pool.conditions}"
        time.sleep(min(delay if delay is not None else 0.2, 0.5))


def create_pool(owner, cluster, name: str, isolation: dict, nodes: int = 1, **fields) -> str:
    """POST a pool (8-GPU H100 nodes unless ``fields`` say otherwise) and drive it RUNNING."""
    body = {
        "name": name,
        "gpu_model": "h100-sxm5-80gb",
        "gpus_per_node": 8,
        "node_count": nodes,
        "isolation": isolation,
        **fields,
    }
    resp = owner.post(f"/api/v1/clusters/{cluster.id}/nodepools", body, format="json")
    assert resp.status_code == 202, resp.content
    pool_id = resp.json()["target_id"]
    drive(pool_id, lambda p: p.phase == "RUNNING", what=f"{name} RUNNING")
    return pool_id


def node_names(pool_id) -> list[str]:
    from nodepools.models import Node

    return sorted(
        Node.objects.filter(nodepool_id=pool_id, phase="READY").values_list("name", flat=True)
    )


def lease_renewals(core_api, coord, name: str, count: int) -> list:
    """Wait until KWOK renewed node ``name``'s Lease ``count`` times; the renew times seen."""
    seen: list = []

    def renewed():
        try:
            lease = coord.read_namespaced_lease(name, "kube-node-lease")
        except ApiException:
            return None
        if lease.spec.renew_time not in seen:
            seen.append(lease.spec.renew_time)
        return seen if len(seen) > count else None  # the first one seen + ``count`` renewals

    return wait_for(renewed, timeout=30, interval=0.2, what=f"{count} Lease renewals of {name}")


def pod(name: str, gpus: int, resource: str = "nvidia.com/gpu") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "tolerations": [TOLERATION],
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04",
                    "resources": {"limits": {resource: str(gpus)}},
                }
            ],
        },
    }


def test_an_h100_pool_is_schedulable_by_the_clusters_own_scheduler_from_observed_truth(
    hosted, owner, make_host, tmp_path
):
    from clusters.models import HostedControlPlane
    from nodepools.models import Node
    from nodepools.tasks import sync_tenant_nodes
    from nodepools.tenant_nodes import sync_cluster_nodes
    from nvke.queueing import clear_pending, enqueue_once

    hosts = [make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a") for _ in range(4)]
    cluster = create_cluster(owner, "gpus")
    kubeconfig = kubeconfig_of(owner, cluster)
    api = api_client(kubeconfig)
    core, coord = k8s.CoreV1Api(api), k8s.CoordinationV1Api(api)

    # --- an exclusive pool of one 8-GPU node: a Ready Node with 8 GPUs and GFD's labels ----
    pool = create_pool(owner, cluster, "train", {"mode": "exclusive"})
    [name] = node_names(pool)
    lease_renewals(core, coord, name, 3)  # KWOK's heartbeats: NVKE's fields must survive them
    node = core.read_node(name)
    ready = {c.type: c for c in node.status.conditions}
    assert ready["Ready"].status == "True" and ready["Ready"].reason == "KubeletReady"
    assert node.status.node_info.kubelet_version == "v" + cluster.control_plane_version
    # one version for a node everywhere (issue 33, D3): the API's node row says the patch the
    # kubelet reports (deploy/k8s/v1.36/go.mod pins 1.36.3), and an upgrade to the bare minor
    # is nothing to do (it was a rolling "upgrade" that then said 1.36)
    assert node.status.node_info.kubelet_version == "v1.36.3"
    body = owner.get(f"/api/v1/clusters/{cluster.id}/nodepools/{pool}").json()
    assert [(n["name"], n["kubernetes_version"]) for n in body["nodes"]] == [(name, "1.36.3")]
    again = owner.post(
        f"/api/v1/clusters/{cluster.id}/nodepools/{pool}/upgrade", {"kubernetes_version": "1.36"}
    )
    assert (again.status_code, again.json()["code"]) == (400, "nothing_to_upgrade")
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    assert node.status.capacity["nvidia.com/gpu"] == "8"
    labels = node.metadata.labels
    assert {k: labels.get(k) for k in (
        "nvidia.com/gpu.product", "nvidia.com/gpu.memory", "nvidia.com/gpu.count",
        "nvidia.com/gpu.replicas", "nvidia.com/gpu.present", "nvidia.com/mig.strategy",
        "nvidia.com/mig.config.state", "nvidia.com/mig.capable", "nvke.io/nodepool",
    )} == {
        "nvidia.com/gpu.product": H100, "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.present": "true", "nvidia.com/mig.strategy": "none",
        "nvidia.com/mig.config.state": "success", "nvidia.com/mig.capable": "true",
        "nvke.io/nodepool": "train",
    }  # fmt: skip
    assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [
        ("nvidia.com/gpu", "present", "NoSchedule")
    ]
    assert ready["GpuXidCritical"].status == "False"
    wide = kubectl(kubeconfig, tmp_path, "get", "nodes", "--no-headers")
    assert wide.split()[:2] == [name, "Ready"]

    # --- a Job asking for one GPU runs there; 8 + a 9th GPU: Pending, the scheduler says why -
    batch = k8s.BatchV1Api(api)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "one-gpu"},
        "spec": {"template": {"spec": {**pod("x", 1)["spec"], "restartPolicy": "Never"}}},
    }
    batch.create_namespaced_job("default", job)
    wait_for(
        lambda: (batch.read_namespaced_job_status("one-gpu", "default").status.succeeded or 0) == 1,
        timeout=60,
        what="the Job succeeded",
    )
    [job_pod] = core.list_namespaced_pod("default", label_selector="job-name=one-gpu").items
    assert job_pod.spec.node_name == name and job_pod.status.phase == "Succeeded"

    core.create_namespaced_pod("default", pod("eight", 8))
    wait_for(
        lambda: core.read_namespaced_pod("eight", "default").status.phase == "Running",
        timeout=60,
        what="the 8-GPU pod Running",
    )
    assert core.read_namespaced_pod("eight", "default").spec.node_name == name
    core.create_namespaced_pod("default", pod("ninth", 1))

    def unschedulable():
        events = core.list_namespaced_event(
            "default", field_selector="involvedObject.name=ninth,reason=FailedScheduling"
        ).items
        return events[0] if events else None

    event = wait_for(unschedulable, timeout=60, what="FailedScheduling of the 9th GPU")
    assert event.message.startswith("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    assert event.source.component == "default-scheduler"
    assert core.read_namespaced_pod("ninth", "default").status.phase == "Pending"
    core.delete_namespaced_pod("ninth", "default", grace_period_seconds=0)

    # --- Xid 79 on one GPU: the host's agent reports it, allocatable drops by one -----------
    from clusters.providers import simhosts
    from fleet.models import Host

    row = Node.objects.get(name=name)
    lost = row.gpu_uuids[3]
    host = Host.objects.get(pk=row.host_id)
    simhosts.change(
        host, lambda s: simhosts.add_xid(s, lost, 79, message="GPU has fallen off the bus")
    )
    clear_pending(sync_tenant_nodes.name, str(cluster.id))
    assert simhosts.report_in_process(host, events_after=0)
    assert not enqueue_once(sync_tenant_nodes, str(cluster.id))  # the receiver enqueued it
    sync_tenant_nodes(str(cluster.id))  # run it as the worker would
    after = core.read_node(name)
    assert after.status.allocatable["nvidia.com/gpu"] == "7"
    assert after.status.capacity["nvidia.com/gpu"] == "8"
    xid = {c.type: c for c in after.status.conditions}["GpuXidCritical"]
    assert (xid.status, xid.reason, xid.message) == ("True", "XidCriticalError", f"{lost}: Xid 79")
    assert {c.type: c for c in after.status.conditions}["Ready"].status == "True"

    # --- cordon: spec.unschedulable follows the node's phase (set as the disruption path does)
    Node.objects.filter(name=name).update(phase="CORDONED")
    sync_cluster_nodes(cluster.id)
    assert core.read_node(name).spec.unschedulable is True
    Node.objects.filter(name=name).update(phase="READY")
    sync_cluster_nodes(cluster.id)
    assert not core.read_node(name).spec.unschedulable

    # --- the host reports MIG on under the exclusive node: the Node follows the report ------
    clear_pending(sync_tenant_nodes.name, str(cluster.id))
    simhosts.change(
        host,
        lambda s: simhosts.apply_mig(
            s, [row.gpu_uuids[0]], True, [{"profile": "1g.10gb", "start": 0, "size": 1}]
        ),
    )
    assert simhosts.report_in_process(host)
    assert not enqueue_once(sync_tenant_nodes, str(cluster.id))  # the ingest signal's receiver
    sync_tenant_nodes(str(cluster.id))
    drifted = core.read_node(name)
    assert drifted.metadata.labels["nvidia.com/mig.config.state"] == "pending"
    assert drifted.status.allocatable["nvidia.com/gpu"] == "7"  # strategy none: still a GPU

    # --- MIG mixed {1g.10gb: 7} on 8 GPUs, and one profile on every GPU ("single") ---------
    mixed = create_pool(owner, cluster, "mixed", {"mode": "mig", "mig_layout": {"1g.10gb": 7}})
    single = create_pool(owner, cluster, "single", {"mode": "mig", "mig_profile": "1g.10gb"})
    [mixed_name], [single_name] = node_names(mixed), node_names(single)
    lease_renewals(core, coord, single_name, 3)
    m = core.read_node(mixed_name)
    assert m.status.allocatable["nvidia.com/mig-1g.10gb"] == str(7 * 8)
    assert "nvidia.com/gpu" not in m.status.allocatable
    assert m.metadata.labels["nvidia.com/mig.strategy"] == "mixed"
    assert m.metadata.labels["nvidia.com/mig-1g.10gb.count"] == "56"
    assert m.metadata.labels["nvidia.com/mig-1g.10gb.product"] == f"{H100}-MIG-1g.10gb"
    assert m.metadata.labels["nvidia.com/gpu.count"] == "8"
    assert m.metadata.labels["nvidia.com/mig.config.state"] == "success"
    s = core.read_node(single_name)
    assert s.status.allocatable["nvidia.com/gpu"] == str(7 * 8)
    assert s.metadata.labels["nvidia.com/gpu.product"] == f"{H100}-MIG-1g.10gb"
    assert s.metadata.labels["nvidia.com/mig.strategy"] == "single"
    assert s.status.node_info.kubelet_version == "v" + cluster.control_plane_version

    # --- scale 2 -> 1: the removed node's Node is deleted ------------------------------------
    url = f"/api/v1/clusters/{cluster.id}/nodepools/{mixed}"
    resp = owner.post(f"{url}/set-size", {"node_count": 2}, format="json")
    assert resp.status_code == 202, resp.content
    drive(mixed, lambda p: p.phase == "RUNNING" and len(node_names(mixed)) == 2, what="2 nodes")
    two = node_names(mixed)
    assert {
        n.metadata.name for n in core.list_node(label_selector="nvke.io/nodepool=mixed").items
    } == set(two)
    resp = owner.post(f"{url}/set-size", {"node_count": 1}, format="json")
    assert resp.status_code == 202, resp.content
    drive(mixed, lambda p: p.phase == "RUNNING" and len(node_names(mixed)) == 1, what="1 node")
    [kept] = node_names(mixed)
    assert {
        n.metadata.name for n in core.list_node(label_selector="nvke.io/nodepool=mixed").items
    } == {kept}
    (gone,) = set(two) - {kept}
    with pytest.raises(ApiException) as missing:
        core.read_node(gone)
    assert missing.value.status == 404
    assert len(hosts) == 4

    # KWOK is one of the cluster's supervised processes
    pids = HostedControlPlane.objects.get(pk=cluster.id).pids
    assert set(pids) == {"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}

    # --- KWOK is supervised: killed, it comes back and renews the Leases again --------------
    import os
    import signal

    import psutil

    os.kill(pids["kwok"], signal.SIGKILL)
    new = wait_for(
        lambda: (
            HostedControlPlane.objects.get(pk=cluster.id).pids.get("kwok")
            not in (None, pids["kwok"])
            and HostedControlPlane.objects.get(pk=cluster.id).pids
        ),
        timeout=30,
        what="kwok restarted",
    )
    lease_renewals(core, coord, kept, 2)
    assert core.read_node(kept).status.allocatable["nvidia.com/mig-1g.10gb"] == "56"

    # --- deleting the cluster stops every process, KWOK included ------------------------------
    from clusters.models import Cluster
    from clusters.reconcile import reconcile_cluster
    from nodepools.reconcile import reconcile_nodepool

    assert owner.delete(f"/api/v1/clusters/{cluster.id}").status_code == 202
    deadline = time.monotonic() + 120
    while Cluster.objects.get(pk=cluster.id).phase != "DELETED":
        assert time.monotonic() < deadline, Cluster.objects.get(pk=cluster.id).conditions
        for pool_id in (pool, mixed, single):
            reconcile_nodepool(pool_id)
        reconcile_cluster(cluster.id)
        time.sleep(0.3)
    assert not [p for p in new.values() if psutil.pid_exists(p)]
