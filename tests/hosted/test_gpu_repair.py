"""Xid 79 and its verified repair, seen from the tenant's cluster (issue 31): one GPU of an
exclusive 8-GPU node falls off the bus, its Node in the tenant's real kube-apiserver drops to
7 allocatable ``nvidia.com/gpu`` with ``GpuXidCritical`` True; auto-repair reboots the node,
the host's agent reports a clean GPU after the reboot, the repair is verified against that
report, and the Node is back to 8 allocatable GPUs with ``GpuXidCritical`` False, which the
cluster's own kube-scheduler uses; the host the agent cordoned for the Xid is ALLOCATED again.

The GPU host is SIMULATED (:mod:`clusters.providers.simhosts`): the Xid is logged on its
simulated driver, the reboot resets its simulated GPUs, and everything NVKE learns of either
comes through the host agent's report (the agent's ``simulated`` source, in-process). The
control plane, KWOK and kube-scheduler are real processes; the node pool's reconcile steps
and the Node writer run in this process, as a Celery worker would run them.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from tests.e2e.conftest import wait_for
from tests.hosted.conftest import api_client, create_cluster, kubeconfig_of
from tests.hosted.test_gpu_nodes import create_pool, drive, lease_renewals, node_names, pod

pytestmark = [pytest.mark.timeout(420), pytest.mark.usefixtures("hosted")]

GPUS = 8  # the node's GPUs: an exclusive node of h100-sxm5-80gb takes all 8 of its host


def gpu_view(core, name: str) -> tuple[str, str, str, str, bool]:
    """What the tenant's API says of node ``name``'s GPUs: ``(capacity, allocatable`` of
    ``nvidia.com/gpu`` (counts, as strings), ``GpuXidCritical``'s status and message,
    ``spec.unschedulable``)."""
    node = core.read_node(name)
    xid = {c.type: c for c in node.status.conditions}["GpuXidCritical"]
    return (
        node.status.capacity["nvidia.com/gpu"],
        node.status.allocatable["nvidia.com/gpu"],
        xid.status,
        xid.message,
        bool(node.spec.unschedulable),
    )


def test_xid_79_takes_one_gpu_out_of_allocatable_until_the_verified_repair_brings_it_back(
    owner, make_host
):
    from clusters.models import Operation
    from clusters.providers import simhosts
    from fleet.models import Gpu, GpuHealthInterval, Host
    from nodepools.models import Node, NodePool
    from nodepools.tasks import reconcile_nodepool, sync_tenant_nodes
    from nvke.queueing import clear_pending, enqueue_once

    make_host("h100-sxm5-80gb", gpus=GPUS, zone="us-east-1a")
    cluster = create_cluster(owner, "repair")
    api = api_client(kubeconfig_of(owner, cluster))
    core, coord = k8s.CoreV1Api(api), k8s.CoordinationV1Api(api)
    pool_id = create_pool(owner, cluster, "train", {"mode": "exclusive"})
    [name] = node_names(pool_id)
    row = Node.objects.get(name=name)
    host = Host.objects.get(pk=row.host_id)
    assert len(row.gpu_uuids) == GPUS
    lease_renewals(core, coord, name, 3)  # KWOK's heartbeats: NVKE's fields must survive them
    healthy = ("no GPU of the node reports a critical Xid",)
    assert gpu_view(core, name) == (str(GPUS), str(GPUS), "False", *healthy, False)

    # --- Xid 79 on one GPU (simulated driver log); the host's agent reports it --------------
    lost = row.gpu_uuids[3]
    simhosts.change(
        host, lambda s: simhosts.add_xid(s, lost, 79, message="GPU has fallen off the bus")
    )
    clear_pending(sync_tenant_nodes.name, str(cluster.id))
    clear_pending(reconcile_nodepool.name, str(pool_id))
    assert simhosts.report_in_process(host, events_after=0)
    # gpu_health_changed's receivers enqueued the Node writer and the pool's reconciler
    assert not enqueue_once(sync_tenant_nodes, str(cluster.id))
    assert not enqueue_once(reconcile_nodepool, str(pool_id))
    sync_tenant_nodes(str(cluster.id))  # run it as the worker would
    lost_view = (str(GPUS), str(GPUS - 1), "True", f"{lost}: Xid 79", False)
    assert gpu_view(core, name) == lost_view
    marked = Node.objects.get(pk=row.pk)
    # the catalog's immediate action for Xid 79 is RESTART_BM: a reboot in place
    assert (marked.repair_state, marked.repair_action, marked.repair_reason) == (
        "requested",
        "reboot",
        f"GPU {lost}: Xid 79 (RESTART_BM)",
    )
    assert Gpu.objects.get(uuid=lost).health == "UNHEALTHY"
    # Xid 79 is host-scoped: the agent cordons the host (no new node is placed there)
    cordon = f"Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS on {lost}: RESTART_BM"
    assert Host.objects.values_list("state", "state_reason", "state_actor").get(pk=host.pk) == (
        "CORDONED",
        cordon,
        "agent",
    )

    # a pod asking for all 8 GPUs cannot be placed while one is out of allocatable
    core.create_namespaced_pod("default", pod("all-eight", GPUS))

    def unschedulable():
        events = core.list_namespaced_event(
            "default", field_selector="involvedObject.name=all-eight,reason=FailedScheduling"
        ).items
        return events[0] if events else None

    event = wait_for(unschedulable, timeout=60, what="FailedScheduling of the 8-GPU pod")
    assert event.message.startswith("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")

    # --- the repair, one reconcile step at a time (the worker's task): drain and reboot -----
    boots = simhosts.read(host.id)["boot_count"]
    reconcile_nodepool(str(pool_id))  # the task a worker runs: one step of the pool
    assert not enqueue_once(reconcile_nodepool, str(pool_id))  # it requeued itself
    rebooting = Node.objects.get(pk=row.pk)
    assert (rebooting.phase, rebooting.repair_state) == ("REPAIRING", "rebooting")
    assert simhosts.read(host.id)["boot_count"] == boots + 1  # the simulated machine restarted
    # cordoned while it is repaired; the GPU stays out until the repair is verified
    assert gpu_view(core, name) == (*lost_view[:4], True)

    # --- verified: the agent's report after the reboot is clean; the GPU is back ------------
    drive(
        pool_id,
        lambda p: Node.objects.get(pk=row.pk).repair_state == "",
        what="the repair verified",
    )
    repaired = Node.objects.get(pk=row.pk)
    assert (repaired.phase, repaired.gpu_uuids, repaired.host_id) == (
        "READY",
        row.gpu_uuids,
        host.pk,
    )  # rebooted in place, not replaced
    assert Gpu.objects.get(uuid=lost).health == "HEALTHY"
    interval = GpuHealthInterval.objects.get(gpu_uuid=lost)
    assert (interval.xid, interval.ended_by) == (
        79,
        "auto-repair: rebooted, the agent's report is clean",
    )
    verified = {c["type"]: c for c in NodePool.objects.get(pk=pool_id).conditions}
    assert (verified["NodesVerified"]["status"], verified["NodesVerified"]["reason"]) == (
        "True",
        "AgentReportsAgree",
    )
    op = Operation.objects.get(target_id=pool_id, type="REPAIR_NODES")
    assert (op.status, op.requested_by) == ("DONE", "system:auto-repair")
    # the verified repair lifts the agent's cordon: the host's GPUs are held, ALLOCATED
    assert Host.objects.values_list("state", "state_reason", "state_actor").get(pk=host.pk) == (
        "ALLOCATED",
        f"uncordoned: repair of {lost} verified",
        "system:auto-repair",
    )

    lease_renewals(core, coord, name, 3)  # and it survives KWOK's heartbeats
    assert gpu_view(core, name) == (str(GPUS), str(GPUS), "False", *healthy, False)
    assert {c.type: c for c in core.read_node(name).status.conditions}["Ready"].status == "True"

    # the cluster's own scheduler now places the 8-GPU pod on the repaired node
    wait_for(
        lambda: core.read_namespaced_pod("all-eight", "default").status.phase == "Running",
        timeout=90,
        what="the 8-GPU pod Running after the repair",
    )
    assert core.read_namespaced_pod("all-eight", "default").spec.node_name == name
