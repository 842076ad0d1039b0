"""Hosted control planes with real processes: a real control-plane manager
(``manage.py run_control_planes``) per test, on one etcd data folder for the session, running
real kube-apiserver / kube-controller-manager / kube-scheduler built by deploy/k8s/build.sh.

No test builds anything: without the binaries these tests skip, saying which are missing and
how to build them — except under ``CI=true``, where a missing binary is a failure (``.ci/run``
builds them first through ``make test``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import service_env, stop

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("etcd", "kwok", "v1.36", "v1.37")
LEASE_S = 4  # KWOK renews each Lease every second: 3 heartbeats in ~3 s


def require_binaries(targets=TARGETS) -> None:
    """Skip (fail under CI=true) when a binary of ``targets`` is not built."""
    from clusters.hosted import binaries

    missing = {t: binaries.missing(t) for t in targets}
    missing = {t: m for t, m in missing.items() if m}
    if not missing:
        return
    what = "; ".join(f"{t}: {', '.join(m)}" for t, m in missing.items())
    message = f"Kubernetes binaries not built ({what}): run deploy/k8s/build.sh (make k8s-bins)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def planes_dir(tmp_path_factory) -> Path:
    """The data folder every test's manager uses: one etcd (and its data) for the session."""
    return tmp_path_factory.mktemp("control-planes")


class Manager:
    """A running ``manage.py run_control_planes`` (start / stop it again within a test)."""

    def __init__(self, data_dir: Path, log_path: Path, **env: str) -> None:
        self.data_dir, self.log_path, self.env = data_dir, log_path, env
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = self.log_path.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_control_planes",
             "--data-dir", str(self.data_dir), "--poll", "0.3"],
            cwd=ROOT, env=service_env(**self.env), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, timeout=60)


@pytest.fixture
def manager(transactional_db, planes_dir, tmp_path, settings):
    """A control-plane manager on the test database; clusters created by the API are hosted.
    (Needs etcd and 1.36; a test that needs 1.37 asks for it.)"""
    require_binaries(("etcd", "v1.36"))
    settings.NVKE_DEFAULT_PROVIDER = "hosted"
    m = Manager(planes_dir, tmp_path / "manager.log")
    m.start()
    yield m
    m.stop()
    print(m.log_path.read_text()[-4000:])


@pytest.fixture
def hosted(transactional_db, planes_dir, tmp_path, settings, make_host):
    """A control-plane manager whose KWOKs renew Leases every second; clusters are hosted."""
    require_binaries(("etcd", "v1.36", "kwok"))
    settings.NVKE_DEFAULT_PROVIDER = "hosted"
    m = Manager(planes_dir, tmp_path / "manager.log", NVKE_KWOK_NODE_LEASE_S=str(LEASE_S))
    m.start()
    yield m
    m.stop()
    print(m.log_path.read_text()[-4000:])


def reconcile_until(cluster_id, predicate, timeout: float = 120, what: str = "cluster"):
    """Run the cluster reconciler (in this process, as a worker would, honouring the delay it
    asks for, at most 1 s) until ``predicate(cluster)`` holds; returns the cluster."""
    from clusters.models import Cluster
    from clusters.reconcile import reconcile_cluster

    deadline = time.monotonic() + timeout
    while True:
        delay = reconcile_cluster(cluster_id)
        cluster = Cluster.objects.get(pk=cluster_id)
        if predicate(cluster):
            return cluster
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out waiting for {what}: {cluster.phase} {cluster.conditions}"
            )
        time.sleep(min(delay if delay is not None else 0.3, 1.0))


def condition(cluster, type_: str) -> dict:
    return next((c for c in cluster.conditions if c["type"] == type_), {})


def create_cluster(client, name: str, version: str = "1.36"):
    """POST /clusters through the API; returns the cluster once RUNNING."""
    resp = client.post(
        "/api/v1/clusters",
        {"name": name, "kubernetes_version": version, "region": "us-east-1"},
        format="json",
    )
    assert resp.status_code == 202, resp.content
    cluster_id = resp.json()["target_id"]
    return reconcile_until(cluster_id, lambda c: c.phase == "RUNNING", what=f"{name} RUNNING")


def kubeconfig_of(client, cluster) -> str:
    resp = client.get(f"/api/v1/clusters/{cluster.id}/kubeconfig")
    assert resp.status_code == 200, resp.content
    return resp.content.decode()


def api_client(kubeconfig: str):
    """The official ``kubernetes`` client's ApiClient for a kubeconfig text."""
    from kubernetes import config

    return config.new_client_from_config_dict(yaml.safe_load(kubeconfig))


def kubectl(kubeconfig: str, tmp_path: Path, *args: str, version: str = "v1.36") -> str:
    """Run the built kubectl against ``kubeconfig``; returns stdout (raises on failure)."""
    from clusters.hosted import binaries

    path = tmp_path / f"kubeconfig-{time.monotonic_ns()}"
    path.write_text(kubeconfig)
    out = subprocess.run(
        [str(binaries.binary(version, "kubectl")), "--kubeconfig", str(path), *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def region(make_host):
    """A GPU host in us-east-1 (clusters need a region with hosts)."""
    return make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
