"""The apply/read code (clusters/providers/clusterapi/client.py, the official ``kubernetes``
client) against the REAL kube-apiservers of the testbed (conftest.py): the management one
with Cluster API's CRDs and webhooks, and the workload one.

What is checked is what the API server stored (managed fields show who applied what, and
how), and how answers and errors come back.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clusters.providers.base import ProviderError
from clusters.providers.clusterapi.client import ApiError, management_api, workload_api
from clusters.providers.clusterapi.render import CONFIG_MAP, POD

NAMESPACE = "client-test"


def config_map(name="c1", **data):
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"team": "a"}},
        "data": data or {"a": "1"},
    }


@pytest.fixture(scope="module")
def api(capi_testbed):
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    core = k8s.CoreV1Api(k8s_config.new_client_from_config(capi_testbed.workload_kubeconfig))
    if not [n for n in core.list_namespace().items if n.metadata.name == NAMESPACE]:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    return management_api(capi_testbed.workload_kubeconfig)


@pytest.fixture
def fresh(api):
    """A name not used by another test (the API server lives for the session)."""
    counter = fresh.counter = getattr(fresh, "counter", 0) + 1
    return f"c{counter}"


def test_apply_is_a_server_side_apply_by_nvke_with_force(api, fresh):
    stored = api.apply(config_map(fresh))
    assert stored["data"] == {"a": "1"}
    (entry,) = stored["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"]) == ("nvke", "Apply")
    # force: a field another manager owns is taken over, not a conflict
    api.merge_patch(CONFIG_MAP, fresh, {"data": {"a": "theirs"}}, NAMESPACE)
    again = api.apply(config_map(fresh, a="2"))
    assert again["data"] == {"a": "2"}


def test_applying_again_without_a_field_removes_what_nvke_applied_before(api, fresh):
    api.apply(config_map(fresh, a="1", b="2"))
    assert api.apply(config_map(fresh, a="1"))["data"] == {"a": "1"}


def test_reads_lists_and_deletes(api, fresh):
    api.apply(config_map(fresh))
    assert api.get(CONFIG_MAP, fresh, NAMESPACE)["metadata"]["labels"] == {"team": "a"}
    names = [
        o["metadata"]["name"] for o in api.list(CONFIG_MAP, NAMESPACE, label_selector={"team": "a"})
    ]
    assert fresh in names
    assert api.list(CONFIG_MAP, NAMESPACE, label_selector={"team": "nobody"}) == []
    assert api.delete(CONFIG_MAP, fresh, NAMESPACE) is True
    assert api.get(CONFIG_MAP, fresh, NAMESPACE) is None
    assert api.delete(CONFIG_MAP, fresh, NAMESPACE) is False


def test_merge_patch_sets_and_removes_keys(api, fresh):
    api.apply(config_map(fresh))
    patched = api.merge_patch(
        CONFIG_MAP, fresh, {"metadata": {"labels": {"team": None, "x": "y"}}}, NAMESPACE
    )
    assert patched["metadata"]["labels"] == {"x": "y"}


def test_a_stale_resource_version_is_a_retryable_conflict(api, fresh):
    first = api.apply(config_map(fresh))
    api.apply(config_map(fresh, a="changed"))  # someone else changed it meanwhile
    stale = config_map(fresh, a="mine")
    stale["metadata"]["resourceVersion"] = first["metadata"]["resourceVersion"]
    with pytest.raises(ApiError) as caught:
        api.apply(stale)
    assert (caught.value.status, caught.value.code, caught.value.retryable) == (
        409,
        "clusterapi_conflict",
        True,
    )
    assert "has been modified" in str(caught.value)


def test_an_invalid_object_is_not_retryable(api):
    """The real API server's validation refuses it (a ConfigMap key may not hold a space):
    422, for good."""
    with pytest.raises(ApiError) as caught:
        api.apply(config_map("bad", **{"not a key": "x"}))
    assert (caught.value.status, caught.value.code, caught.value.retryable) == (
        422,
        "clusterapi_invalid_object",
        False,
    )
    assert f"apply ConfigMap {NAMESPACE}/bad" in str(caught.value)
    assert api.get(CONFIG_MAP, "bad", NAMESPACE) is None


@pytest.fixture
def answering():
    """A local HTTP server answering every request with the status code it is given."""
    state = {"status": 503}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"kind":"Status","message":"overloaded"}'
            self.send_response(state["status"])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _kubeconfig(tmp_path, server: str, name: str = "k") -> str:
    path = tmp_path / f"{name}.kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: m, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: m, context: {cluster: m, user: u}}]\ncurrent-context: m\n"
    )
    return str(path)


def test_a_server_error_is_retryable(answering, tmp_path):
    _state, url = answering
    api = management_api(_kubeconfig(tmp_path, url))
    api.api_client.configuration.retries = 0
    with pytest.raises(ApiError) as caught:
        api.get(CONFIG_MAP, "c1", NAMESPACE)
    assert (caught.value.status, caught.value.code, caught.value.retryable) == (
        503,
        "clusterapi_unavailable",
        True,
    )


def test_wrong_credentials_are_not_retryable(capi_testbed, tmp_path):
    """A bearer token the real API server does not know: 401."""
    ca = capi_testbed.pki.path("ca.crt")
    path = tmp_path / "bad.kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: m, cluster: {{server: '{capi_testbed.workload_url}', "
        f"certificate-authority: '{ca}'}}}}]\n"
        "users: [{name: u, user: {token: wrong}}]\n"
        "contexts: [{name: m, context: {cluster: m, user: u}}]\ncurrent-context: m\n"
    )
    with pytest.raises(ApiError) as caught:
        management_api(str(path)).get(CONFIG_MAP, "c1", NAMESPACE)
    assert (caught.value.status, caught.value.code, caught.value.retryable) == (
        401,
        "clusterapi_unauthorized",
        False,
    )


def test_an_unreachable_server_is_retryable(tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api = management_api(_kubeconfig(tmp_path, f"http://127.0.0.1:{port}", "down"))
    api.api_client.configuration.retries = 0
    with pytest.raises(ApiError) as caught:
        api.get(CONFIG_MAP, "c1", NAMESPACE)
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


def test_eviction_reports_evicted_blocked_and_gone(api, capi_testbed):
    """The real Eviction API: a budget that allows no disruption refuses (429)."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    work = k8s_config.new_client_from_config(capi_testbed.workload_kubeconfig)
    core, policy = k8s.CoreV1Api(work), k8s.PolicyV1Api(work)
    for name in ("free", "guarded"):
        core.create_namespaced_pod(
            NAMESPACE,
            {
                "metadata": {"name": name, "labels": {"app": name}},
                "spec": {
                    "nodeName": "n1",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": "busybox"}],
                },
            },
        )
    for name in ("free", "guarded"):  # running and Ready, as their kubelet would report
        core.patch_namespaced_pod_status(
            name,
            NAMESPACE,
            {
                "status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
            },
        )
    policy.create_namespaced_pod_disruption_budget(
        NAMESPACE,
        {
            "metadata": {"name": "guard"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )
    assert api.evict("free", NAMESPACE) == "evicted"
    assert api.evict("guarded", NAMESPACE) == "blocked"
    assert api.evict("never-was", NAMESPACE) == "gone"
    on_node = api.list(POD, NAMESPACE, field_selector="spec.nodeName=n1")
    assert [p["metadata"]["name"] for p in on_node] == ["guarded"]  # grace 0: "free" is gone
    core.delete_namespaced_pod("guarded", NAMESPACE)


def test_a_workload_kubeconfig_that_is_not_yaml_is_refused():
    with pytest.raises(ProviderError) as caught:
        workload_api("{not: [yaml", name="w")
    assert caught.value.code == "clusterapi_bad_kubeconfig"


def test_get_of_a_missing_core_object_is_none(api):
    assert api.get(CONFIG_MAP, "nope", NAMESPACE) is None
