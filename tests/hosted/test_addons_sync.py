"""What :func:`clusters.hosted.addons.sync` asks of a cluster's API, against an in-memory
stand-in (the real kube-apiserver is in test_addons.py): the pools' rendering applied once,
then only a GET while nothing changed; a removed pool's objects deleted, the ClusterPolicy
last; a refusal named for the pools the object was rendered for, without the digest."""

from __future__ import annotations

import copy
import uuid
from datetime import UTC, datetime

import pytest

from clusters.hosted import addons
from clusters.providers.base import ClusterSpec, NodePoolSpec
from clusters.providers.clusterapi.client import ApiError
from clusters.providers.clusterapi.render import kind_of

CLUSTER = ClusterSpec(
    id=uuid.uuid4(),
    tenant_id=uuid.uuid4(),
    name="c",
    kubernetes_version="1.36",
    region="us-east-1",
    created_at=datetime(2026, 1, 1, tzinfo=UTC),
)


class MemoryApi:
    """``KubeApi``'s calls over a dict; ``refuse``: kinds answered 422."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.calls: list[tuple[str, str]] = []
        self.refuse: set[str] = set()

    @staticmethod
    def _key(kind: str, namespace, name: str):
        return kind, namespace or "", name

    def apply(self, obj):
        self.calls.append(("apply", obj["kind"]))
        if obj["kind"] in self.refuse:
            raise ApiError(
                f"apply {obj['kind']} {obj['metadata']['name']}: HTTP 422 invalid",
                status=422,
                retryable=False,
                code="clusterapi_invalid_object",
            )
        stored = copy.deepcopy(obj)
        if obj["kind"] == "CustomResourceDefinition":
            stored["status"] = {"conditions": [{"type": "Established", "status": "True"}]}
        meta = obj["metadata"]
        self.objects[self._key(obj["kind"], meta.get("namespace"), meta["name"])] = stored
        return stored

    def get(self, kind, name, namespace=None):
        self.calls.append(("get", kind.kind))
        return self.objects.get(self._key(kind.kind, namespace, name))

    def list(self, kind, namespace=None, *, label_selector=None):
        self.calls.append(("list", kind.kind))
        return [
            o
            for (k, ns, _), o in self.objects.items()
            if k == kind.kind and (namespace is None or ns == namespace)
            and all(o["metadata"].get("labels", {}).get(a) == b for a, b in label_selector.items())
        ]  # fmt: skip

    def delete(self, kind, name, namespace=None):
        self.calls.append(("delete", kind.kind))
        return self.objects.pop(self._key(kind.kind, namespace, name), None) is not None

    def names(self, kind: str) -> set[str]:
        return {n for (k, _, n) in self.objects if k == kind}


def pool(name: str, model: str, isolation: dict, placement: dict | None = None) -> NodePoolSpec:
    from catalog.models import GpuModel
    from nodepools.gpu_config import render_gpu_config

    return NodePoolSpec(
        id=uuid.uuid4(),
        cluster=CLUSTER,
        name=name,
        gpu_model=model,
        gpus_per_node=4,
        isolation=isolation,
        gpu_config=render_gpu_config(
            gpu_model=GpuModel.objects.get(slug=model),
            gpus_per_node=4,
            isolation=isolation,
            pool_name=name,
            placement=placement,
        ),
        placement=placement or {},
    )


@pytest.fixture
def pools(catalog):
    return (
        pool("shared", "h100-sxm5-80gb", {"mode": "time-slicing", "replicas": 4}),
        pool("nvl", "gb200", {"mode": "exclusive"}, {"same_nvlink_domain": True}),
    )


def test_the_rendering_is_applied_once_then_only_compared(pools):
    kube = MemoryApi()
    assert addons.sync(kube, list(pools)) == {}
    applied = [kind for call, kind in kube.calls if call == "apply"]
    assert applied[:3] == ["CustomResourceDefinition"] * 3
    assert applied[-1] == "ClusterPolicy"  # last: it carries the digest
    assert kube.names("ComputeDomain") == {"nvke-nvl"}
    assert kube.names("ConfigMap") == {"nvke-device-plugin-config", "nvke-mig-parted-config"}
    for obj in kube.objects.values():
        kind_of(obj)  # every object is of a kind NVKE knows where to find

    kube.calls.clear()
    assert addons.sync(kube, list(pools)) == {}
    assert kube.calls == [("get", "ClusterPolicy")]


def test_a_removed_pools_objects_are_deleted_and_the_cluster_policy_with_the_last(pools):
    shared, nvl = pools
    kube = MemoryApi()
    addons.sync(kube, [shared, nvl])
    addons.sync(kube, [shared])
    assert kube.names("ComputeDomain") == set()
    assert "ClusterPolicy" in {k for k, _, _ in kube.objects}

    kube.calls.clear()
    addons.sync(kube, [])
    assert {k for k, _, _ in kube.objects} == {"CustomResourceDefinition", "Namespace"}
    deletes = [kind for call, kind in kube.calls if call == "delete"]
    assert deletes[-1] == "ClusterPolicy"

    kube.calls.clear()
    assert addons.sync(kube, []) == {}  # nothing wanted, nothing there: one GET
    assert kube.calls == [("get", "ClusterPolicy")]


def test_a_refused_object_is_named_for_its_pool_and_tried_again(pools):
    shared, nvl = pools
    kube = MemoryApi()
    kube.refuse = {"ComputeDomain"}
    refused = addons.sync(kube, [shared, nvl])
    assert set(refused) == {nvl.id}
    assert "HTTP 422" in refused[nvl.id]
    policy = kube.objects[("ClusterPolicy", "", "cluster-policy")]
    assert addons.DIGEST_ANNOTATION not in policy["metadata"].get("annotations", {})
    assert kube.names("ConfigMap")  # the others were applied

    kube.calls.clear()
    assert set(addons.sync(kube, [shared, nvl])) == {nvl.id}  # no digest: tried again
    assert ("apply", "ComputeDomain") in kube.calls

    kube.refuse = {"ClusterPolicy"}  # a shared object: every pool is told
    assert set(addons.sync(kube, [shared, nvl])) == {shared.id, nvl.id}

    kube.refuse = set()
    assert addons.sync(kube, [shared, nvl]) == {}
    assert kube.names("ComputeDomain") == {"nvke-nvl"}
