"""A real NVKE cluster and node pool driven through the real reconcilers with
``provider="clusterapi"``, against the SIMULATED management cluster of fake_apiserver.py (a
local HTTP server that plays the Cluster API / GPU Operator calls used and flips conditions
to ready one reconcile after the first apply; no Kubernetes runs here).

Checked: the objects the "management cluster" received (Cluster, KubeadmControlPlane,
MachineDeployment with the pool's GPU labels and taints, MachineHealthCheck), the GPU
Operator objects the workload cluster received, the phases NVKE reaches, the nodes' GPUs
and layouts, scale-down by the delete-machine annotation, an in-place MIG change with a
drain that evicts only GPU pods (and waits on a disruption budget), and deletion.
Every object the simulation stores is validated against the CRDs too, so the simulation
cannot drift from the real schemas unnoticed.
"""

from __future__ import annotations

import base64
import json

import kubernetes_validate
import pytest

from tests.clusterapi import crd_schema
from tests.clusterapi.conftest import hosts_follow_their_gpu_operator
from tests.helpers import drive_cluster

pytestmark = pytest.mark.django_db

NS = "nvke-test"
SINGLE = {"mode": "mig", "mig_profile": "1g.10gb"}
BALANCED = {"mode": "mig", "mig_layout": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}


def drive_pool_committing(django_capture_on_commit_callbacks, pool_id, max_steps=20):
    """Reconcile the pool step by step, running each step's on-commit callbacks as a real
    commit would (the test's transaction never commits)."""
    from nodepools.reconcile import reconcile_nodepool

    for step in range(1, max_steps + 1):
        hosts_follow_their_gpu_operator(pool_id)
        with django_capture_on_commit_callbacks(execute=True):
            delay = reconcile_nodepool(pool_id)
        if delay is None:
            return step
    raise AssertionError(f"pool {pool_id} did not converge in {max_steps} steps")


