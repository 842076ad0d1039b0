"""The apply/read code (clusters/providers/clusterapi/client.py, the official ``kubernetes``
client) against the SIMULATED management cluster API of fake_apiserver.py (a local HTTP
server playing the calls used; no Kubernetes API server runs here).

What is checked is what goes over the wire (method, path, query, content type, token) and
how answers and errors come back.
"""

from __future__ import annotations

import socket

import pytest

from clusters.providers.base import ProviderError
from clusters.providers.clusterapi.client import ApiError, management_api, workload_api
from clusters.providers.clusterapi.render import CLUSTER, CONFIG_MAP, MACHINE_DEPLOYMENT, POD


def cluster_obj(name="c1", **spec):
    return {
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {"name": name, "namespace": "nvke", "labels": {"team": "a"}},
        "spec": spec or {"paused": False},
    }


@pytest.fixture
def api(management_kubeconfig):
    return management_api(management_kubeconfig)


def test_apply_is_a_server_side_apply_by_nvke_with_force(fake_api, api):
    stored = api.apply(cluster_obj())
    assert stored["metadata"]["resourceVersion"] == "1"
    (call,) = fake_api.calls("PATCH")
    assert call.path == "/apis/cluster.x-k8s.io/v1beta2/namespaces/nvke/clusters/c1"
    assert call.content_type == "application/apply-patch+yaml"
    assert call.query == {"fieldManager": ["nvke"], "force": ["true"]}
    assert call.authorization == "Bearer simulated-token"
    assert call.body == cluster_obj()


def test_apply_of_a_core_object_goes_to_the_core_api(fake_api, api):
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "gpu-operator"},
        "data": {"config.yaml": "version: v1\n"},
    }
    assert api.apply(config_map)["data"] == {"config.yaml": "version: v1\n"}
    (call,) = fake_api.calls("PATCH")
    assert call.path == "/api/v1/namespaces/gpu-operator/configmaps/x"
    assert (call.content_type, call.query["fieldManager"]) == (
        "application/apply-patch+yaml",
        ["nvke"],
    )


def test_applying_again_without_a_field_removes_what_nvke_applied_before(fake_api, api):
    api.apply(cluster_obj(paused=True, availabilityGates=[{"conditionType": "X"}]))
    api.apply(cluster_obj(paused=True))
    spec = fake_api.one("clusters", "c1")["spec"]
    assert "availabilityGates" not in spec and spec["paused"] is True
    # what a controller (simulated Cluster API) wrote is not NVKE's to remove
    assert spec["controlPlaneEndpoint"] == {"host": "c1.cp.capi.test", "port": 6443}


def test_reads_lists_and_deletes(fake_api, api):
    api.apply(cluster_obj("c1"))
    api.apply(cluster_obj("c2") | {"metadata": {"name": "c2", "namespace": "nvke"}})
    assert api.get(CLUSTER, "c1", "nvke")["metadata"]["labels"] == {"team": "a"}
    assert api.get(CLUSTER, "nope", "nvke") is None
    assert [o["metadata"]["name"] for o in api.list(CLUSTER, "nvke")] == ["c1", "c2"]
    assert [
        o["metadata"]["name"] for o in api.list(CLUSTER, "nvke", label_selector={"team": "a"})
    ] == ["c1"]
    assert fake_api.calls("GET", "clusters$")[-1].query == {"labelSelector": ["team=a"]}
    assert api.list(MACHINE_DEPLOYMENT, "nvke") == []
    # a Cluster is deleted once Cluster API has seen the deletion (simulated)
    assert api.delete(CLUSTER, "c2", "nvke") is True
    assert api.get(CLUSTER, "c2", "nvke") is None
    assert api.delete(CLUSTER, "c2", "nvke") is False
    assert fake_api.calls("DELETE")[0].query == {"propagationPolicy": ["Background"]}


def test_merge_patch_sets_and_removes_keys(fake_api, api):
    api.apply(cluster_obj())
    api.merge_patch(CLUSTER, "c1", {"metadata": {"labels": {"team": None, "x": "y"}}}, "nvke")
    assert fake_api.one("clusters", "c1")["metadata"]["labels"] == {"x": "y"}
    assert fake_api.calls("PATCH")[-1].content_type == "application/merge-patch+json"


