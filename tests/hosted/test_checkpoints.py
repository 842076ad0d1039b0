"""The checkpoint ack in the tenant's own cluster (nodepools/checkpoints.py): a driver upgrade
of a hosted pool with a disruption hook cordons the real Node, asks, and evicts nothing until
the workload annotates its pod ``nvke.io/checkpointed: <request id>`` through the cluster's
real kube-apiserver; NVKE reads the annotation there (``Provider.pod_annotations``), and the
pod is then evicted through the Eviction API.

One hosted control plane (real kube-apiserver, controller-manager, scheduler and KWOK)."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from tests.e2e.conftest import wait_for
from tests.hosted.conftest import api_client, create_cluster, kubeconfig_of
from tests.hosted.test_evictions import deployment, gone, running_pod
from tests.hosted.test_gpu_nodes import create_pool, drive, node_names

pytestmark = [pytest.mark.timeout(420), pytest.mark.usefixtures("hosted")]


def test_a_pod_annotated_with_the_request_id_in_the_tenant_cluster_lets_the_drain_go_on(
    owner, make_host
):
    from clusters.models import Operation
    from nodepools.models import DisruptionRequest

    for _ in range(2):
        make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    cluster = create_cluster(owner, "ckpt")
    core = k8s.CoreV1Api(api_client(kubeconfig_of(owner, cluster)))
    pool_id = create_pool(owner, cluster, "train", {"mode": "exclusive"}, nodes=1)
    (node,) = node_names(pool_id)
    k8s.AppsV1Api(core.api_client).create_namespaced_deployment(
        "default", deployment("trainer", node)
    )
    trainer = running_pod(core, "trainer", node)
    url = f"/api/v1/clusters/{cluster.id}/nodepools/{pool_id}"
    hook = owner.put(f"{url}/disruption-hook", {"checkpoint_deadline_s": 300}, format="json")
    assert hook.status_code == 200, hook.content
    resp = owner.post(f"{url}/upgrade", {"driver_version": "580.95.05"}, format="json")
    assert resp.status_code == 202, resp.content

    def asked(_pool):
        return DisruptionRequest.objects.filter(nodepool_id=pool_id).exists()

    drive(pool_id, asked, what="the checkpoint request")
    for _ in range(3):  # more looks: still waiting, the pod untouched
        drive(pool_id, lambda p: True)
    (request,) = DisruptionRequest.objects.filter(nodepool_id=pool_id)
    assert (request.nodes, request.reason, request.state) == ([node], "upgrade", "waiting")
    assert core.read_node(node).spec.unschedulable is True  # cordoned before asking
    pod = core.read_namespaced_pod(trainer, "default")
    assert pod.status.phase == "Running" and pod.metadata.deletion_timestamp is None
    stage = Operation.objects.get(pk=resp.json()["id"]).progress["stage"]
    assert stage == (
        f"upgrading {node}; {node}: waiting for checkpoint "
        f"(deadline {request.deadline.isoformat()})"
    )

    # another request's id is not an ack; the right one, set by the workload, is
    core.patch_namespaced_pod(
        trainer, "default", {"metadata": {"annotations": {"nvke.io/checkpointed": "other"}}}
    )
    drive(pool_id, lambda p: True)
    request.refresh_from_db()
    assert request.state == "waiting"
    core.patch_namespaced_pod(
        trainer, "default", {"metadata": {"annotations": {"nvke.io/checkpointed": str(request.id)}}}
    )

    def released(_pool):
        request.refresh_from_db()
        return request.released_at is not None

    drive(pool_id, released, what="the drain released by the annotation")
    assert (request.state, request.acknowledged_via, request.acknowledged_by) == (
        "acknowledged",
        "annotation",
        f"default/{trainer}",
    )
    assert request.acknowledged_at <= request.released_at < request.deadline
    drive(pool_id, lambda p: gone(core, trainer), what="the checkpointed pod evicted")
    wait_for(lambda: gone(core, trainer), timeout=5, what="the pod gone")
