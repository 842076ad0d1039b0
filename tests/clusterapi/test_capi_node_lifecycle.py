"""Upgrades, drains and MachineHealthCheck remediation with the clusterapi provider against
REAL Cluster API controllers on a REAL kube-apiserver (see test_capi_controllers.py for what
is SIMULATED: the machines, the GPU hosts and so the machines' Nodes, kept Ready by KWOK)."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.utils import timezone

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

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(480)]

BALANCED = {"mode": "mig", "mig_layout": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}


def _pod(name: str, node: str, *, gpu: bool, owner: str = "ReplicaSet", labels=None) -> dict:
    resources = {"limits": {"nvidia.com/gpu": "1"}} if gpu else {"requests": {"cpu": "1"}}
    meta: dict = {"name": name, "labels": labels or {"app": name}}
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner, "name": f"{name}-owner", "uid": "0" * 36}
        ]
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [{"name": "c", "image": "busybox", "resources": resources}],
        },
    }


def _node_name(apis, cluster, node) -> str:
    return bound(apis.machines(capi_name(cluster)))[str(node.id)]["status"]["nodeRef"]["name"]


def test_control_plane_then_node_upgrade_replace_machines_under_nvke_drain_rules(
    owner,
    capi_settings,
    hosts,
    apis,
    drive,
):
    from clusters.models import Cluster
    from nodepools.models import Node, NodePool

    cluster = running_cluster(owner, drive, "upg", version="1.35")
    pool_id = running_pool(owner, drive, cluster, 1)
    name = capi_name(cluster)
    (node,) = live_nodes(pool_id)
    old_machine = bound(apis.machines(name, pool=pool_id))[str(node.id)]
    assert old_machine["spec"]["version"] == "v1.35.0"

    # the control plane: KubeadmControlPlane rolls its machine to v1.36.0
    response = owner.patch(f"/api/v1/clusters/{cluster.id}", {"kubernetes_version": "1.36"})
    assert response.status_code == 202, response.content
    drive.now()
    wait_for(
        "control plane 1.36",
        lambda: (
            Cluster.objects.get(pk=cluster.id).control_plane_version == "1.36"
            and phase_of(Cluster, cluster.id) == "RUNNING"
        ),
        lambda: drive(cluster.id),
        timeout=300,
    )
    cp = [
        m
        for m in apis.machines(name)
        if "cluster.x-k8s.io/control-plane" in m["metadata"]["labels"]
        and not m["metadata"].get("deletionTimestamp")
    ]
    assert [m["spec"]["version"] for m in cp] == ["v1.36.0"]

    # a GPU pod with a budget at its minimum keeps the node from draining: the rollout pauses
    node_name = _node_name(apis, cluster, node)
    apis.core.create_namespaced_pod("default", _pod("upg-trainer", node_name, gpu=True))
    apis.policy.create_namespaced_pod_disruption_budget(
        "default",
        {
            "metadata": {"name": "upg-trainer"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "upg-trainer"}}},
        },
    )
    # the Eviction API ignores budgets for a Pending pod (canIgnorePDB in kube-apiserver's
    # eviction handler): until KWOK (the simulated kubelet) has the pod Running, a drain would
    # evict it and the rollout would go through instead of pausing (CI failed so once under load)
    wait_for(
        "the trainer pod Running",
        lambda: apis.core.read_namespaced_pod("upg-trainer", "default").status.phase == "Running",
        lambda: None,
        timeout=120,
    )
    url = f"/api/v1/clusters/{cluster.id}/nodepools/{pool_id}"
    response = owner.post(f"{url}/upgrade", {"kubernetes_version": "1.36", "drain_timeout_s": 0})
    assert response.status_code == 202, response.content
    drive.now()
    wait_for(
        "the rollout paused",
        lambda: NodePool.objects.get(pk=pool_id).upgrade.get("state") == "paused",
        lambda: drive(cluster.id, pool_id),
        timeout=180,
    )
    blocked = NodePool.objects.get(pk=pool_id).upgrade["blocked"]
    assert blocked == {
        "node": node.name,
        "pods": [
            "default/upg-trainer (PodDisruptionBudget default/upg-trainer allows 0 disruptions)"
        ],
        "reason": "drain blocked",
    }
    assert (
        bound(apis.machines(name, pool=pool_id))[str(node.id)]["metadata"]["name"]
        == (old_machine["metadata"]["name"])
    )  # nothing replaced while paused

    # force: NVKE skips the drain, so does Cluster API; the Machine is replaced
    response = owner.post(f"{url}/resume-upgrade", {"force": True}, format="json")
    assert response.status_code in (200, 202), response.content
    drive.now()
    wait_for(
        "node upgraded",
        lambda: (
            Node.objects.get(pk=node.id).kubernetes_version == "1.36"
            and not NodePool.objects.get(pk=pool_id).upgrade
        ),
        lambda: drive(cluster.id, pool_id),
        timeout=300,
    )
    node.refresh_from_db()
    assert (node.phase, node.upgrade_state) == ("READY", "")
    machines = apis.machines(name, pool=pool_id)
    new_machine = bound(machines)[str(node.id)]
    assert new_machine["metadata"]["name"] != old_machine["metadata"]["name"]
    assert new_machine["spec"]["version"] == "v1.36.0"
    assert new_machine["status"]["phase"] == "Running"
    assert old_machine["metadata"]["name"] not in {m["metadata"]["name"] for m in machines}
    new_node = apis.core.read_node(new_machine["status"]["nodeRef"]["name"])
    assert new_node.status.node_info.kubelet_version == "v1.36.0"
    apis.policy.delete_namespaced_pod_disruption_budget("upg-trainer", "default")
    apis.core.delete_namespaced_pod("upg-trainer", "default")


def test_a_machine_health_check_remediation_replaces_the_node_in_nvke(
    owner,
    capi_settings,
    hosts,
    apis,
    drive,
):
    from billing.models import LedgerEntry
    from fleet.models import Gpu
    from nodepools.models import Node, NodePool

    cluster = running_cluster(owner, drive, "mhc")
    pool_id = running_pool(owner, drive, cluster, 3)
    name = capi_name(cluster)
    first, *others = live_nodes(pool_id)
    first_gpus = list(first.gpu_uuids)
    machine = bound(apis.machines(name, pool=pool_id))[str(first.id)]
    # an operator (or a failing node) marks the Machine for the MachineHealthCheck
    remediated_at = timezone.now()
    apis.custom.patch_namespaced_custom_object(
        *CAPI,
        NS,
        "machines",
        machine["metadata"]["name"],
        {"metadata": {"annotations": {"cluster.x-k8s.io/remediate-machine": ""}}},
    )
    drive.now()
    wait_for(
        "the replacement node READY",
        lambda: (
            Node.objects.get(pk=first.id).phase == "DELETED"
            and len(live_nodes(pool_id)) == 3
            and all(n.phase == "READY" for n in live_nodes(pool_id))
        ),
        lambda: drive(cluster.id, pool_id),
        timeout=300,
    )
    first.refresh_from_db()
    successor = next(n for n in live_nodes(pool_id) if n.id not in {o.id for o in others})
    # released after the remediation began, in the step that set MachinesReplaced (the same
    # `now`), before the successor was created to take over the replacement machine
    assert remediated_at < first.released_at <= successor.created_at
    machines = bound(apis.machines(name, pool=pool_id))
    assert sorted(machines) == sorted(str(n.id) for n in live_nodes(pool_id))
    assert machines[str(successor.id)]["metadata"]["name"] != machine["metadata"]["name"]
    assert machine["metadata"]["name"] not in {
        m["metadata"]["name"] for m in apis.machines(name, pool=pool_id)
    }
    # placement and ledger: the old node's GPUs went back, its rows closed when NVKE saw the
    # replacement; the successor holds 2 GPUs (placed afresh) with open rows from its ready_at
    assert not Gpu.objects.filter(holder_id=first.id).exists()
    assert Gpu.objects.filter(holder_id=successor.id).count() == 2
    rows = LedgerEntry.objects.filter(node_id=first.id)
    assert sorted(r.gpu_uuid for r in rows) == sorted(first_gpus)
    assert {r.period.upper for r in rows} == {first.released_at}
    open_rows = LedgerEntry.objects.filter(node_id=successor.id, period__upper_inf=True)
    assert {r.period.lower for r in open_rows} == {successor.ready_at}
    condition = next(
        c for c in NodePool.objects.get(pk=pool_id).conditions if c["type"] == "MachinesReplaced"
    )
    assert condition["message"].startswith(f"{first.name}: MachineHealthCheck remediated Machine")
    assert datetime.fromisoformat(condition["last_transition_time"]) == first.released_at
    md = apis.get(
        "machinedeployments", machine["metadata"]["labels"]["cluster.x-k8s.io/deployment-name"]
    )
    assert md["spec"]["replicas"] == 3
    assert "vacant:" not in md["metadata"]["annotations"]["nvke.io/nodes"]


def test_an_isolation_change_evicts_only_gpu_pods_relabels_and_validates(
    owner,
    capi_settings,
    hosts,
    apis,
    drive,
):
    from nodepools.models import NodePool

    cluster = running_cluster(owner, drive, "iso")
    pool_id = running_pool(owner, drive, cluster, 1)
    (node,) = live_nodes(pool_id)
    node_name = _node_name(apis, cluster, node)
    apis.core.create_namespaced_pod("default", _pod("iso-trainer", node_name, gpu=True))
    apis.core.create_namespaced_pod("default", _pod("iso-web", node_name, gpu=False))
    apis.core.create_namespaced_pod(
        "default", _pod("iso-dcgm", node_name, gpu=True, owner="DaemonSet")
    )
    response = owner.patch(
        f"/api/v1/clusters/{cluster.id}/nodepools/{pool_id}", {"isolation": BALANCED}, format="json"
    )
    assert response.status_code == 202, response.content
    drive.now()
    wait_for(
        "pool RUNNING with the new layout",
        lambda: (
            phase_of(NodePool, pool_id) == "RUNNING"
            and live_nodes(pool_id)[0].gpu_layout
            and len(live_nodes(pool_id)[0].gpu_layout[0]["mig_devices"]) == 4
        ),
        lambda: drive(cluster.id, pool_id),
        timeout=180,
    )
    pods = {p.metadata.name for p in apis.core.list_namespaced_pod("default").items}
    assert {"iso-web", "iso-dcgm"} <= pods and "iso-trainer" not in pods  # only the GPU pod
    labels = apis.core.read_node(node_name).metadata.labels
    assert labels["nvidia.com/mig.config.state"] == "success"
    assert (labels["nvidia.com/mig-3g.40gb.count"], labels["nvidia.com/mig-1g.10gb.count"]) == (
        "2",
        "4",
    )
    assert not apis.core.read_node(node_name).spec.unschedulable  # uncordoned once validated
    for gpu in live_nodes(pool_id)[0].gpu_layout:
        assert sorted((d["profile"], d["start"]) for d in gpu["mig_devices"]) == [
            ("1g.10gb", 2),
            ("1g.10gb", 3),
            ("2g.20gb", 0),
            ("3g.40gb", 4),
        ]
    for pod in ("iso-web", "iso-dcgm"):
        apis.core.delete_namespaced_pod(pod, "default")