def test_a_stale_resource_version_is_a_retryable_conflict(fake_api, api):
    first = api.apply(cluster_obj())
    api.apply(cluster_obj(paused=True))  # someone else changed it meanwhile
    stale = cluster_obj(paused=False)
    stale["metadata"]["resourceVersion"] = first["metadata"]["resourceVersion"]
    with pytest.raises(ApiError) as caught:
        api.apply(stale)
    assert (caught.value.status, caught.value.code, caught.value.retryable) == (
        409,
        "clusterapi_conflict",
        True,
    )
    assert "has been modified" in str(caught.value)


def test_an_invalid_object_is_not_retryable(fake_api, api):
    fake_api.fail("PATCH", r"/clusters/c1$", 422)
    with pytest.raises(ApiError) as caught:
        api.apply(cluster_obj())
    assert (caught.value.code, caught.value.retryable) == ("clusterapi_invalid_object", False)
    assert "HTTP 422" in str(caught.value) and "apply Cluster nvke/c1" in str(caught.value)


def test_a_server_error_is_retryable(fake_api, api):
    fake_api.fail("GET", r"/clusters/c1$", 503)
    with pytest.raises(ApiError) as caught:
        api.get(CLUSTER, "c1", "nvke")
    assert (caught.value.code, caught.value.retryable) == ("clusterapi_unavailable", True)


def test_wrong_credentials_are_not_retryable(fake_api, tmp_path):
    path = tmp_path / "bad.kubeconfig"
    path.write_text(fake_api.kubeconfig().replace("simulated-token", "wrong"))
    with pytest.raises(ApiError) as caught:
        management_api(str(path)).get(CLUSTER, "c1", "nvke")
    assert (caught.value.status, caught.value.code, caught.value.retryable) == (
        401,
        "clusterapi_unauthorized",
        False,
    )


def test_an_unreachable_server_is_retryable(tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = tmp_path / "down.kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: m, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: m, context: {cluster: m, user: u}}]\ncurrent-context: m\n"
    )
    api = management_api(str(path))
    api.api_client.configuration.retries = 0
    with pytest.raises(ApiError) as caught:
        api.get(CLUSTER, "c1", "nvke")
    assert (caught.value.status, caught.value.code, caught.value.retryable) == (
        0,
        "clusterapi_unavailable",
        True,
    )


def test_an_unconfigured_provider_says_so(tmp_path):
    for path in ("", str(tmp_path / "missing")):
        with pytest.raises(ProviderError) as caught:
            management_api(path)
        assert (caught.value.code, caught.value.retryable) == ("clusterapi_not_configured", False)


def test_eviction_reports_evicted_blocked_and_gone(fake_api):
    api = workload_api(fake_api.kubeconfig(prefix="/workload/w1"), name="w1")
    for name, labels in (("free", {}), ("guarded", {"nvke-test/pdb-blocked": "true"})):
        fake_api.put(
            "w1",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "team", "labels": labels},
                "spec": {"nodeName": "n1"},
            },
        )
    assert api.evict("free", "team") == "evicted"
    assert api.evict("guarded", "team") == "blocked"
    assert api.evict("never-was", "team") == "gone"
    call = fake_api.calls("POST")[0]
    assert call.path == "/workload/w1/api/v1/namespaces/team/pods/free/eviction"
    assert call.body["apiVersion"] == "policy/v1" and call.body["kind"] == "Eviction"
    evicted = fake_api.one("pods", "free", cluster="w1")
    assert evicted["metadata"]["deletionTimestamp"]  # evicted: terminating
    on_node = api.list(POD, field_selector="spec.nodeName=n1")  # (simulated: gone by now)
    assert [p["metadata"]["name"] for p in on_node] == ["guarded"]


def test_a_workload_kubeconfig_that_is_not_yaml_is_refused():
    with pytest.raises(ProviderError) as caught:
        workload_api("{not: [yaml", name="w")
    assert caught.value.code == "clusterapi_bad_kubeconfig"


def test_get_of_a_missing_core_object_is_none(fake_api, api):
    assert api.get(CONFIG_MAP, "nope", "gpu-operator") is None
