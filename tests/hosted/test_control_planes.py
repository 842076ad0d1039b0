"""Every tenant cluster gets a real Kubernetes API (issue 30), tested with real processes.

At most two control planes are alive at once in any test here.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.e2e.conftest import wait_for
from tests.hosted.conftest import (
    api_client,
    condition,
    create_cluster,
    kubeconfig_of,
    kubectl,
    reconcile_until,
    require_binaries,
)

pytestmark = pytest.mark.timeout(300)


def _configmap(api, name: str, data: dict) -> None:
    k8s.CoreV1Api(api).create_namespaced_config_map(
        "default", k8s.V1ConfigMap(metadata={"name": name}, data=data)
    )


def _configmap_data(api, name: str) -> dict | None:
    try:
        return k8s.CoreV1Api(api).read_namespaced_config_map(name, "default").data
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _environ(pid: int) -> dict[str, str]:
    """A process's environment as the kernel holds it (``/proc/<pid>/environ``)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _etcd(manager):
    from clusters.hosted.etcd import Etcd

    return Etcd(manager.data_dir / "etcd")


def test_two_tenants_get_their_own_api_and_datastore_credentials_cover_only_their_prefix(
    manager, region, owner, outsider, tenant_b, make_host, tmp_path
):
    from clusters.hosted.etcd import DatastoreError, prefix

    require_binaries(("v1.37",))
    a = create_cluster(owner, "alpha", "1.36")
    b = create_cluster(outsider, "beta", "1.37")
    api_a, api_b = api_client(kubeconfig_of(owner, a)), api_client(kubeconfig_of(outsider, b))

    # each answers with its own version: the control plane runs the cluster's minor
    assert k8s.VersionApi(api_a).get_code().git_version == "v" + a.control_plane_version
    assert a.control_plane_version.startswith("1.36.")
    assert k8s.VersionApi(api_b).get_code().git_version.startswith("v1.37.")

    # a ConfigMap written in one is invisible in the other
    _configmap(api_a, "only-in-a", {"tenant": "a"})
    assert _configmap_data(api_a, "only-in-a") == {"tenant": "a"}
    assert _configmap_data(api_b, "only-in-a") is None

    # the tenant admin is an RBAC-bound ServiceAccount, not system:masters
    review = k8s.AuthenticationV1Api(api_a).create_self_subject_review(
        k8s.V1SelfSubjectReview(metadata={})
    )
    user = review.status.user_info
    assert user.username == "system:serviceaccount:nvke-system:tenant-admin"
    assert "system:masters" not in user.groups

    # kubectl (built from the same module) works with the kubeconfig NVKE hands out
    namespaces = kubectl(kubeconfig_of(owner, a), tmp_path, "get", "namespaces", "-o", "name")
    assert "namespace/kube-system" in namespaces.split()

    # the datastore: A's etcd credential reads A's keys and is refused on B's
    etcd = _etcd(manager)
    own = etcd.etcdctl("get", prefix(str(a.id)) + "/", "--prefix", "--keys-only", cert=str(a.id))
    assert f"{prefix(str(a.id))}/configmaps/default/only-in-a" in own.split()
    with pytest.raises(DatastoreError, match="permission denied"):
        etcd.etcdctl("get", prefix(str(b.id)) + "/", "--prefix", "--keys-only", cert=str(a.id))
    with pytest.raises(DatastoreError, match="permission denied"):
        etcd.etcdctl("put", prefix(str(b.id)) + "/configmaps/default/x", "y", cert=str(a.id))

    # Secrets are encrypted at rest with the cluster's key: the raw value has no plaintext
    k8s.CoreV1Api(api_a).create_namespaced_secret(
        "default",
        k8s.V1Secret(metadata={"name": "db"}, string_data={"password": "hunter2-plaintext"}),
    )
    raw = etcd.etcdctl("get", prefix(str(a.id)) + "/secrets/default/db", "--print-value-only")
    assert raw.startswith("k8s:enc:secretbox:v1:key1:")
    assert "hunter2-plaintext" not in raw and "aHVudGVyMi1wbGFpbnRleHQ" not in raw


