"""The Nodes of SIMULATED Cluster API machines (``NVKE_CLUSTERAPI_SIMULATED_NODES``: test beds).

A real machine's kubelet registers its Node and the GPU Operator's device plugin, MIG Manager
and GPU Feature Discovery label it; the provider reads what they publish. CAPD's in-memory
machines run none of them, so where the machines are simulated NVKE writes their Nodes into
the workload API itself, as it does for hosted clusters: each node's
:class:`~clusters.providers.base.TenantNode`, derived from its host agent's latest report
(:mod:`nodepools.tenant_nodes`), written by :mod:`clusters.hosted.nodes` (annotated
``kwok.x-k8s.io/node=fake``: the KWOK the test bed runs against the workload API server posts
Ready, renews the Leases and runs the pods), with what the machine itself decides:

* the name: the Machine's ``status.nodeRef.name``;
* the kubelet version: the Machine's ``spec.version`` (what Cluster API booted it with);
* two more labels: ``nvke.io/nodepool-id`` (the kubelet's ``--node-labels`` from NVKE's
  KubeadmConfigTemplate) and ``nvke.io/cluster-id`` (one API server plays every workload
  cluster of a test bed: a cluster's Nodes are the ones with its id);
* ``spec.unschedulable``: as the provider's cordon left it (``drain_node``,
  ``node_config_status``), not NVKE's node phase, as on a real machine.

A Node is there for every live Machine of the cluster bound to a node NVKE publishes (also
``PROVISIONING``: the provider waits for the GPU config on the Node before the node is ready);
the cluster's other Nodes NVKE made are deleted. No ResourceSlices: a DRA pool's devices are
the DRA driver's on a Cluster API cluster.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...hosted import nodes as hosted_nodes
from ..base import TenantNode
from . import render, status


def selector(cluster_id: Any) -> str:
    """The label selector of the Nodes NVKE made for one cluster."""
    return f"{hosted_nodes.MANAGED_LABEL},{render.L_CLUSTER_ID}={cluster_id}"


def machine_nodes(
    cluster_id: Any,
    machines: list[dict[str, Any]],
    nodes: list[TenantNode],
    listed: dict[str, dict[str, Any]],
) -> list[TenantNode]:
    """The Nodes the cluster's workload API must hold: each of ``nodes`` (derived from its
    host's report) whose NVKE node a live Machine of ``machines`` runs (annotation
    ``nvke.io/node-id``, with a ``status.nodeRef``), as that Machine's Node (see the module
    docstring); ``listed``: the cluster's Nodes now (:func:`clusters.hosted.nodes.existing`),
    by name. The oldest Machine wins when two run the same node. Pure."""
    by_id = {str(n.node_id): n for n in nodes if n.node_id is not None}
    ordered = sorted(
        machines,
        key=lambda m: (m["metadata"].get("creationTimestamp") or "", m["metadata"]["name"]),
    )
    out: dict[str, TenantNode] = {}
    for machine in ordered:
        meta = machine.get("metadata") or {}
        node = by_id.get(status.node_id_of(machine))
        name = status.node_name(machine)
        if node is None or not name or meta.get("deletionTimestamp") or str(node.node_id) in out:
            continue
        pool_id = (meta.get("labels") or {}).get(render.L_POOL_ID, "")
        current = (listed.get(name) or {}).get("spec") or {}
        out[str(node.node_id)] = dataclasses.replace(
            node,
            name=name,
            labels={**node.labels, render.L_POOL_ID: pool_id, render.L_CLUSTER_ID: str(cluster_id)},
            kubelet_version=(machine.get("spec") or {}).get("version") or node.kubelet_version,
            unschedulable=bool(current.get("unschedulable")),
            dra_devices=None,
        )
    return list(out.values())


def sync(api, cluster_id: Any, machines: list[dict[str, Any]], nodes: list[TenantNode]) -> None:
    """Make the workload API behind ``api`` (a ``kubernetes`` ApiClient) hold exactly
    :func:`machine_nodes` among the cluster's Nodes NVKE made.
    Raises ``kubernetes.client.rest.ApiException`` when the API refuses."""
    listed = hosted_nodes.existing(api, selector(cluster_id))
    hosted_nodes.sync(api, machine_nodes(cluster_id, machines, nodes, listed), listed)
