"""Every disruption through the tenant cluster's real API (issue 31): the one disruption path
(:mod:`nodepools.disruption`) cordons with the Node's ``spec.unschedulable``, evicts pods with
the Eviction API so PodDisruptionBudgets hold, names the budget and the pod of a blocked drain,
deletes pods only when forced (and records it), and deletes a removed node's Node after its
pods left.

One hosted control plane (real kube-apiserver, controller-manager, scheduler and KWOK); pods
are Deployments' pods bound by the cluster's own scheduler to KWOK's nodes, which run them.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.e2e.conftest import wait_for
from tests.hosted.conftest import api_client, create_cluster, kubeconfig_of
from tests.hosted.test_gpu_nodes import TOLERATION, create_pool, drive, node_names

pytestmark = [pytest.mark.timeout(420), pytest.mark.usefixtures("hosted")]

DRIVER = "580.95.05"


def deployment(name: str, node: str) -> dict:
    """One replica asking for one GPU, pinned to ``node`` (so its replacement waits there)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [TOLERATION],
                    "containers": [
                        {
                            "name": "cuda",
                            "image": "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def running_pod(core, app: str, node: str, other_than: str = ""):
    """Wait for the pod of Deployment ``app`` Running on ``node``; returns its name."""

    def running():
        pods = core.list_namespaced_pod("default", label_selector=f"app={app}").items
        for p in pods:
            if (
                p.metadata.name != other_than
                and p.metadata.deletion_timestamp is None
                and p.spec.node_name == node
                and p.status.phase == "Running"
            ):
                return p.metadata.name
        return None

    return wait_for(running, timeout=60, what=f"a {app} pod Running on {node}")


def gone(core, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, "default")
    except ApiException as exc:
        return exc.status == 404
    return False


def node_gone(core, name: str) -> bool:
    try:
        core.read_node(name)
    except ApiException as exc:
        return exc.status == 404
    return False


def test_drains_evict_through_the_api_honour_budgets_name_the_blocker_and_force_deletes(
    owner, make_host
):
    from clusters.providers import get_provider
    from nodepools import disruption
    from nodepools.models import Node
    from nodepools.specs import node_spec, nodepool_spec
    from nodepools.tenant_nodes import sync_cluster_nodes
    from tenants.models import AuditEvent

    for _ in range(3):
        make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    cluster = create_cluster(owner, "evict")
    api = api_client(kubeconfig_of(owner, cluster))
    core, apps, policy = k8s.CoreV1Api(api), k8s.AppsV1Api(api), k8s.PolicyV1Api(api)
    pool_id = create_pool(owner, cluster, "web", {"mode": "exclusive"}, nodes=2)
    rows = list(Node.objects.filter(nodepool_id=pool_id, phase="READY"))
    leaving = disruption.removal_order(rows)[0]  # the node a scale 2 -> 1 takes away
    staying = next(n for n in rows if n.pk != leaving.pk)
    assert sorted([leaving.name, staying.name]) == node_names(pool_id)

    # --- cordon: the one path's backend sets spec.unschedulable in the API; sync clears it --
    backend = disruption.backend_for(
        get_provider(cluster.provider), nodepool_spec(staying.nodepool)
    )
    assert not core.read_node(staying.name).spec.unschedulable
    backend.cordon(staying)
    assert core.read_node(staying.name).spec.unschedulable is True
    sync_cluster_nodes(cluster.id)  # the node is READY: uncordoned
    assert not core.read_node(staying.name).spec.unschedulable

    # a DaemonSet's pod on every node: drains leave it, as kubectl drain does
    apps.create_namespaced_daemon_set(
        "default",
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "exporter"},
            "spec": {
                "selector": {"matchLabels": {"app": "exporter"}},
                "template": {
                    "metadata": {"labels": {"app": "exporter"}},
                    "spec": {
                        "tolerations": [TOLERATION],
                        "containers": [{"name": "dcgm", "image": "nvcr.io/nvidia/dcgm-exporter"}],
                    },
                },
            },
        },
    )
    exporter = running_pod(core, "exporter", staying.name)

    # --- a budget allowing no disruption blocks the upgrade's drain, naming budget and pod ---
    apps.create_namespaced_deployment("default", deployment("web", staying.name))
    web = running_pod(core, "web", staying.name)
    policy.create_namespaced_pod_disruption_budget(
        "default",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "web-pdb"},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "web"}}},
        },
    )
    url = f"/api/v1/clusters/{cluster.id}/nodepools/{pool_id}"
    resp = owner.post(f"{url}/upgrade", {"driver_version": DRIVER, "drain_timeout_s": 1})
    assert resp.status_code == 202, resp.content
    op_id = resp.json()["id"]
    pool = drive(pool_id, lambda p: p.upgrade.get("state") == "paused", what="upgrade paused")
    expected = (
        f"default/{web} (blocked by PodDisruptionBudget default/web-pdb: "
        "The disruption budget web-pdb needs 1 healthy pods and has 1 currently)"
    )
    assert pool.upgrade["blocked"] == {
        "node": staying.name,
        "pods": [expected],
        "reason": "drain blocked",
    }
    blocked = next(c for c in pool.conditions if c["type"] == "UpgradeBlocked")
    assert blocked["status"] == "True" and blocked["reason"] == "DrainBlocked"
    assert blocked["message"] == (
        f"node {staying.name}: drain blocked: {expected}; resume with force or after fixing it"
    )
    op = owner.get(f"/api/v1/operations/{op_id}").json()
    assert op["status"] == "RUNNING"
    assert op["progress"]["stage"] == f"paused: {blocked['message']}"
    held = core.read_namespaced_pod(web, "default")
    assert held.status.phase == "Running" and held.metadata.deletion_timestamp is None
    assert core.read_node(staying.name).spec.unschedulable is True  # cordoned meanwhile
    assert not AuditEvent.objects.filter(action="node.pods_deleted").exists()
    # the blockers of a node already blocked: a dry-run eviction asks and changes nothing
    provider = get_provider(cluster.provider)
    assert provider.drain_blockers(nodepool_spec(pool), node_spec(staying)) == [expected]
    assert core.read_namespaced_pod(web, "default").metadata.deletion_timestamp is None

    # --- force: the pod is deleted (not evicted), recorded, and the upgrade completes --------
    resp = owner.post(f"{url}/resume-upgrade", {"force": True}, format="json")
    assert resp.status_code == 200, resp.content
    drive(pool_id, lambda p: not p.upgrade, what="upgrade done")
    assert owner.get(f"/api/v1/operations/{op_id}").json()["status"] == "DONE"
    assert gone(core, web)
    [event] = AuditEvent.objects.filter(action="node.pods_deleted")
    assert (event.target_id, event.tenant_id, event.after) == (
        str(staying.pk),
        staying.tenant_id,
        {"node": staying.name, "pods": [f"default/{web}"], "eviction_api": False},
    )
    assert not core.read_node(staying.name).spec.unschedulable  # upgraded: uncordoned
    assert core.read_namespaced_pod(exporter, "default").metadata.deletion_timestamp is None
    running_pod(core, "web", staying.name, other_than=web)  # the replacement runs there again
    assert set(
        Node.objects.filter(nodepool_id=pool_id).values_list("driver_version", flat=True)
    ) == {DRIVER}

    # --- scale 2 -> 1: the removed node's pod is evicted, then its Node deleted --------------
    apps.create_namespaced_deployment("default", deployment("batch", leaving.name))
    batch = running_pod(core, "batch", leaving.name)
    seen: list[tuple[bool, bool]] = []  # (pod gone, Node gone) after each reconcile step

    def one_node(p) -> bool:
        seen.append((gone(core, batch), node_gone(core, leaving.name)))
        released = Node.objects.filter(pk=leaving.pk, phase="DELETED").exists()
        return p.phase == "RUNNING" and released

    resp = owner.post(f"{url}/set-size", {"node_count": 1}, format="json")
    assert resp.status_code == 202, resp.content
    drive(pool_id, one_node, what="1 node")
    assert node_names(pool_id) == [staying.name]
    assert seen[-1] == (True, True)
    assert (False, True) not in seen  # never a Node deleted under a pod still there
    assert not AuditEvent.objects.filter(  # evicted through the API, not deleted
        action="node.pods_deleted", target_id=str(leaving.pk)
    ).exists()
    # the budgeted pod on the staying node was never touched by the scale-down
    running_pod(core, "web", staying.name, other_than=web)