def test_rotate_credentials_makes_the_old_kubeconfig_401_without_a_restart(manager, region, owner):
    from clusters.models import HostedControlPlane

    cluster = create_cluster(owner, "rotating")
    old = api_client(kubeconfig_of(owner, cluster))
    assert k8s.CoreV1Api(old).list_namespace().items
    pids = HostedControlPlane.objects.get(pk=cluster.id).pids

    resp = owner.post(f"/api/v1/clusters/{cluster.id}/rotate-credentials")
    assert resp.status_code == 202, resp.content
    reconcile_until(cluster.id, lambda c: c.observed_generation == c.generation, what="rotated")

    new = api_client(kubeconfig_of(owner, cluster))
    assert k8s.CoreV1Api(new).list_namespace().items

    def refused() -> int | None:
        try:
            k8s.CoreV1Api(old).list_namespace()
        except ApiException as exc:
            return exc.status
        return None

    # kube-apiserver caches a good token for up to 10 s (its token authenticator cache)
    assert wait_for(refused, timeout=20, interval=0.5, what="the old kubeconfig refused") == 401
    assert k8s.CoreV1Api(new).list_namespace().items
    assert HostedControlPlane.objects.get(pk=cluster.id).pids == pids  # same processes


def test_a_deployment_gets_its_replicaset_and_pods_from_the_clusters_controller_manager(
    manager, region, owner
):
    cluster = create_cluster(owner, "deploy")
    api = api_client(kubeconfig_of(owner, cluster))
    k8s.AppsV1Api(api).create_namespaced_deployment(
        "default",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]},
                },
            },
        },
    )
    core = k8s.CoreV1Api(api)

    def two_pods():
        items = core.list_namespaced_pod("default", label_selector="app=web").items
        return items if len(items) == 2 else None

    pods = wait_for(two_pods, timeout=60, what="2 pods")
    owners = {p.metadata.owner_references[0].kind for p in pods}
    assert owners == {"ReplicaSet"}
    assert {p.status.phase for p in pods} == {"Pending"}  # no nodes yet (next issue)

    def scheduler_said_why():
        events = core.list_namespaced_event("default").items
        return [e for e in events if e.reason == "FailedScheduling"]

    events = wait_for(scheduler_said_why, timeout=60, what="FailedScheduling event")
    assert events[0].message == "no nodes available to schedule pods"
    assert events[0].source.component == "default-scheduler"

    # its /metrics is a documented scrape target: the job in <data dir>/prometheus.yml works
    _scrape(manager, cluster)

    # production rendering: this cluster's real kube-apiserver, playing the management
    # cluster, accepts the Secret, Deployment and Service of a control plane
    _render_into(api, cluster)


def _scrape(manager, cluster) -> None:
    import json
    import ssl
    import urllib.request

    jobs = json.loads((manager.data_dir / "prometheus.yml").read_text())["scrape_configs"]
    job = next(j for j in jobs if j["job_name"] == f"kube-apiserver-{cluster.id}")
    assert job["static_configs"][0]["labels"]["cluster"] == cluster.name
    tls = job["tls_config"]
    context = ssl.create_default_context(cafile=tls["ca_file"])
    context.load_cert_chain(tls["cert_file"], tls["key_file"])
    target = job["static_configs"][0]["targets"][0]
    with urllib.request.urlopen(f"https://{target}/metrics", context=context, timeout=10) as resp:
        body = resp.read().decode()
    assert "apiserver_request_total" in body


def _render_into(api, cluster) -> None:
    import json

    from clusters.hosted import render
    from clusters.hosted.pki import ControlPlanePki, issue, new_ca
    from clusters.models import HostedControlPlane
    from nvke import crypto

    row = HostedControlPlane.objects.get(pk=cluster.id)
    bundle = ControlPlanePki.from_dict(json.loads(crypto.decrypt(row.pki_encrypted)))
    etcd_ca = new_ca("etcd-ca")
    client = issue(etcd_ca, f"nvke-{cluster.id}", client=True)
    objects = render.render(
        cluster_id=str(cluster.id), cluster_name=cluster.name, version="1.36.3", pki=bundle,
        etcd_url="https://etcd.nvke-system.svc:2379", etcd_ca=etcd_ca.cert,
        etcd_client=(client.cert, client.key), namespace="nvke-control-planes",
    )  # fmt: skip
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata={"name": "nvke-control-planes"}))
    render.apply(api, objects)
    name = render.object_name(str(cluster.id))
    deployment = k8s.AppsV1Api(api).read_namespaced_deployment(name, "nvke-control-planes")
    containers = {c.name: c for c in deployment.spec.template.spec.containers}
    assert set(containers) == {"kube-apiserver", "kube-controller-manager", "kube-scheduler"}
    assert containers["kube-apiserver"].image == "registry.k8s.io/kube-apiserver:v1.36.3"
    assert f"--etcd-prefix=/nvke/{cluster.id}" in containers["kube-apiserver"].command
    assert [(e.name, e.value) for e in containers["kube-apiserver"].env] == [("GOGC", "25")]
    assert containers["kube-scheduler"].env is None
    service = k8s.CoreV1Api(api).read_namespaced_service(name, "nvke-control-planes")
    assert service.spec.type == "LoadBalancer" and service.spec.ports[0].port == 6443
    secret = k8s.CoreV1Api(api).read_namespaced_secret(f"{name}-pki", "nvke-control-planes")
    assert {"ca.crt", "apiserver.key", "encryption.yaml", "etcd-client.key"} <= set(secret.data)


