"""NVKE's clusterapi provider against REAL Cluster API controllers on a REAL kube-apiserver
(testbed.py: Cluster API v1.13.6 core, kubeadm bootstrap and control plane, CAPD v1.13.7),
through NVKE's REST API and real reconcilers. SIMULATED: the machines and the workload
clusters' control planes (CAPD's in-memory backend), the GPU hosts (``make_host`` rows, their
agents reporting in-process) and so the machines' Nodes in the workload API server, which NVKE
writes from those reports (``NVKE_CLUSTERAPI_SIMULATED_NODES``) and KWOK keeps Ready.

Each test makes its own cluster; the testbed is shared by the session.
"""

from __future__ import annotations

import pytest

from tests.clusterapi.real import (
    CAPI,
    NS,
    bound,
    capi_name,
    live_nodes,
    phase_of,
    running_cluster,
    running_pool,
    wait_for,
)

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(420)]


# --- tests --------------------------------------------------------------------------------------


def test_a_cluster_runs_scales_and_is_deleted_with_its_load_balancer(
    owner, capi_settings, hosts, apis, drive
):
    from billing.models import LedgerEntry
    from clusters.models import Cluster
    from nodepools.models import Node, NodePool

    cluster = running_cluster(owner, drive, "run")
    name = capi_name(cluster)
    capi_cluster = apis.get("clusters", name)
    assert capi_cluster["spec"]["infrastructureRef"] == {
        "apiGroup": "infrastructure.cluster.x-k8s.io",
        "kind": "DevCluster",
        "name": name,
    }
    conditions = {c["type"]: c["status"] for c in capi_cluster["status"]["conditions"]}
    assert (conditions["InfrastructureReady"], conditions["ControlPlaneAvailable"]) == (
        "True",
        "True",
    )
    ep = capi_cluster["spec"]["controlPlaneEndpoint"]
    assert cluster.endpoint == f"https://{ep['host']}:{ep['port']}"
    kcp = apis.get(
        "kubeadmcontrolplanes",
        f"{name}-control-plane",
        ("controlplane.cluster.x-k8s.io", "v1beta2"),
    )
    assert (kcp["status"]["version"], kcp["status"]["replicas"]) == ("v1.36.0", 1)

    pool_id = running_pool(owner, drive, cluster, 2)
    nodes = live_nodes(pool_id)
    machines = bound(apis.machines(name, pool=pool_id))
    assert sorted(machines) == sorted(str(n.id) for n in nodes)
    for node in nodes:
        machine = machines[str(node.id)]
        assert machine["status"]["phase"] == "Running"
        ready = {c["type"]: c["status"] for c in machine["status"]["conditions"]}
        assert ready["NodeReady"] == "True"
        # what a real kubelet would register with: NVKE's template, rendered by the real
        # bootstrap provider into the Machine's KubeadmConfig
        config = apis.get(
            "kubeadmconfigs",
            machine["spec"]["bootstrap"]["configRef"]["name"],
            ("bootstrap.cluster.x-k8s.io", "v1beta2"),
        )
        registration = config["spec"]["joinConfiguration"]["nodeRegistration"]
        node_labels = dict(
            kv.split("=", 1)
            for kv in next(
                a["value"] for a in registration["kubeletExtraArgs"] if a["name"] == "node-labels"
            ).split(",")
        )
        assert node_labels["nvidia.com/mig.config"] == "all-1g.10gb"
        assert node_labels["nvke.io/nodepool-id"] == pool_id
        assert registration["taints"] == [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
        ]
        # the simulated machine's Node: NVKE wrote it from the host's report (KWOK posted
        # Ready) with the same labels and taint, and what GFD would add for 2 GPUs in MIG
        # (7 x 1g.10gb each, strategy single)
        node_obj = apis.core.read_node(machine["status"]["nodeRef"]["name"])
        assert {c.type: c.status for c in node_obj.status.conditions}["Ready"] == "True"
        assert node_obj.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
        assert node_obj.metadata.labels["nvidia.com/mig.config"] == "all-1g.10gb"
        assert node_obj.metadata.labels["nvke.io/nodepool-id"] == pool_id
        assert node_obj.metadata.labels["nvidia.com/mig.config.state"] == "success"
        assert node_obj.metadata.labels["nvidia.com/gpu.count"] == "14"
        assert node_obj.metadata.labels["nvidia.com/cuda.driver-version.full"] == "580.95.05"
        assert node_obj.status.allocatable["nvidia.com/gpu"] == "14"
        assert node_obj.status.node_info.kubelet_version == "v1.36.0"
        assert [(t.key, t.effect) for t in node_obj.spec.taints] == [
            ("nvidia.com/gpu", "NoSchedule")
        ]
        assert node.phase == "READY" and len(node.gpu_uuids) == 2
    # the pool's machine template was created by NVKE, the in-memory backend's
    md = apis.get(
        "machinedeployments",
        machines[str(nodes[0].id)]["metadata"]["labels"]["cluster.x-k8s.io/deployment-name"],
    )
    ref = md["spec"]["template"]["spec"]["infrastructureRef"]
    template = apis.get(
        "devmachinetemplates", ref["name"], ("infrastructure.cluster.x-k8s.io", "v1beta2")
    )
    assert (
        template["spec"]["template"]["spec"]["backend"]["inMemory"]["vm"]["provisioning"][
            "startupDuration"
        ]
        == "2s"
    )
    assert (
        LedgerEntry.objects.filter(node__nodepool_id=pool_id, period__upper_inf=True).count() == 4
    )

    # scale up to 3: one more Machine, bound to the new node
    response = owner.post(
        f"/api/v1/clusters/{cluster.id}/nodepools/{pool_id}/set-size",
        {"node_count": 3},
        format="json",
    )
    assert response.status_code == 202, response.content
    drive.now()
    wait_for(
        "3 nodes",
        lambda: phase_of(NodePool, pool_id) == "RUNNING" and len(live_nodes(pool_id)) == 3,
        lambda: drive(cluster.id, pool_id),
    )
    after = bound(apis.machines(name, pool=pool_id))
    assert sorted(after) == sorted(str(n.id) for n in live_nodes(pool_id))
    assert (
        md["spec"]["replicas"] == 2
        and apis.get("machinedeployments", md["metadata"]["name"])["spec"]["replicas"] == 3
    )

    # scale down to 1: the two newest nodes go, and exactly their Machines
    newest = [str(n.id) for n in live_nodes(pool_id)[1:]]
    keep = str(live_nodes(pool_id)[0].id)
    owner.post(
        f"/api/v1/clusters/{cluster.id}/nodepools/{pool_id}/set-size",
        {"node_count": 1},
        format="json",
    )
    drive.now()
    wait_for(
        "1 Machine left",
        lambda: len(apis.machines(name, pool=pool_id)) == 1,
        lambda: drive(cluster.id, pool_id),
    )
    assert list(bound(apis.machines(name, pool=pool_id))) == [keep]
    assert set(Node.objects.filter(id__in=newest).values_list("phase", flat=True)) == {"DELETED"}
    assert LedgerEntry.objects.filter(node_id__in=newest, period__upper_inf=True).count() == 0

    # a LoadBalancer Service in the workload cluster is deleted before the Cluster
    apis.core.create_namespaced_service(
        "default",
        {
            "metadata": {"name": "web"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}], "selector": {"a": "b"}},
        },
    )
    assert owner.delete(f"/api/v1/clusters/{cluster.id}").status_code == 202
    drive.now()
    wait_for(
        "cluster DELETED",
        lambda: phase_of(Cluster, cluster.id) == "DELETED",
        lambda: drive(cluster.id, pool_id),
    )
    assert [s.metadata.name for s in apis.core.list_namespaced_service("default").items] == [
        "kubernetes"
    ]
    assert apis.get("clusters", name) is None
    assert apis.machines(name) == []
    assert (
        LedgerEntry.objects.filter(node__nodepool_id=pool_id, period__upper_inf=True).count() == 0
    )


