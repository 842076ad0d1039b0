"""A real Cluster API management cluster for tests, started from the binaries `make capi-bins`
builds (deploy/capi-testbed/): etcd, kube-apiserver, the Cluster API core manager, the kubeadm
bootstrap and control-plane managers and CAPD, whose in-memory backend (``DevCluster`` /
``DevMachine`` with ``backend.inMemory``) SIMULATES the machines and the workload clusters'
control planes (Cluster API's own scale tests do the same).

Everything listens on 127.0.0.1: etcd and the API servers on ports the OS picks, each
manager's webhook server (self-signed certificate from :func:`make_pki`) likewise. CAPD's
in-memory workload API servers take ports from 20000-30000 and a debug server on 19000
(CAPD's fixed defaults). A second kube-apiserver on the same etcd (another ``--etcd-prefix``)
plays the workload cluster for what the in-memory one cannot hold (server-side apply, the GPU
Operator's CRDs, evictions, PodDisruptionBudgets); NVKE writes the simulated machines' Nodes
there from their hosts' agent reports (``NVKE_CLUSTERAPI_SIMULATED_NODES``:
clusters/providers/clusterapi/simulated_nodes.py) and a KWOK against it keeps them Ready and
runs their pods, as for hosted clusters (:meth:`Testbed.start_kwok`).

Shapes: :class:`Testbed` ``.management_kubeconfig`` / ``.workload_kubeconfig`` are file
paths; ``.logs`` the folder of every process' output (printed when a start fails).
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from clusters.hosted import pki as hosted_pki

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "deploy" / "capi-testbed" / "build.sh"

#: (component, binary, CRD folder, webhook manifests) of the four managers
MANAGERS = (
    ("core", "capi-manager"),
    ("bootstrap", "kubeadm-bootstrap-manager"),
    ("controlplane", "kubeadm-control-plane-manager"),
    ("infrastructure", "capd-manager"),
)


class TestbedError(RuntimeError):
    """The testbed could not be built or started (message names the process and its log)."""


def bin_dir() -> Path:
    """Build the binaries if missing (deploy/capi-testbed/build.sh) and return their folder."""
    if shutil.which("go") is None and not os.environ.get("NVKE_CAPI_BIN_DIR"):
        raise TestbedError("the Go toolchain is not installed: `make capi-bins` cannot build")
    done = subprocess.run(
        ["bash", str(BUILD)], capture_output=True, text=True, timeout=3600, check=False
    )
    if done.returncode != 0:
        raise TestbedError(f"capi-bins failed:\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- certificates -------------------------------------------------------------------------------


@dataclass
class Pki:
    """PEM files in ``folder``: ca, apiserver (serving), admin (client, system:masters),
    webhook (serving 127.0.0.1), sa (service-account signing key pair)."""

    folder: Path

    def path(self, name: str) -> str:
        return str(self.folder / name)

    def pem(self, name: str) -> bytes:
        return (self.folder / name).read_bytes()


#: what the serving certificates (kube-apiserver, the managers' webhooks) answer to: the
#: loopback and the first address of ``--service-cluster-ip-range=10.0.0.0/24``
SERVER_NAMES = ("localhost", "127.0.0.1", "10.0.0.1")


def make_pki(folder: Path) -> Pki:
    """A CA and the certificates every process needs, made by the hosted control planes' own
    PKI (:mod:`clusters.hosted.pki`), written as ``<name>.crt`` / ``<name>.key`` PEM files."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = hosted_pki.new_ca("nvke-testbed-ca")
    pairs = {
        "ca": ca,
        "apiserver": hosted_pki.issue(ca, "kube-apiserver", server_names=SERVER_NAMES),
        "webhook": hosted_pki.issue(ca, "webhook", server_names=SERVER_NAMES),
        "admin": hosted_pki.issue(
            ca, "nvke-testbed-admin", organizations=("system:masters",), client=True
        ),
    }
    for name, pair in pairs.items():
        (folder / f"{name}.crt").write_text(pair.cert)
        (folder / f"{name}.key").write_text(pair.key)
    sa_key, sa_pub = hosted_pki.new_service_account_keys()
    (folder / "sa.key").write_text(sa_key)
    (folder / "sa.pub").write_text(sa_pub)
    return Pki(folder)