def test_a_killed_apiserver_is_seen_at_once_and_comes_back(manager, region, owner):
    from clusters.models import Cluster, HostedControlPlane

    cluster = create_cluster(owner, "phoenix")
    api = api_client(kubeconfig_of(owner, cluster))
    _configmap(api, "survivor", {"k": "v"})
    pids = HostedControlPlane.objects.get(pk=cluster.id).pids
    pid = pids["kube-apiserver"]
    # the apiserver runs with the GOGC NVKE sets (NVKE_HOSTED_APISERVER_GOGC, default 25); the
    # others with Go's default (the manager's environment has no GOGC)
    assert _environ(pid).get("GOGC") == "25"
    assert "GOGC" not in _environ(pids["kube-controller-manager"])

    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    # False the moment the process exited, with the reason -- before the 1 s restart backoff
    down = wait_for(
        lambda: (
            condition(Cluster.objects.get(pk=cluster.id), "ControlPlaneReady").get("status")
            == "False"
        ),
        timeout=5,
        interval=0.05,
        what="ControlPlaneReady False",
    )
    assert down and time.monotonic() - killed_at < 1.0
    cond = condition(Cluster.objects.get(pk=cluster.id), "ControlPlaneReady")
    assert cond["reason"] == "ProcessExited"
    assert "kube-apiserver exited (killed by SIGKILL)" in cond["message"]

    wait_for(
        lambda: (
            condition(Cluster.objects.get(pk=cluster.id), "ControlPlaneReady").get("status")
            == "True"
        ),
        timeout=90,
        what="ControlPlaneReady True again",
    )
    row = HostedControlPlane.objects.get(pk=cluster.id)
    assert row.pids["kube-apiserver"] != pid and row.restarts >= 1
    assert _environ(row.pids["kube-apiserver"]).get("GOGC") == "25"  # the restart keeps it
    assert _configmap_data(api, "survivor") == {"k": "v"}  # same data, same credential


def test_upgrade_136_to_137_keeps_objects_and_delete_leaves_nothing(manager, region, owner):
    from clusters.hosted.etcd import prefix, user
    from clusters.models import HostedControlPlane

    require_binaries(("v1.37",))
    cluster = create_cluster(owner, "upgrader", "1.36")
    api = api_client(kubeconfig_of(owner, cluster))
    _configmap(api, "before-upgrade", {"minor": "36"})
    k8s.AppsV1Api(api).create_namespaced_deployment(
        "default",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "kept"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "kept"}},
                "template": {
                    "metadata": {"labels": {"app": "kept"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                },
            },
        },
    )
    resp = owner.patch(
        f"/api/v1/clusters/{cluster.id}", {"kubernetes_version": "1.37"}, format="json"
    )
    assert resp.status_code == 202, resp.content
    upgraded = reconcile_until(
        cluster.id,
        lambda c: c.phase == "RUNNING" and c.control_plane_version.startswith("1.37."),
        timeout=180,
        what="upgraded to 1.37",
    )
    assert k8s.VersionApi(api).get_code().git_version == "v" + upgraded.control_plane_version
    assert _configmap_data(api, "before-upgrade") == {"minor": "36"}
    assert k8s.AppsV1Api(api).read_namespaced_deployment("kept", "default").spec.replicas == 1

    row = HostedControlPlane.objects.get(pk=cluster.id)
    pids, port = list(row.pids.values()), row.port
    etcd = _etcd(manager)
    assert etcd.count_keys(str(cluster.id)) > 0
    resp = owner.delete(f"/api/v1/clusters/{cluster.id}")
    assert resp.status_code == 202
    reconcile_until(cluster.id, lambda c: c.phase == "DELETED", timeout=120, what="DELETED")

    import psutil

    assert not [p for p in pids if psutil.pid_exists(p)]
    assert not _listening(port)
    assert etcd.count_keys(str(cluster.id)) == 0
    assert user(str(cluster.id)) not in etcd.etcdctl("user", "list").split()
    assert not (manager.data_dir / "control-planes" / str(cluster.id)).exists()
    assert not HostedControlPlane.objects.filter(pk=cluster.id).exists()
    assert prefix(str(cluster.id))  # (the prefix's keys counted 0 above)