def test_a_host_maintenance_drain_is_blocked_by_a_budget_by_name_and_force_moves_the_pod(
    owner, operator, make_host, settings
):
    from fleet.models import Host
    from nodepools.models import Node
    from tenants.models import AuditEvent

    settings.NVKE_HOST_DRAIN_TIMEOUT_S = 1
    for _ in range(2):
        make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    cluster = create_cluster(owner, "maint")
    api = api_client(kubeconfig_of(owner, cluster))
    core, apps, policy = k8s.CoreV1Api(api), k8s.AppsV1Api(api), k8s.PolicyV1Api(api)
    pool_id = create_pool(owner, cluster, "web", {"mode": "exclusive"})
    [old] = Node.objects.filter(nodepool_id=pool_id, phase="READY")
    web_app = deployment("web", old.name)
    del web_app["spec"]["template"]["spec"]["nodeSelector"]  # free to run on the replacement
    apps.create_namespaced_deployment("default", web_app)
    web = running_pod(core, "web", old.name)
    policy.create_namespaced_pod_disruption_budget(
        "default",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "web-pdb"},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "web"}}},
        },
    )

    # --- the operator drains the node's host: its replacement comes up, the budget holds ----
    resp = operator.post(
        f"/api/v1/fleet/hosts/{old.host_id}/drain", {"target": "MAINTENANCE"}, format="json"
    )
    assert resp.status_code == 200, resp.content

    def blocked(p) -> bool:
        return any(c["type"] == "HostDrainBlocked" and c["status"] == "True" for c in p.conditions)

    pool = drive(pool_id, blocked, what="HostDrainBlocked")
    message = next(c for c in pool.conditions if c["type"] == "HostDrainBlocked")["message"]
    assert message == (
        f"{old.name}: default/{web} (blocked by PodDisruptionBudget default/web-pdb: "
        "The disruption budget web-pdb needs 1 healthy pods and has 1 currently); "
        "the operator drains the host again with force to evict them"
    )
    assert core.read_node(old.name).spec.unschedulable is True
    assert core.read_namespaced_pod(web, "default").status.phase == "Running"
    [new] = Node.objects.filter(nodepool_id=pool_id, phase="READY")
    assert new.host_id != old.host_id

    # --- drained again with force: the pod is deleted, runs on the replacement, Node gone ---
    resp = operator.post(
        f"/api/v1/fleet/hosts/{old.host_id}/drain",
        {"target": "MAINTENANCE", "force": True},
        format="json",
    )
    assert resp.status_code == 200, resp.content
    drive(
        pool_id,
        lambda p: Node.objects.filter(pk=old.pk, phase="DELETED").exists(),
        what="the old node released",
    )
    assert gone(core, web)
    assert node_gone(core, old.name)
    running_pod(core, "web", new.name)
    [event] = AuditEvent.objects.filter(action="node.pods_deleted", target_id=str(old.pk))
    assert event.after == {"node": old.name, "pods": [f"default/{web}"], "eviction_api": False}
    drained = Host.objects.get(pk=old.host_id)
    assert (drained.state, drained.drain_target) == ("MAINTENANCE", "")
