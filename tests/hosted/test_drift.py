"""Drift is seen (issue 31): after a node is READY with a pod running on it, its host reports
MIG on under the exclusive node. The Node in the tenant's real API follows the host
(allocatable, ``mig.config.state``), the pool gets ``NodesDrifted`` naming expected vs
reported, the host gets the operator's warning, and the pod keeps running; all of it clears
once the host agrees again.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from tests.e2e.conftest import wait_for
from tests.hosted.conftest import api_client, create_cluster, kubeconfig_of
from tests.hosted.test_gpu_nodes import create_pool, drive, lease_renewals, node_names, pod

pytestmark = [pytest.mark.timeout(420), pytest.mark.usefixtures("hosted")]

MIG_1G = [{"profile": "1g.10gb", "start": 0, "size": 1}]


def test_a_host_that_stops_matching_its_ready_node_is_named_on_the_pool_and_the_host(
    owner, make_host
):
    from clusters.providers import simhosts
    from fleet.models import Host
    from nodepools.models import Node
    from nodepools.tasks import reconcile_nodepool
    from nvke.queueing import clear_pending, enqueue_once

    host_row = make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    cluster = create_cluster(owner, "drift")
    api = api_client(kubeconfig_of(owner, cluster))
    core, coord = k8s.CoreV1Api(api), k8s.CoordinationV1Api(api)
    pool_id = create_pool(owner, cluster, "train", {"mode": "exclusive"})
    [name] = node_names(pool_id)
    node = Node.objects.get(name=name)
    assert node.host_id == host_row.pk
    core.create_namespaced_pod("default", pod("trainer", 2))
    wait_for(
        lambda: core.read_namespaced_pod("trainer", "default").status.phase == "Running",
        timeout=60,
        what="the pod Running",
    )
    lease_renewals(core, coord, name, 3)  # KWOK's heartbeats do not undo what NVKE wrote
    before = core.read_node(name)
    assert before.status.allocatable["nvidia.com/gpu"] == "8"
    assert before.metadata.labels["nvidia.com/mig.config.state"] == "success"
    pool = owner.get(f"/api/v1/clusters/{cluster.id}/nodepools/{pool_id}").json()
    assert "NodesDrifted" not in {c["type"] for c in pool["conditions"]}

    # --- the host's agent reports MIG on, with one 1g.10gb instance, on the node's GPU 0 -----
    drifted_gpu = node.gpu_uuids[0]
    host = Host.objects.get(pk=node.host_id)
    clear_pending(reconcile_nodepool.name, str(pool_id))
    simhosts.change(host, lambda s: simhosts.apply_mig(s, [drifted_gpu], True, MIG_1G))
    assert simhosts.report_in_process(host)
    # the ingest's gpu_facts_changed woke the pool (a worker would run it now)
    assert not enqueue_once(reconcile_nodepool, str(pool_id))
    drive(
        pool_id,
        lambda p: any(c["type"] == "NodesDrifted" and c["status"] == "True" for c in p.conditions),
        what="NodesDrifted",
    )
    expected = f"node {name}: {drifted_gpu}: MIG mode expected disabled, reported enabled"
    pool = owner.get(f"/api/v1/clusters/{cluster.id}/nodepools/{pool_id}").json()
    drifted = next(c for c in pool["conditions"] if c["type"] == "NodesDrifted")
    assert (drifted["reason"], drifted["message"]) == ("ObservedStateDrift", expected)
    assert pool["phase"] == "RUNNING"  # said, not hidden, and the node keeps serving
    warning = (
        f"observed state: node {name} drifted from its pool: "
        f"{drifted_gpu}: MIG mode expected disabled, reported enabled"
    )
    assert warning in Host.objects.get(pk=host.pk).warnings
    lease_renewals(core, coord, name, 3)
    after = core.read_node(name)
    assert after.metadata.labels["nvidia.com/mig.config.state"] == "pending"
    # strategy "none": a MIG-enabled GPU is still one nvidia.com/gpu to the device plugin
    assert after.status.allocatable["nvidia.com/gpu"] == "8"
    assert core.read_namespaced_pod("trainer", "default").status.phase == "Running"

    # --- the host agrees again (MIG off): the condition, the warning and the label clear ---
    simhosts.change(host, lambda s: simhosts.apply_mig(s, [drifted_gpu], False, []))
    assert simhosts.report_in_process(host)
    pool_row = drive(
        pool_id,
        lambda p: any(c["type"] == "NodesDrifted" and c["status"] == "False" for c in p.conditions),
        what="NodesDrifted False",
    )
    cleared = next(c for c in pool_row.conditions if c["type"] == "NodesDrifted")
    assert (cleared["reason"], cleared["message"]) == (
        "NoDrift",
        "every node's host reports what it must run",
    )
    assert not [w for w in Host.objects.get(pk=host.pk).warnings if name in w]
    assert core.read_node(name).metadata.labels["nvidia.com/mig.config.state"] == "success"
    assert core.read_namespaced_pod("trainer", "default").status.phase == "Running"


def test_a_host_that_loads_another_driver_under_a_pinned_pool_is_named_at_once(owner, make_host):
    from clusters.providers import simhosts
    from fleet.models import Host
    from nodepools.models import Node
    from nodepools.tasks import reconcile_nodepool
    from nvke.queueing import clear_pending, enqueue_once

    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    cluster = create_cluster(owner, "driver")
    api = api_client(kubeconfig_of(owner, cluster))
    core = k8s.CoreV1Api(api)
    resp = owner.post(
        f"/api/v1/clusters/{cluster.id}/nodepools",
        {
            "name": "pinned",
            "gpu_model": "h100-sxm5-80gb",
            "gpus_per_node": 8,
            "node_count": 1,
            "isolation": {"mode": "exclusive"},
            "driver_version": "580.95.05",
        },
        format="json",
    )
    assert resp.status_code == 202, resp.content
    pool_id = resp.json()["target_id"]
    drive(pool_id, lambda p: p.phase == "RUNNING", what="pinned RUNNING")
    [name] = node_names(pool_id)
    node = Node.objects.get(name=name)
    host = Host.objects.get(pk=node.host_id)
    assert host.driver_version == "580.95.05"
    assert core.read_node(name).metadata.labels["nvidia.com/cuda.driver-version.full"] == (
        "580.95.05"
    )

    # --- the host's driver container loads R570 under it: the report itself wakes the pool --
    clear_pending(reconcile_nodepool.name, str(pool_id))
    simhosts.change(host, lambda s: simhosts.install_driver(s, "R570"))
    loaded = simhosts.read(host.id)["driver_version"]
    assert loaded.startswith("570.")
    assert simhosts.report_in_process(host)
    assert not enqueue_once(reconcile_nodepool, str(pool_id))
    pool = drive(
        pool_id,
        lambda p: any(c["type"] == "NodesDrifted" and c["status"] == "True" for c in p.conditions),
        what="NodesDrifted",
    )
    drifted = next(c for c in pool.conditions if c["type"] == "NodesDrifted")
    assert drifted["message"] == f"node {name}: driver expected 580.95.05, reported {loaded}"
    assert (
        f"observed state: node {name} drifted from its pool: "
        f"driver expected 580.95.05, reported {loaded}"
    ) in Host.objects.get(pk=host.pk).warnings
    labels = core.read_node(name).metadata.labels
    assert labels["nvidia.com/cuda.driver-version.full"] == loaded
    assert labels["nvidia.com/cuda.driver-version.major"] == "570"
