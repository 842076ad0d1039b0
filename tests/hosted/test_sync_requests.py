"""What the hosted provider asks of a cluster's API when it writes the cluster's Nodes: no
control plane here, a recording stand-in for the API's HTTP answers (the real API is in
test_gpu_nodes.py / test_dra.py). A cluster without DRA pools costs no ResourceSlice LIST;
when the last DRA node goes, its slice is listed and deleted, before its Node."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from kubernetes import client as k8s

from clusters.providers.base import DRA_NODE_LABEL, ClusterSpec, TenantNode
from clusters.providers.hosted import HostedProvider

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLUSTER = ClusterSpec(
    id=uuid.uuid4(),
    tenant_id=uuid.uuid4(),
    name="c",
    kubernetes_version="1.36",
    region="us-east-1",
    created_at=datetime(2026, 1, 1, tzinfo=UTC),
)


class _Raw:
    """What urllib3 answers: status, reason, headers, body."""

    def __init__(self, status: int, body: dict) -> None:
        self.status, self.reason = status, "OK"
        self.data = json.dumps(body).encode()
        self.headers = {"content-type": "application/json"}


class RecordedApi:
    """A ``kubernetes`` ApiClient whose requests are recorded and answered from ``nodes`` and
    ``slices`` (lists of objects) instead of a server."""

    def __init__(self, nodes: list[dict], slices: list[dict]) -> None:
        self.nodes, self.slices = nodes, slices
        self.requests: list[tuple[str, str]] = []
        self.api = k8s.ApiClient(k8s.Configuration(host="https://127.0.0.1:1"))
        self.api.rest_client.request = self._request

    def _request(self, method, url, headers=None, body=None, post_params=None, **_):
        path = url.split("://", 1)[1].split("/", 1)[1].split("?", 1)[0]
        self.requests.append((method, "/" + path))
        if method == "GET" and path == "api/v1/nodes":
            answer = {"items": self.nodes}
        elif method == "GET" and "/" + path == SLICES:
            answer = {"items": self.slices}
        else:
            answer = {"metadata": {}}
        return k8s.rest.RESTResponse(_Raw(200, answer))


def node(name: str, *, dra: bool = False) -> TenantNode:
    return TenantNode(
        name=name,
        labels={"nvke.io/nodepool": "p", **({DRA_NODE_LABEL: "false"} if dra else {})},
        taints=(),
        capacity={"nvidia.com/gpu": "8"} if not dra else {},
        allocatable={"nvidia.com/gpu": "8"} if not dra else {},
        conditions=(),
        unschedulable=False,
        kubelet_version="v1.36.3",
        dra_devices=({"name": "gpu-0"},) if dra else None,
    )


def stored(tenant_node: TenantNode) -> dict:
    return {"metadata": {"name": tenant_node.name, "labels": dict(tenant_node.labels)}}


@pytest.fixture
def provider(monkeypatch):
    def on(recorded: RecordedApi) -> HostedProvider:
        provider = HostedProvider()
        monkeypatch.setattr(provider, "_admin_client", lambda cluster: (None, recorded.api))
        return provider

    return on


def test_a_cluster_without_dra_pools_makes_no_resource_slice_request(provider):
    recorded = RecordedApi(nodes=[stored(node("a"))], slices=[])
    provider(recorded).sync_nodes(CLUSTER, [node("a"), node("b")])

    assert recorded.requests[0] == ("GET", "/api/v1/nodes")
    assert ("POST", "/api/v1/nodes") in recorded.requests  # b created
    assert not [r for r in recorded.requests if "resource.k8s.io" in r[1]]


def test_when_the_last_dra_node_goes_its_slice_is_listed_and_deleted_before_its_node(provider):
    gone = node("d", dra=True)
    recorded = RecordedApi(
        nodes=[stored(node("a")), stored(gone)],
        slices=[{"metadata": {"name": "d-gpu.nvidia.com"}, "spec": {"nodeName": "d"}}],
    )
    provider(recorded).sync_nodes(CLUSTER, [node("a")])

    assert ("GET", SLICES) in recorded.requests
    deletes = [r for r in recorded.requests if r[0] == "DELETE"]
    assert deletes == [("DELETE", f"{SLICES}/d-gpu.nvidia.com"), ("DELETE", "/api/v1/nodes/d")]

    # the next step: no DRA node left, none in the API: the slices are not looked at again
    after = RecordedApi(nodes=[stored(node("a"))], slices=[])
    provider(after).sync_nodes(CLUSTER, [node("a")])
    assert not [r for r in after.requests if "resource.k8s.io" in r[1]]


def test_a_cluster_with_a_dra_pool_lists_and_writes_its_slices(provider):
    recorded = RecordedApi(nodes=[], slices=[])
    provider(recorded).sync_nodes(CLUSTER, [node("d", dra=True)])

    assert recorded.requests.index(("GET", SLICES)) < recorded.requests.index(
        ("POST", "/api/v1/nodes")
    )
    assert recorded.requests.index(("POST", "/api/v1/nodes")) < recorded.requests.index(
        ("POST", SLICES)
    )