def test_a_restarted_manager_brings_clusters_back_with_their_data(manager, region, owner):
    cluster = create_cluster(owner, "durable")
    api = api_client(kubeconfig_of(owner, cluster))
    _configmap(api, "kept-across-runs", {"run": "1"})
    from clusters.models import HostedControlPlane

    pids = list(HostedControlPlane.objects.get(pk=cluster.id).pids.values())
    manager.stop()  # as Ctrl-C on `make run` stops it

    import psutil

    assert not [p for p in pids if psutil.pid_exists(p)]
    port = HostedControlPlane.objects.get(pk=cluster.id).port
    assert not _listening(port)

    manager.start()
    wait_for(lambda: _listening(port), timeout=60, what="kube-apiserver back")
    data = wait_for(
        lambda: _try(lambda: _configmap_data(api, "kept-across-runs")), timeout=60, what="data"
    )
    assert data == {"run": "1"}


def _try(fn):
    try:
        return fn()
    except Exception:
        return None


def test_a_cluster_created_before_its_binaries_are_built_says_so_then_becomes_ready(
    transactional_db, planes_dir, region, owner, settings, tmp_path
):
    """The manager finds no 1.36 binaries in its (empty) cache folder and starts the builder,
    which waits for the lock this test holds as another build would; the cluster says what it
    waits for. The test then puts the binaries in place (as that build would) and lets go."""
    import fcntl
    import subprocess

    from clusters.hosted import binaries
    from clusters.models import Cluster
    from tests.hosted.conftest import Manager

    require_binaries(("etcd", "v1.36"))
    settings.NVKE_DEFAULT_PROVIDER = "hosted"
    root = tmp_path / "bin-root"
    root.mkdir()

    def folder(target: str):
        out = subprocess.run(
            ["bash", str(binaries.BUILD_SCRIPT), "--dir", target],
            env={**os.environ, "NVKE_K8S_BIN_ROOT": str(root)},
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return Path(out.stdout.strip())

    def provide(target: str) -> None:
        (folder(target) / "bin").mkdir(parents=True)
        for built in (binaries.target_dir(target) / "bin").iterdir():
            (folder(target) / "bin" / built.name).symlink_to(built)
        if target == "kwok":
            (folder(target) / binaries.KWOK_STAGES).symlink_to(binaries.kwok_stages())

    provide("etcd")
    provide("kwok")
    lock = (root / ".lock").open("w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # "another build is running"
    manager = Manager(planes_dir, tmp_path / "manager.log", NVKE_K8S_BIN_ROOT=str(root))
    manager.start()
    try:
        resp = owner.post(
            "/api/v1/clusters",
            {"name": "early", "kubernetes_version": "1.36", "region": "us-east-1"},
            format="json",
        )
        assert resp.status_code == 202
        cluster_id = resp.json()["target_id"]
        waiting = reconcile_until(
            cluster_id,
            lambda c: (
                "waiting for the Kubernetes 1.36 binaries"
                in condition(c, "ControlPlaneReady").get("message", "")
            ),
            timeout=60,
            what="a condition naming the binaries it waits for",
        )
        assert waiting.phase == "PROVISIONING"
        assert "kube-apiserver" in condition(waiting, "ControlPlaneReady")["message"]

        provide("v1.36")
        fcntl.flock(lock, fcntl.LOCK_UN)
        ready = reconcile_until(cluster_id, lambda c: c.phase == "RUNNING", what="RUNNING")
        assert condition(ready, "ControlPlaneReady")["status"] == "True"
        assert ready.control_plane_version.startswith("1.36.")
        assert Cluster.objects.get(pk=cluster_id).endpoint.startswith("https://127.0.0.1:")
    finally:
        lock.close()
        manager.stop()
        print(manager.log_path.read_text()[-3000:])