def test_a_deletion_a_load_balancer_blocks_ends_delete_failed_naming_it(
    owner, capi_settings, hosts, apis, drive
):
    from clusters.models import Cluster

    capi_settings.NVKE_MAX_DELETE_ATTEMPTS = 4
    cluster = running_cluster(owner, drive, "stuck")
    # a cloud controller's finalizer that never goes: the load balancer cannot be removed
    apis.core.create_namespaced_service(
        "default",
        {
            "metadata": {
                "name": "stuck-lb",
                "finalizers": ["service.kubernetes.io/load-balancer-cleanup"],
            },
            "spec": {"type": "LoadBalancer", "ports": [{"port": 443}], "selector": {"a": "b"}},
        },
    )
    apis.core.create_namespaced_persistent_volume_claim(
        "default",
        {
            "metadata": {"name": "data", "finalizers": ["kubernetes.io/pvc-protection"]},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    try:
        owner.delete(f"/api/v1/clusters/{cluster.id}")
        drive.now()
        wait_for(
            "DELETE_FAILED",
            lambda: phase_of(Cluster, cluster.id) == "DELETE_FAILED",
            lambda: drive(cluster.id),
            timeout=120,
        )
        cluster.refresh_from_db()
        assert cluster.delete_attempts == 4
        ready = next(c for c in cluster.conditions if c["type"] == "Ready")
        assert ready["reason"] == "DeleteFailed"
        assert (
            "left: Service default/stuck-lb (LoadBalancer), PersistentVolumeClaim default/data"
            in ready["message"]
        )
        # the Cluster itself is not even asked to go (no deletionTimestamp: Cluster API would
        # tear the workload cluster down under the load balancer) until the leftovers are gone
        kept = apis.get("clusters", capi_name(cluster))
        assert kept["metadata"]["name"] == capi_name(cluster)
        assert "deletionTimestamp" not in kept["metadata"]
    finally:
        for read, patch in (
            ("stuck-lb", apis.core.patch_namespaced_service),
            ("data", apis.core.patch_namespaced_persistent_volume_claim),
        ):
            patch(read, "default", {"metadata": {"finalizers": None}})
        apis.custom.delete_namespaced_custom_object(*CAPI, NS, "clusters", capi_name(cluster))


def test_while_cluster_api_provisions_the_tenant_sees_why(owner, capi_settings, hosts):
    from clusters.reconcile import reconcile_cluster
    from tests.clusterapi.real import make_cluster

    cluster = make_cluster(owner, "slow")
    assert reconcile_cluster(cluster.id) == 5.0
    cluster.refresh_from_db()
    assert cluster.phase == "PROVISIONING"
    ready = next(c for c in cluster.conditions if c["type"] == "ControlPlaneReady")
    # the Cluster was created a moment ago: the real core controller has not reported yet
    assert ready["status"] == "False"
    assert ready["message"].startswith("waiting for the infrastructure: InfrastructureReady")


def test_a_rolled_back_step_leaves_nothing_on_the_management_cluster(
    owner, capi_settings, hosts, apis, django_capture_on_commit_callbacks
):
    from django.db import transaction

    from clusters.providers import get_provider
    from clusters.specs import cluster_spec
    from tests.clusterapi.real import make_cluster
    from tests.clusterapi.specs import node_spec, pool_spec

    cluster = make_cluster(owner, "rollback")
    pool = pool_spec(cluster=cluster_spec(cluster))
    with (
        django_capture_on_commit_callbacks(execute=True),
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        placed = get_provider("clusterapi").ensure_machines(pool, [node_spec(0)])
        assert len(placed[0].gpu_uuids) == 2
        raise RuntimeError("the step fails after placing")
    deployments = apis.custom.list_namespaced_custom_object(
        *CAPI, NS, "machinedeployments", label_selector=f"nvke.io/nodepool-id={pool.id}"
    )["items"]
    assert deployments == []


def test_without_a_management_cluster_the_cluster_fails_saying_so(owner, settings, hosts):
    from clusters.models import Cluster, Operation
    from clusters.reconcile import reconcile_cluster

    settings.NVKE_DEFAULT_PROVIDER = "clusterapi"
    settings.NVKE_CLUSTERAPI_KUBECONFIG = ""
    op = owner.post(
        "/api/v1/clusters",
        {"name": "nowhere", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    ).json()
    assert reconcile_cluster(op["target_id"]) is None
    assert Cluster.objects.get(pk=op["target_id"]).phase == "ERROR"
    error = Operation.objects.get(pk=op["id"]).error
    assert (error["code"], error["retryable"]) == ("clusterapi_not_configured", False)
    assert "NVKE_CLUSTERAPI_KUBECONFIG is empty" in error["message"]