@pytest.fixture
def capi_cluster(owner, capi_settings, fake_api, make_host):
    """Tenant A's cluster on the clusterapi provider, RUNNING; two 2-GPU H100 hosts (SIMULATED
    INFRASTRUCTURE rows, ``make_host``) in its region."""
    from clusters.models import Cluster

    make_host("h100-sxm5-80gb", gpus=2, hostname="gpu-h100-a")
    make_host("h100-sxm5-80gb", gpus=2, hostname="gpu-h100-b")

    cluster_id = owner.post(
        "/api/v1/clusters",
        {"name": "llm", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    ).json()["target_id"]
    Cluster.objects.filter(pk=cluster_id).update(provider="clusterapi")
    assert drive_cluster(cluster_id) == 2  # created, then ready one reconcile later
    return Cluster.objects.get(pk=cluster_id)


@pytest.fixture
def capi_pool(owner, capi_cluster, django_capture_on_commit_callbacks):
    """A RUNNING pool of 2 nodes x 2 H100 GPUs, MIG 1g.10gb on every GPU."""
    pool_id = owner.post(
        f"/api/v1/clusters/{capi_cluster.id}/nodepools",
        {
            "name": "mig",
            "gpu_model": "h100-sxm5-80gb",
            "gpus_per_node": 2,
            "node_count": 2,
            "isolation": SINGLE,
        },
        format="json",
    ).json()["target_id"]
    drive_pool_committing(django_capture_on_commit_callbacks, pool_id)
    return pool_id


def capi_name(cluster) -> str:
    return f"llm-{cluster.id.hex[:8]}"


def nodes(pool_id):
    from nodepools.models import Node

    return list(Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name"))


def test_the_cluster_runs_once_cluster_api_reports_it_ready(capi_cluster, fake_api):
    from nvke import crypto

    name = capi_name(capi_cluster)
    assert capi_cluster.phase == "RUNNING"
    assert capi_cluster.endpoint == f"https://{name}.cp.capi.test:6443"
    capi = fake_api.one("clusters", name)
    assert capi["metadata"]["namespace"] == NS
    assert capi["metadata"]["labels"]["nvke.io/cluster-id"] == str(capi_cluster.id)
    assert capi["spec"]["infrastructureRef"]["kind"] == "Metal3Cluster"
    kcp = fake_api.one("kubeadmcontrolplanes", f"{name}-control-plane")
    assert (kcp["spec"]["version"], kcp["spec"]["replicas"]) == ("v1.36.0", 3)
    # the admin kubeconfig NVKE stores (encrypted) is the one Cluster API wrote
    secret = fake_api.one("secrets", f"{name}-kubeconfig")
    assert (
        crypto.decrypt(capi_cluster.kubeconfig_encrypted)
        == base64.b64decode(secret["data"]["value"]).decode()
    )
    # every write to the management cluster was a server-side apply by "nvke", forced
    patches = fake_api.calls("PATCH")
    assert patches and all(
        (p.content_type, p.query.get("fieldManager"), p.query.get("force"))
        == ("application/apply-patch+yaml", ["nvke"], ["true"])
        for p in patches
    )
    conditions = {c["type"]: c["status"] for c in capi_cluster.conditions}
    assert (conditions["ControlPlaneReady"], conditions["Ready"]) == ("True", "True")


def test_while_cluster_api_provisions_the_tenant_sees_why(owner, capi_settings, make_host):
    from clusters.models import Cluster
    from clusters.reconcile import reconcile_cluster

    make_host("h100-sxm5-80gb", gpus=2)
    cluster_id = owner.post(
        "/api/v1/clusters",
        {"name": "slow", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    ).json()["target_id"]
    Cluster.objects.filter(pk=cluster_id).update(provider="clusterapi")
    assert reconcile_cluster(cluster_id) == 5.0
    cluster = Cluster.objects.get(pk=cluster_id)
    assert cluster.phase == "PROVISIONING"
    ready = next(c for c in cluster.conditions if c["type"] == "ControlPlaneReady")
    assert (ready["status"], ready["message"]) == (
        "False",
        "waiting for the infrastructure: InfrastructureReady is False (NotReady): provisioning",
    )


def test_a_pool_becomes_a_machine_deployment_and_its_nodes_run_on_machines(
    capi_cluster, capi_pool, fake_api
):
    from fleet.models import Gpu
    from nodepools.models import NodePool

    pool = NodePool.objects.get(pk=capi_pool)
    assert pool.phase == "RUNNING"
    name = capi_name(capi_cluster)
    md_name = f"{name}-mig-{pool.id.hex[:6]}"
    deployment = fake_api.one("machinedeployments", md_name)
    live = nodes(capi_pool)
    assert [n.phase for n in live] == ["READY", "READY"]
    hostnames = {str(n.id): Gpu.objects.filter(holder_id=n.id).first().host.hostname for n in live}
    assert sorted(hostnames.values()) == ["gpu-h100-a", "gpu-h100-b"]
    assert deployment["spec"]["replicas"] == 2
    assert json.loads(deployment["metadata"]["annotations"]["nvke.io/nodes"]) == hostnames
    template = fake_api.one(
        "kubeadmconfigtemplates",
        deployment["spec"]["template"]["spec"]["bootstrap"]["configRef"]["name"],
    )
    registration = template["spec"]["template"]["spec"]["joinConfiguration"]["nodeRegistration"]
    node_labels = dict(
        pair.split("=", 1) for pair in registration["kubeletExtraArgs"][0]["value"].split(",")
    )
    assert node_labels["nvidia.com/mig.config"] == "all-1g.10gb"
    assert node_labels["nvke.io/nodepool-id"] == str(pool.id)
    assert registration["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
    health = fake_api.one("machinehealthchecks", md_name)
    assert health["spec"]["remediation"]["triggerIf"]["unhealthyLessThanOrEqualTo"] == "40%"
    # each NVKE node is bound to one Machine, whose Node runs the pool's MIG config
    machines = fake_api.find("machines")
    assert sorted(m["metadata"]["annotations"]["nvke.io/node-id"] for m in machines) == sorted(
        hostnames
    )
    for node in live:
        assert len(node.gpu_uuids) == 2
        assert [sorted(d["profile"] for d in g["mig_devices"]) for g in node.gpu_layout] == [
            ["1g.10gb"] * 7,
            ["1g.10gb"] * 7,
        ]
    # the workload cluster got the GPU Operator objects, ConfigMaps first
    workload_patches = [p.path.rsplit("/", 2)[-2:] for p in fake_api.calls("PATCH", "^/workload/")]
    assert workload_patches[:4] == [
        ["configmaps", "nvke-device-plugin-config"],
        ["configmaps", "nvke-mig-parted-config"],
        ["nvidiadrivers", "nvke-default"],
        ["clusterpolicies", "cluster-policy"],
    ]
    policy = fake_api.one("clusterpolicies", "cluster-policy", cluster=name)
    assert policy["spec"]["migManager"]["config"]["name"] == "nvke-mig-parted-config"
    workload_nodes = fake_api.find("nodes", cluster=name)
    assert {n["metadata"]["labels"]["nvidia.com/mig.config.state"] for n in workload_nodes} == {
        "success"
    }
    assert {n["metadata"]["labels"]["nvidia.com/gpu.count"] for n in workload_nodes} == {"14"}


def test_what_the_simulation_stores_is_valid_against_the_real_schemas(
    capi_cluster, capi_pool, fake_api
):
    checked = 0
    for (_cluster, _group, plural, _ns, _name), obj in fake_api.objects.items():
        if crd_schema.has_crd(obj):
            assert crd_schema.errors(obj) == [], (plural, obj["metadata"]["name"])
            checked += 1
        elif plural == "configmaps":
            meta = {k: obj["metadata"][k] for k in ("name", "namespace", "labels")}
            kubernetes_validate.validate({**obj, "metadata": meta}, "1.36.0", strict=True)
            checked += 1
    # Cluster, KubeadmControlPlane, template, MachineDeployment, MachineHealthCheck,
    # 2 Machines (management); 2 ConfigMaps, NVIDIADriver, ClusterPolicy (workload)
    assert checked == 11


def test_scaling_down_deletes_the_newest_nodes_machine_and_frees_its_gpus(
    owner, capi_cluster, capi_pool, fake_api, django_capture_on_commit_callbacks
):
    from fleet.models import Gpu

    live = nodes(capi_pool)
    newest = live[-1]
    machine_of = {
        m["metadata"]["annotations"]["nvke.io/node-id"]: m for m in fake_api.find("machines")
    }
    doomed = machine_of[str(newest.id)]["metadata"]["name"]
    resp = owner.post(
        f"/api/v1/clusters/{capi_cluster.id}/nodepools/{capi_pool}/set-size",
        {"node_count": 1},
        format="json",
    )
    assert resp.status_code == 202, resp.content
    drive_pool_committing(django_capture_on_commit_callbacks, capi_pool)
    assert [n.phase for n in nodes(capi_pool)] == ["READY", "DELETED"]
    # the machine was marked for deletion before the MachineDeployment shrank
    marks = [
        p
        for p in fake_api.calls("PATCH", f"/machines/{doomed}$")
        if (p.body.get("metadata") or {})
        .get("annotations", {})
        .get("cluster.x-k8s.io/delete-machine")
    ]
    assert len(marks) == 1 and marks[0].content_type == "application/merge-patch+json"
    md = fake_api.find("machinedeployments")[0]
    assert md["spec"]["replicas"] == 1
    assert list(json.loads(md["metadata"]["annotations"]["nvke.io/nodes"])) == [str(live[0].id)]
    assert [m["metadata"]["name"] for m in fake_api.find("machines")] == [
        machine_of[str(live[0].id)]["metadata"]["name"]
    ]
    assert not Gpu.objects.filter(holder_id=newest.id).exists()


def _pod(name, node, *, gpu, blocked=False, daemonset=False):
    resources = {"limits": {"nvidia.com/gpu": 1}} if gpu else {"requests": {"cpu": "1"}}
    meta = {"name": name, "namespace": "team", "labels": {}}
    if blocked:
        meta["labels"]["nvke-test/pdb-blocked"] = "true"
    if daemonset:
        meta["ownerReferences"] = [{"kind": "DaemonSet", "name": "ds", "apiVersion": "apps/v1"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": resources}]},
        "status": {"phase": "Running"},
    }


def test_changing_the_mig_layout_drains_gpu_pods_relabels_and_validates_each_node(
    owner, capi_cluster, capi_pool, fake_api, django_capture_on_commit_callbacks
):
    name = capi_name(capi_cluster)
    machines = {
        m["metadata"]["annotations"]["nvke.io/node-id"]: m for m in fake_api.find("machines")
    }
    first = nodes(capi_pool)[0]
    node_name = machines[str(first.id)]["status"]["nodeRef"]["name"]
    for pod in (
        _pod("trainer", node_name, gpu=True),
        _pod("web", node_name, gpu=False),
        _pod("dcgm", node_name, gpu=True, daemonset=True),
    ):
        fake_api.put(name, pod)
    resp = owner.patch(
        f"/api/v1/clusters/{capi_cluster.id}/nodepools/{capi_pool}",
        {"isolation": BALANCED},
        format="json",
    )
    assert resp.status_code == 202, resp.content
    drive_pool_committing(django_capture_on_commit_callbacks, capi_pool, max_steps=40)
    evicted = [p.path.rsplit("/", 2)[-2] for p in fake_api.calls("POST", "/eviction$")]
    assert evicted == ["trainer"]  # only the pod holding a GPU; never the DaemonSet's
    pods = {p["metadata"]["name"] for p in fake_api.find("pods", cluster=name)}
    assert pods == {"web", "dcgm"}
    for node in fake_api.find("nodes", cluster=name):
        labels = node["metadata"]["labels"]
        assert labels["nvidia.com/mig.config"] == "nvke-mig"
        assert labels["nvidia.com/mig.config.state"] == "success"
        assert labels["nvidia.com/mig-3g.40gb.count"] == "2"
        assert labels["nvidia.com/mig-1g.10gb.count"] == "4"
        assert not node["spec"].get("unschedulable")  # uncordoned once validated
        assert "nvke.io/cordoned" not in node["metadata"]["annotations"]
    for node in nodes(capi_pool):
        assert node.phase == "READY"
        for gpu in node.gpu_layout:
            assert sorted((d["profile"], d["start"]) for d in gpu["mig_devices"]) == [
                ("1g.10gb", 2),
                ("1g.10gb", 3),
                ("2g.20gb", 0),
                ("3g.40gb", 4),
            ]
    # machines created from now on boot with the new config: a new template, no rollout
    md = fake_api.find("machinedeployments")[0]
    template = fake_api.one(
        "kubeadmconfigtemplates", md["spec"]["template"]["spec"]["bootstrap"]["configRef"]["name"]
    )
    value = template["spec"]["template"]["spec"]["joinConfiguration"]["nodeRegistration"][
        "kubeletExtraArgs"
    ][0]["value"]
    assert "nvidia.com/mig.config=nvke-mig" in value.split(",")
    assert md["spec"]["rollout"]["strategy"]["type"] == "OnDelete"
    assert len(fake_api.find("machines")) == 2


def test_a_drain_waits_while_a_disruption_budget_blocks_a_gpu_pod(
    capi_cluster, capi_pool, fake_api
):
    from clusters.providers import get_provider
    from nodepools.models import NodePool
    from nodepools.specs import node_spec, nodepool_spec

    name = capi_name(capi_cluster)
    pool = NodePool.objects.get(pk=capi_pool)
    node = nodes(capi_pool)[0]
    machine = next(
        m
        for m in fake_api.find("machines")
        if m["metadata"]["annotations"]["nvke.io/node-id"] == str(node.id)
    )
    node_name = machine["status"]["nodeRef"]["name"]
    fake_api.put(name, _pod("guarded", node_name, gpu=True, blocked=True))
    provider = get_provider("clusterapi")
    assert provider.drain_node(nodepool_spec(pool), node_spec(node)) is False
    assert provider.drain_node(nodepool_spec(pool), node_spec(node)) is False
    assert provider.last_drain_blockers == ["team/guarded"]
    workload_node = fake_api.one("nodes", node_name, cluster=name)
    assert workload_node["spec"]["unschedulable"] is True
    assert workload_node["metadata"]["annotations"]["nvke.io/cordoned"] == "true"
    # the budget allows it now: evicted, gone at the next look, drained
    pod = fake_api.objects[(name, "", "pods", "team", "guarded")]
    pod["metadata"]["labels"].clear()
    assert provider.drain_node(nodepool_spec(pool), node_spec(node)) is False  # evicted now
    assert provider.drain_node(nodepool_spec(pool), node_spec(node)) is True  # and gone
    assert provider.last_drain_blockers == []


def test_deleting_the_cluster_removes_every_cluster_api_object(
    owner, capi_cluster, capi_pool, fake_api, django_capture_on_commit_callbacks
):
    from clusters.models import Cluster
    from fleet.models import Gpu

    held = [n.id for n in nodes(capi_pool)]
    assert owner.delete(f"/api/v1/clusters/{capi_cluster.id}").status_code == 202
    drive_pool_committing(django_capture_on_commit_callbacks, capi_pool)
    drive_cluster(capi_cluster.id)
    assert Cluster.objects.get(pk=capi_cluster.id).phase == "DELETED"
    assert [n.phase for n in nodes(capi_pool)] == ["DELETED", "DELETED"]
    assert not Gpu.objects.filter(holder_id__in=held).exists()
    assert fake_api.calls("DELETE", "/clusters/llm-")
    left = [key for key in fake_api.objects if key[0] == "management"]
    assert left == []


def test_a_rolled_back_step_leaves_nothing_on_the_management_cluster(
    capi_cluster, make_host, fake_api, django_capture_on_commit_callbacks
):
    from django.db import transaction

    from clusters.providers import get_provider
    from tests.clusterapi.specs import node_spec, pool_spec

    make_host("h100-sxm5-80gb", gpus=2)
    from clusters.specs import cluster_spec

    pool = pool_spec(cluster=cluster_spec(capi_cluster))
    before = len(fake_api.requests)
    with (
        django_capture_on_commit_callbacks(execute=True),
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        placed = get_provider("clusterapi").ensure_machines(pool, [node_spec(0)])
        assert len(placed[0].gpu_uuids) == 2
        raise RuntimeError("the step fails after placing")
    assert len(fake_api.requests) == before
    assert fake_api.find("machinedeployments") == []


def test_a_lost_apply_is_redone_by_the_next_status_check(capi_cluster, fake_api):
    from django.db import transaction
    from django.utils import timezone

    from clusters.providers import get_provider
    from clusters.specs import cluster_spec
    from tests.clusterapi.specs import node_spec, pool_spec

    pool = pool_spec(cluster=cluster_spec(capi_cluster))
    provider = get_provider("clusterapi")
    with transaction.atomic():  # a savepoint: its on-commit apply never runs in this test
        (placed,) = provider.ensure_machines(pool, [node_spec(0)])
    assert placed.hostname in ("gpu-h100-a", "gpu-h100-b")
    assert fake_api.find("machinedeployments") == []
    fake_api.fail("PATCH", "/machinedeployments/", 503)
    found = provider.machine_status(pool, node_spec(0), timezone.now())
    assert (found.ready, found.retry_after_s) == (False, 15.0)
    assert "HTTP 503" in found.message  # the redo failed too: said, and retried later
    assert fake_api.find("machinedeployments") == []
    found = provider.machine_status(pool, node_spec(0), timezone.now())
    assert found.message.startswith("machine requested from MachineDeployment")
    (deployment,) = fake_api.find("machinedeployments")
    assert json.loads(deployment["metadata"]["annotations"]["nvke.io/nodes"]) == {
        str(node_spec(0).id): placed.hostname
    }
    assert deployment["spec"]["replicas"] == 1


def test_a_control_plane_upgrade_is_done_only_once_every_replica_runs_the_new_version(
    owner, capi_cluster, fake_api
):
    from clusters.models import Cluster, Operation
    from clusters.reconcile import reconcile_cluster

    resp = owner.patch(
        f"/api/v1/clusters/{capi_cluster.id}", {"kubernetes_version": "1.37"}, format="json"
    )
    assert resp.status_code == 202, resp.content
    assert resp.json()["type"] == "UPGRADE_CONTROL_PLANE"
    assert reconcile_cluster(capi_cluster.id) == 5.0  # KubeadmControlPlane still rolling
    cluster = Cluster.objects.get(pk=capi_cluster.id)
    assert (cluster.phase, cluster.control_plane_version) == ("RECONCILING", "1.36")
    ready = next(c for c in cluster.conditions if c["type"] == "ControlPlaneReady")
    assert ready["message"] == "rolling the control plane to v1.37.0: 0 of 3 machines up to date"
    kcp = fake_api.one("kubeadmcontrolplanes", f"{capi_name(cluster)}-control-plane")
    assert kcp["spec"]["version"] == "v1.37.0"
    assert reconcile_cluster(capi_cluster.id) is None  # rolled
    cluster = Cluster.objects.get(pk=capi_cluster.id)
    assert (cluster.phase, cluster.control_plane_version) == ("RUNNING", "1.37")
    op = Operation.objects.get(pk=resp.json()["id"])
    assert op.status == "DONE"


def test_without_a_management_cluster_the_cluster_fails_saying_so(owner, settings, make_host):
    from clusters.models import Cluster, Operation
    from clusters.reconcile import reconcile_cluster

    settings.NVKE_CLUSTERAPI_KUBECONFIG = ""
    make_host("h100-sxm5-80gb", gpus=2)
    op = owner.post(
        "/api/v1/clusters",
        {"name": "nowhere", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    ).json()
    Cluster.objects.filter(pk=op["target_id"]).update(provider="clusterapi")
    assert reconcile_cluster(op["target_id"]) is None
    cluster = Cluster.objects.get(pk=op["target_id"])
    assert cluster.phase == "ERROR"
    error = Operation.objects.get(pk=op["id"]).error
    assert (error["code"], error["retryable"]) == ("clusterapi_not_configured", False)
    assert "NVKE_CLUSTERAPI_KUBECONFIG is empty" in error["message"]
