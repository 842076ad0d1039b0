"""The Nodes of a hosted cluster's API: written by NVKE, kept alive by the cluster's KWOK.

:func:`sync` makes the API hold exactly the given :class:`~clusters.providers.base.TenantNode`
list among the Nodes NVKE made (label ``nvke.io/nodepool``): a missing Node is created with its
labels, taints, resources, conditions and ``nodeInfo`` (so KWOK's node-initialize Stage keeps
the kubelet version instead of writing its own), annotated ``kwok.x-k8s.io/node=fake`` so the
cluster's KWOK takes it over (Ready condition, Lease heartbeats, its pods' status); an existing
one is patched only where it differs (labels and resources NVKE no longer publishes are
removed; conditions are merged by type, so KWOK's stay); a Node no longer given is deleted.
"""

from __future__ import annotations

import json
from typing import Any

from ..providers.base import TenantNode
from .processes import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE

MANAGED_LABEL = "nvke.io/nodepool"
#: labels, resources and taints NVKE owns on its Nodes (others are the tenant's or Kubernetes')
OWNED_PREFIXES = ("nvidia.com/", "nvke.io/")
STRATEGIC = "application/strategic-merge-patch+json"


def _owned(key: str) -> bool:
    return key.startswith(OWNED_PREFIXES)


def _node_info(kubelet_version: str) -> dict[str, str]:
    # every field: the Python client's models refuse a partial nodeInfo
    return {
        "architecture": "amd64",
        "bootID": "",
        "containerRuntimeVersion": "containerd://2.1.4",
        "kernelVersion": "",
        "kubeProxyVersion": kubelet_version,
        "kubeletVersion": kubelet_version,
        "machineID": "",
        "operatingSystem": "linux",
        "osImage": "",
        "systemUUID": "",
    }


def _body(node: TenantNode) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": dict(node.labels),
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE},
        },
        "spec": {"taints": [dict(t) for t in node.taints], "unschedulable": node.unschedulable},
        "status": {
            "capacity": dict(node.capacity),
            "allocatable": dict(node.allocatable),
            "conditions": [dict(c) for c in node.conditions],
            "nodeInfo": _node_info(node.kubelet_version),
        },
    }


def _resources_patch(current: dict[str, str], wanted: dict[str, str]) -> dict[str, Any]:
    patch: dict[str, Any] = {k: v for k, v in wanted.items() if current.get(k) != v}
    patch.update({k: None for k in current if _owned(k) and k not in wanted})
    return patch


def _patches(current: dict[str, Any], node: TenantNode) -> tuple[dict, dict]:
    """(the object patch, the status patch) turning ``current`` into ``node``; empty when
    they agree."""
    meta = current.get("metadata") or {}
    labels = meta.get("labels") or {}
    spec = current.get("spec") or {}
    status = current.get("status") or {}
    obj: dict[str, Any] = {}
    label_patch = {k: v for k, v in node.labels.items() if labels.get(k) != v}
    label_patch.update({k: None for k in labels if _owned(k) and k not in node.labels})
    if label_patch:
        obj.setdefault("metadata", {})["labels"] = label_patch
    others = [t for t in spec.get("taints") or [] if not _owned(t.get("key", ""))]
    taints = others + [dict(t) for t in node.taints]
    if taints != (spec.get("taints") or []):
        obj.setdefault("spec", {})["taints"] = taints
    if bool(spec.get("unschedulable")) != node.unschedulable:
        obj.setdefault("spec", {})["unschedulable"] = node.unschedulable
    stat: dict[str, Any] = {}
    for key, wanted in (("capacity", node.capacity), ("allocatable", node.allocatable)):
        patch = _resources_patch(status.get(key) or {}, wanted)
        if patch:
            stat[key] = patch
    have = {c.get("type"): c for c in status.get("conditions") or []}
    changed = [
        dict(c)
        for c in node.conditions
        if any((have.get(c["type"]) or {}).get(k) != c[k] for k in ("status", "reason", "message"))
    ]
    if changed:
        stat["conditions"] = changed
    if (status.get("nodeInfo") or {}).get("kubeletVersion") != node.kubelet_version:
        stat["nodeInfo"] = {"kubeletVersion": node.kubelet_version}
    return obj, stat


def existing(api, selector: str = MANAGED_LABEL) -> dict[str, dict[str, Any]]:
    """The Nodes NVKE made (label ``nvke.io/nodepool``) in the API behind ``api``, by name;
    ``selector``: a label selector that narrows them further (a Cluster API test bed, where one
    API server plays every workload cluster: one cluster's)."""
    from kubernetes import client

    resp = client.CoreV1Api(api).list_node(label_selector=selector, _preload_content=False)
    return {n["metadata"]["name"]: n for n in json.loads(resp.data)["items"]}


def put(api, node: TenantNode, current: dict[str, Any] | None) -> None:
    """Create ``node`` in the API behind ``api`` (``current`` None) or patch ``current`` (its
    Node as :func:`existing` listed it) into it where they differ.
    Raises ``kubernetes.client.rest.ApiException`` when the API refuses."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    if current is None:
        core.create_node(_body(node))
        return
    obj, stat = _patches(current, node)
    if obj:
        core.patch_node(node.name, obj, _content_type=STRATEGIC)
    if stat:
        core.patch_node_status(node.name, {"status": stat}, _content_type=STRATEGIC)


def sync(api, nodes: list[TenantNode], listed: dict[str, dict[str, Any]] | None = None) -> None:
    """Make the API behind ``api`` (a ``kubernetes`` ApiClient with NVKE's credential) hold
    exactly ``nodes`` among the Nodes labelled ``nvke.io/nodepool`` (see module doc);
    ``listed``: :func:`existing`, when the caller read it already (narrowed by a selector:
    only those are candidates for deletion).
    Raises ``kubernetes.client.rest.ApiException`` when the API refuses."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api)
    remaining = dict(existing(api) if listed is None else listed)
    for node in nodes:
        put(api, node, remaining.pop(node.name, None))
    for name in remaining:
        try:
            core.delete_node(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
