"""The ResourceSlices and DeviceClass of a hosted cluster's DRA pools, written by NVKE.

:func:`sync` makes the API behind a client hold, among the ResourceSlices NVKE made (label
``nvke.io/nodepool``), exactly one per :class:`~clusters.providers.base.TenantNode` with
``dra_devices``, in the shape NVIDIA's DRA driver publishes (``resource.k8s.io/v1``):
``spec.driver`` ``gpu.nvidia.com``, ``spec.nodeName`` and ``spec.pool.name`` the node's name,
one slice per pool (``resourceSliceCount: 1``), the devices as given. A slice is named
``<node>-gpu.nvidia.com`` (the driver lets the API generate a name; a fixed one makes a
second writer's create a 409, not a duplicate). It is replaced only when its devices changed
(an annotation carries their digest: the API rewrites quantities, so the spec read back
cannot be compared with the one written), with ``spec.pool.generation`` one higher, as the
scheduler takes the highest generation of a pool as current. A node no longer given (gone, or
of a device-plugin pool) loses its slice, before its Node is deleted or relabelled
(:func:`prune` runs before the Nodes are written, :func:`publish` after). While no node has
DRA devices and no Node of NVKE's carries :data:`~clusters.providers.base.DRA_NODE_LABEL`, the
slices are not listed at all: none of NVKE's can exist then.

While any slice is published the cluster has the driver's DeviceClasses ``gpu.nvidia.com``
(whole GPUs: ``device.driver == "gpu.nvidia.com"`` and attribute ``type`` ``gpu``) and
``mig.nvidia.com`` (MIG devices: ``type`` ``mig``), as its Helm chart installs them
(``templates/deviceclass-gpu.yaml``, ``deviceclass-mig.yaml``); they are left in place when
the last DRA pool goes, since the tenant's claims name them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..providers.base import DRA_DRIVER, DRA_NODE_LABEL, TenantNode
from .nodes import MANAGED_LABEL

GROUP, VERSION = "resource.k8s.io", "v1"
DIGEST_ANNOTATION = "nvke.io/devices-digest"
#: the driver's DeviceClasses: name -> the device ``type`` it selects
DEVICE_CLASSES = {DRA_DRIVER: "gpu", "mig.nvidia.com": "mig"}


def slice_name(node_name: str) -> str:
    return f"{node_name}-{DRA_DRIVER}"


def device_class_selector(device_type: str) -> str:
    """The CEL selector of the driver's DeviceClass for devices of ``device_type``."""
    return (
        f'device.driver == "{DRA_DRIVER}" && '
        f'device.attributes["{DRA_DRIVER}"].type == "{device_type}"'
    )


def device_classes() -> list[dict[str, Any]]:
    """The driver's DeviceClasses (:data:`DEVICE_CLASSES`)."""
    return [
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DeviceClass",
            "metadata": {"name": name, "labels": {MANAGED_LABEL: ""}},
            "spec": {"selectors": [{"cel": {"expression": device_class_selector(kind)}}]},
        }
        for name, kind in DEVICE_CLASSES.items()
    ]


def _digest(devices: tuple[dict[str, Any], ...]) -> str:
    return hashlib.sha256(json.dumps(devices, sort_keys=True).encode()).hexdigest()[:16]


def resource_slice(node: TenantNode, generation: int = 1) -> dict[str, Any]:
    """The ResourceSlice of ``node`` (which has ``dra_devices``)."""
    devices = node.dra_devices or ()
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node.name),
            "labels": {MANAGED_LABEL: node.labels.get(MANAGED_LABEL, "")},
            "annotations": {DIGEST_ANNOTATION: _digest(devices)},
        },
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node.name,
            "pool": {"name": node.name, "generation": generation, "resourceSliceCount": 1},
            "devices": [dict(d) for d in devices],
        },
    }


def _publishes(node: dict[str, Any]) -> bool:
    return ((node.get("metadata") or {}).get("labels") or {}).get(DRA_NODE_LABEL) == "false"


def prune(
    api, nodes: list[TenantNode], listed_nodes: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]] | None:
    """Delete the slices of NVKE's that no node of ``nodes`` with DRA devices keeps (run before
    the Nodes are written, so a slice goes before its Node); returns the others by name.

    ``listed_nodes``: NVKE's Nodes in the API before this sync. A slice is only ever written
    for a Node carrying :data:`~clusters.providers.base.DRA_NODE_LABEL` ``"false"`` (after it)
    and deleted before that Node, or its label, goes: when no given node has DRA devices and no
    listed Node carries the label, no slice of NVKE's can exist and none is listed (None)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    wanted = {slice_name(n.name) for n in nodes if n.dra_devices is not None}
    if not wanted and not any(_publishes(n) for n in listed_nodes.values()):
        return None
    objects = client.CustomObjectsApi(api)
    try:
        listed = objects.list_cluster_custom_object(
            GROUP, VERSION, "resourceslices", label_selector=MANAGED_LABEL
        )
    except ApiException as exc:
        if exc.status == 404 and not wanted:
            return None  # an API without resource.k8s.io/v1 and no DRA pool: nothing to do
        raise
    kept = {}
    for item in listed["items"]:
        name = item["metadata"]["name"]
        if name in wanted:
            kept[name] = item
            continue
        try:
            objects.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    return kept


def publish(api, nodes: list[TenantNode], kept: dict[str, dict[str, Any]] | None) -> None:
    """Write the slice of each node of ``nodes`` with DRA devices (after the Nodes): create
    the missing, replace those whose devices changed, and before either make sure the
    DeviceClasses exist (a device can only appear through such a write, so a sync that
    changes nothing asks nothing); ``kept``: what :func:`prune` left. Raises
    ``kubernetes.client.rest.ApiException`` when the API refuses."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    existing = dict(kept or {})
    creates, replaces = [], []
    for node in nodes:
        if node.dra_devices is None:
            continue
        current = existing.get(slice_name(node.name))
        if current is None:
            creates.append(resource_slice(node))
            continue
        body = resource_slice(node, current["spec"]["pool"]["generation"] + 1)
        annotations = current["metadata"].get("annotations") or {}
        if (
            annotations.get(DIGEST_ANNOTATION) != body["metadata"]["annotations"][DIGEST_ANNOTATION]
            or current["spec"].get("nodeName") != node.name
        ):
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            replaces.append(body)
    if not creates and not replaces:
        return
    objects = client.CustomObjectsApi(api)
    for device_class in device_classes():
        try:
            objects.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", device_class)
        except ApiException as exc:
            if exc.status != 409:
                raise
    for body in creates:
        objects.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body)
    for body in replaces:
        objects.replace_cluster_custom_object(
            GROUP, VERSION, "resourceslices", body["metadata"]["name"], body
        )