# --- processes ----------------------------------------------------------------------------------


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def _wait(what: str, check, proc: Process, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise TestbedError(f"{what} exited ({proc.popen.returncode}):\n{proc.tail()}")
        with contextlib.suppress(OSError, ssl.SSLError, ValueError):
            if check():
                return
        time.sleep(0.25)
    raise TestbedError(f"{what} did not become ready in {timeout:.0f} s:\n{proc.tail()}")


@dataclass
class Testbed:
    """A running management cluster (and the workload API server); stop with :meth:`stop`."""

    folder: Path
    bins: Path
    pki: Pki
    processes: list[Process] = field(default_factory=list)
    management_kubeconfig: str = ""
    workload_kubeconfig: str = ""
    management_url: str = ""
    workload_url: str = ""

    @property
    def logs(self) -> Path:
        return self.folder / "logs"

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Process:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        out = log.open("wb")
        popen = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=self.folder,
            start_new_session=True,
        )
        out.close()
        proc = Process(name, popen, log)
        self.processes.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.processes):
            with contextlib.suppress(Exception):
                proc.stop()
        self.processes.clear()

    # -- pieces ------------------------------------------------------------------------------

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.pki.path("ca.crt"))
        ctx.load_cert_chain(self.pki.path("admin.crt"), self.pki.path("admin.key"))
        return ctx

    def _ok(self, url: str) -> bool:
        with urllib.request.urlopen(url, context=self._ssl(), timeout=2) as resp:
            return resp.status == 200 and resp.read().strip() == b"ok"

    def start_etcd(self) -> str:
        client, peer = free_port(), free_port()
        url = f"http://127.0.0.1:{client}"
        proc = self.start(
            "etcd",
            [
                str(self.bins / "etcd"),
                "--data-dir",
                str(self.folder / "etcd"),
                "--listen-client-urls",
                url,
                "--advertise-client-urls",
                url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes",
                str(2 * 1024**3),
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                return b'"health":"true"' in resp.read()

        _wait("etcd", healthy, proc, 60)
        return url

    def start_apiserver(
        self, name: str, etcd: str, *, no_admission: tuple[str, ...] = ("ServiceAccount",)
    ) -> tuple[str, str]:
        """A kube-apiserver (etcd prefix ``/<name>``) without the admission plugins
        ``no_admission``; returns (url, kubeconfig path)."""
        port = free_port()
        url = f"https://127.0.0.1:{port}"
        pki = self.pki
        proc = self.start(
            name,
            [
                str(self.bins / "kube-apiserver"),
                f"--etcd-servers={etcd}",
                f"--etcd-prefix=/{name}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.folder / name}",
                f"--tls-cert-file={pki.path('apiserver.crt')}",
                f"--tls-private-key-file={pki.path('apiserver.key')}",
                f"--client-ca-file={pki.path('ca.crt')}",
                f"--service-account-key-file={pki.path('sa.pub')}",
                f"--service-account-signing-key-file={pki.path('sa.key')}",
                f"--service-account-issuer={url}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                "--authorization-mode=RBAC",
                # no kube-controller-manager runs: no "default" ServiceAccounts to admit with
                f"--disable-admission-plugins={','.join(no_admission)}",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                "--v=1",
            ],
        )
        _wait(name, lambda: self._ok(f"{url}/readyz"), proc, 180)
        kubeconfig = self.folder / f"{name}.kubeconfig"
        kubeconfig.write_text(self.kubeconfig_text(url, name))
        return url, str(kubeconfig)

    def start_kwok(self) -> Process:
        """The workload API server's KWOK, started as the hosted control-plane manager starts
        a hosted cluster's (:func:`clusters.hosted.processes.kwok_argv`; the binary and its
        Stages from ``deploy/k8s/build.sh kwok``, built when missing): it takes over the
        Nodes NVKE writes for the simulated machines (Ready, Lease heartbeats) and runs their
        pods. Ready once it posted Ready on a probe Node (then deleted)."""
        from django.conf import settings
        from kubernetes import client as k8s
        from kubernetes import config as k8s_config

        from clusters.hosted import binaries
        from clusters.hosted.processes import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE, kwok_argv

        if binaries.missing("kwok"):
            build = binaries.start_build(["kwok"], self.logs / "kwok-build.log")
            if build.wait(3600) != 0 or binaries.missing("kwok"):
                raise TestbedError(f"kwok could not be built: see {self.logs / 'kwok-build.log'}")
        proc = self.start(
            "kwok",
            kwok_argv(
                binary=binaries.binary("kwok", "kwok"),
                kubeconfig=self.workload_kubeconfig,
                stages=binaries.kwok_stages(),
                lease_duration_s=int(settings.NVKE_KWOK_NODE_LEASE_S),
            ),
        )
        core = k8s.CoreV1Api(
            k8s_config.new_client_from_config(config_file=self.workload_kubeconfig)
        )
        probe = "nvke-testbed-kwok-probe"
        core.create_node(
            {
                "metadata": {
                    "name": probe,
                    "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE},
                }
            }
        )

        def ready() -> bool:
            conditions = core.read_node(probe).status.conditions or []
            return any(c.type == "Ready" and c.status == "True" for c in conditions)

        _wait("kwok", ready, proc, 120)
        core.delete_node(probe)
        return proc

    def kubeconfig_text(self, url: str, name: str) -> str:
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": name,
                        "cluster": {
                            "server": url,
                            "certificate-authority": self.pki.path("ca.crt"),
                        },
                    }
                ],
                "users": [
                    {
                        "name": "admin",
                        "user": {
                            "client-certificate": self.pki.path("admin.crt"),
                            "client-key": self.pki.path("admin.key"),
                        },
                    }
                ],
                "contexts": [{"name": name, "context": {"cluster": name, "user": "admin"}}],
                "current-context": name,
            }
        )

    def install(self, component: str, webhook_port: int) -> None:
        """The component's CRDs (conversion through its webhook server when a CRD serves more
        than one version) and its webhook configurations, rewritten to ``127.0.0.1``."""
        from kubernetes import client as k8s
        from kubernetes import config as k8s_config

        api_client = k8s_config.new_client_from_config(config_file=self.management_kubeconfig)
        ext = k8s.ApiextensionsV1Api(api_client)
        adm = k8s.AdmissionregistrationV1Api(api_client)
        import base64

        ca = base64.b64encode(self.pki.pem("ca.crt")).decode()
        base = f"https://127.0.0.1:{webhook_port}"
        folder = self.bins.parent / "crds" / component
        for path in sorted(folder.glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            # the contract labels the releases' kustomizations add (config/crd/kustomization.yaml
            # ``labels``): Cluster API finds a provider's API version for a contract by them
            labels = crd["metadata"].setdefault("labels", {})
            for version in crd["spec"]["versions"]:
                if version["name"] in ("v1beta1", "v1beta2"):
                    labels[f"cluster.x-k8s.io/{version['name']}"] = version["name"]
            if len(crd["spec"]["versions"]) > 1:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {"url": f"{base}/convert", "caBundle": ca},
                        "conversionReviewVersions": ["v1", "v1beta1"],
                    },
                }
            ext.create_custom_resource_definition(crd)
        manifests = folder / "webhooks.yaml.txt"
        if not manifests.exists():
            return
        for doc in yaml.safe_load_all(manifests.read_text()):
            if not doc:
                continue
            doc = copy.deepcopy(doc)
            doc["metadata"] = {"name": f"{component}-{doc['metadata']['name']}"}
            for hook in doc.get("webhooks") or []:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"{base}{path}", "caBundle": ca}
            if doc["kind"] == "MutatingWebhookConfiguration":
                adm.create_mutating_webhook_configuration(doc)
            else:
                adm.create_validating_webhook_configuration(doc)

    def start_manager(self, component: str, binary: str, webhook_port: int) -> Process:
        certs = self.folder / "webhook-certs" / component  # watched: one folder each
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.pki.path("webhook.crt"), certs / "tls.crt")
        shutil.copy(self.pki.path("webhook.key"), certs / "tls.key")
        health = free_port()
        args = [
            str(self.bins / binary),
            f"--kubeconfig={self.management_kubeconfig}",
            "--leader-elect=false",
            f"--webhook-port={webhook_port}",
            f"--webhook-cert-dir={certs}",
            f"--health-addr=127.0.0.1:{health}",
            "--diagnostics-address=127.0.0.1:0",
            "--insecure-diagnostics",
            "--skip-crd-migration-phases=StorageVersionMigration,CleanupManagedFields",
            "--sync-period=1m",
            "--v=2",
        ]
        env = {"POD_IP": "127.0.0.1", "POD_NAMESPACE": "capi-system"}
        proc = self.start(component, args, env)

        def ready() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2) as resp:
                return resp.status == 200

        _wait(f"{component} manager", ready, proc, 120)
        return proc


def start_testbed(folder: Path | None = None) -> Testbed:
    """Build (if needed) and start everything; the caller must :meth:`Testbed.stop` it."""
    bins = bin_dir() / "bin"
    folder = folder or Path(tempfile.mkdtemp(prefix="nvke-capi-"))
    bed = Testbed(folder=folder, bins=bins, pki=make_pki(folder / "pki"))
    try:
        etcd = bed.start_etcd()
        bed.management_url, bed.management_kubeconfig = bed.start_apiserver("management", etcd)
        # nor does a kube-controller-manager lift node.kubernetes.io/not-ready once KWOK
        # posts a Node Ready: the workload API server does not add it
        bed.workload_url, bed.workload_kubeconfig = bed.start_apiserver(
            "workload", etcd, no_admission=("ServiceAccount", "TaintNodesByCondition")
        )
        bed.start_kwok()
        ports = {component: free_port() for component, _ in MANAGERS}
        for component, _ in MANAGERS:
            bed.install(component, ports[component])
        for component, binary in MANAGERS:
            bed.start_manager(component, binary, ports[component])
    except BaseException:
        bed.stop()
        raise
    return bed
