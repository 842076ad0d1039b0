"""Which Nodes NVKE writes for SIMULATED Cluster API machines, and under which name, labels,
kubelet version and cordon (clusters/providers/clusterapi/simulated_nodes.py; pure, with
Machines and Nodes written by hand in the shapes the APIs return)."""

from __future__ import annotations

import uuid

from clusters.providers.base import TenantNode
from clusters.providers.clusterapi.simulated_nodes import machine_nodes, selector

CLUSTER = uuid.UUID("00000000-0000-0000-0000-0000000000c1")
POOL = "00000000-0000-0000-0000-0000000000a1"
A, B, C = (uuid.UUID(f"00000000-0000-0000-0000-00000000000{i}") for i in (1, 2, 3))


def derived(node_id: uuid.UUID, name: str) -> TenantNode:
    """A node as tenant_node derives it: NVKE's name, the control plane's kubelet version."""
    return TenantNode(
        name=name,
        labels={"nvke.io/nodepool": "mig", "nvidia.com/gpu.count": "14"},
        taints=({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},),
        capacity={"nvidia.com/gpu": "14"},
        allocatable={"nvidia.com/gpu": "14"},
        conditions=(),
        unschedulable=True,  # NVKE's phase says CORDONED: not what a simulated machine shows
        kubelet_version="v1.36.3",
        dra_devices=({"name": "gpu-0"},),
        node_id=node_id,
    )


def machine(name, node_id, *, node=None, created="2026-11-29T10:00:00Z", deleting=False):
    meta = {
        "name": name,
        "creationTimestamp": created,
        "labels": {"nvke.io/nodepool-id": POOL},
        "annotations": {"nvke.io/node-id": str(node_id)} if node_id else {},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-11-29T11:00:00Z"
    status = {"phase": "Running"}
    if node:
        status["nodeRef"] = {"name": node}
    return {"metadata": meta, "spec": {"version": "v1.36.0"}, "status": status}


def test_each_live_bound_machine_with_a_node_gets_its_nodes_node_under_the_machines_name():
    machines = [
        machine("md-x", A, node="md-x"),
        machine("md-y", B),  # booting: no Node yet
        machine("md-z", C, node="md-z", deleting=True),  # being deleted: its Node goes
        machine("md-w", None, node="md-w"),  # not bound to a node NVKE publishes
    ]
    listed = {"md-x": {"spec": {"unschedulable": True}}}
    out = machine_nodes(
        CLUSTER, machines, [derived(A, "mig-a"), derived(B, "mig-b"), derived(C, "mig-c")], listed
    )
    assert [n.name for n in out] == ["md-x"]
    (node,) = out
    assert node.node_id == A
    assert node.labels == {
        "nvke.io/nodepool": "mig",
        "nvidia.com/gpu.count": "14",
        "nvke.io/nodepool-id": POOL,
        "nvke.io/cluster-id": str(CLUSTER),
    }
    assert node.kubelet_version == "v1.36.0"  # the Machine's, not the control plane's patch
    assert node.unschedulable is True  # as the provider's cordon left the Node
    assert node.dra_devices is None  # no ResourceSlices on a Cluster API cluster
    assert node.allocatable == {"nvidia.com/gpu": "14"}  # the rest as derived


def test_a_new_node_is_schedulable_and_the_oldest_of_two_machines_of_a_node_wins():
    machines = [
        machine("md-new", A, node="md-new", created="2026-11-29T10:05:00Z"),
        machine("md-old", A, node="md-old", created="2026-11-29T10:00:00Z"),
    ]
    (node,) = machine_nodes(CLUSTER, machines, [derived(A, "mig-a")], {})
    assert (node.name, node.unschedulable) == ("md-old", False)


def test_the_nodes_of_one_cluster_are_selected_by_its_id():
    assert selector(CLUSTER) == f"nvke.io/nodepool,nvke.io/cluster-id={CLUSTER}"
