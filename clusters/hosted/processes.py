"""The files and command lines of one hosted control plane's three processes.

kube-apiserver runs as kubeadm runs it (``Node,RBAC`` authorization, the default admission
plugins plus ``NodeRestriction``, bootstrap tokens, service-account keys of its own, Secrets
encrypted at rest with the cluster's key) on 127.0.0.1:<port>, storing in the shared etcd
under the cluster's prefix with the cluster's own etcd credential. The controller-manager and
scheduler talk to it with their own client certificates (kubeconfig files) and serve nothing
(``--secure-port=0``: one port per cluster; kube-apiserver's ``/metrics`` is the scrape
target). Files live in ``<data dir>/control-planes/<cluster id>/``, secrets mode 0600.

Memory: kube-apiserver runs with ``GOGC=NVKE_HOSTED_APISERVER_GOGC`` (:func:`environment`);
what each process holds and why is in docs/concepts/hosted-control-planes.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from .etcd import prefix, write_secret
from .pki import SERVICE_CIDR, ControlPlanePki, encryption_config, issue, kubeconfig

#: the three processes of a control plane, in start order
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
#: the kubelet simulator of the cluster's simulated hosts: one per cluster, started once its
#: kube-apiserver is ready (it serves one API); it manages only the Nodes NVKE annotates so
KWOK = "kwok"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"


@dataclass(frozen=True)
class EtcdEndpoint:
    """How one cluster's kube-apiserver reaches the datastore: URL, CA file, and the cluster's
    own client certificate and key files."""

    url: str
    ca_file: Path
    cert_file: Path
    key_file: Path


@dataclass(frozen=True)
class ControlPlaneFiles:
    """The files of one control plane under ``home``."""

    home: Path

    def path(self, name: str) -> Path:
        return self.home / name

    def write(self, *, name: str, port: int, pki: ControlPlanePki) -> None:
        """Write every file (idempotent: the same inputs give the same files)."""
        server = f"https://127.0.0.1:{port}"
        files = {
            "ca.crt": pki.ca.cert,
            "ca.key": pki.ca.key,  # the controller-manager signs CSRs (kubelet certificates)
            "apiserver.crt": pki.apiserver.cert,
            "apiserver.key": pki.apiserver.key,
            "sa.key": pki.service_account_key,
            "sa.pub": pki.service_account_pub,
            "encryption.yaml": encryption_config(pki.encryption_key),
            "monitoring.crt": pki.monitoring.cert,
            "monitoring.key": pki.monitoring.key,
            "controller-manager.kubeconfig": kubeconfig(
                name=name, server=server, ca_cert=pki.ca.cert, client=pki.controller_manager
            ),
            "scheduler.kubeconfig": kubeconfig(
                name=name, server=server, ca_cert=pki.ca.cert, client=pki.scheduler
            ),
        }
        for filename, text in files.items():
            path = self.path(filename)
            if not path.exists() or path.read_text() != text:
                write_secret(path, text)
        if not self.path("kwok.kubeconfig").exists():
            # KWOK stands in for every simulated host's kubelet with one identity, so the Node
            # authorizer (one node per kubelet credential) cannot scope it: it gets NVKE's own
            # group. Issued here, from the cluster's CA, never handed out.
            write_secret(
                self.path("kwok.kubeconfig"),
                kubeconfig(
                    name=name,
                    server=server,
                    ca_cert=pki.ca.cert,
                    client=issue(
                        pki.ca, "nvke:kwok", organizations=("system:masters",), client=True
                    ),
                ),
            )


def kwok_argv(
    *, binary: Path, kubeconfig: Path | str, stages: Path, lease_duration_s: int
) -> list[str]:
    """KWOK's command line against the API of ``kubeconfig`` (a hosted cluster's
    ``kwok.kubeconfig``; the Cluster API test bed's workload API server): the Stages file the
    builder copied from KWOK's module, the Nodes annotated ``kwok.x-k8s.io/node=fake`` only,
    Leases of ``lease_duration_s`` (renewed every quarter of it: the heartbeats), no server of
    its own."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={stages}",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}",
        f"--node-lease-duration-seconds={lease_duration_s}",
        "--cidr=10.244.0.0/16",
    ]


def environment(component: str) -> dict[str, str]:
    """The variables ``component``'s process gets on top of its parent's environment (a pod's
    ``env``): ``{"GOGC": "25"}`` for kube-apiserver, ``{}`` for the others.

    GOGC is how far (percent) Go lets the heap grow over the live heap before it collects.
    An idle small cluster's kube-apiserver holds about 85 MB live; at Go's default (100) it
    stays near 190 MiB anonymous resident, at 25 near 130 MiB, with no idle CPU to measure
    (docs/concepts/hosted-control-planes.md has the figures). The controller-manager (about
    20 MB live) and the scheduler (about 6 MB) keep Go's default: a lower GOGC saved nothing
    measurable there. Raises ValueError when ``NVKE_HOSTED_APISERVER_GOGC`` is below 1."""
    if component != "kube-apiserver":
        return {}
    gogc = int(settings.NVKE_HOSTED_APISERVER_GOGC)
    if gogc < 1:
        raise ValueError(
            f"NVKE_HOSTED_APISERVER_GOGC must be 1 or more (Go's default: 100), not {gogc}"
        )
    return {"GOGC": str(gogc)}


def argv(
    component: str,
    *,
    binary: Path,
    cluster_id: str,
    cluster_name: str,
    port: int,
    files: ControlPlaneFiles,
    etcd: EtcdEndpoint,
) -> list[str]:
    """The command line of ``component`` (one of :data:`COMPONENTS`)."""
    f = files.path
    if component == "kube-apiserver":
        return [
            str(binary),
            "--advertise-address=127.0.0.1",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--allow-privileged=true",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--enable-bootstrap-token-auth=true",
            f"--client-ca-file={f('ca.crt')}",
            f"--tls-cert-file={f('apiserver.crt')}",
            f"--tls-private-key-file={f('apiserver.key')}",
            f"--etcd-servers={etcd.url}",
            f"--etcd-cafile={etcd.ca_file}",
            f"--etcd-certfile={etcd.cert_file}",
            f"--etcd-keyfile={etcd.key_file}",
            f"--etcd-prefix={prefix(cluster_id)}",
            # the apiserver's compaction key is outside every prefix: etcd compacts itself
            "--etcd-compaction-interval=0",
            f"--encryption-provider-config={f('encryption.yaml')}",
            f"--service-account-issuer=https://127.0.0.1:{port}",
            f"--service-account-key-file={f('sa.pub')}",
            f"--service-account-signing-key-file={f('sa.key')}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
            # several apiservers share 127.0.0.1 and a loopback address is no valid endpoint
            # of the `kubernetes` Service; its endpoints are NVKE's to publish
            "--endpoint-reconciler-type=none",
            "--profiling=false",
        ]
    if component == "kube-controller-manager":
        return _kubeconfig_client_argv(
            binary,
            f("controller-manager.kubeconfig"),
            f"--cluster-name={cluster_name}",
            f"--cluster-signing-cert-file={f('ca.crt')}",
            f"--cluster-signing-key-file={f('ca.key')}",
            f"--root-ca-file={f('ca.crt')}",
            f"--service-account-private-key-file={f('sa.key')}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--use-service-account-credentials=true",
            "--controllers=*,bootstrapsigner,tokencleaner",
        )
    if component == "kube-scheduler":
        return _kubeconfig_client_argv(binary, f("scheduler.kubeconfig"))
    raise ValueError(f"unknown control-plane component {component!r}")


def _kubeconfig_client_argv(binary: Path, kubeconfig_file: Path, *flags: str) -> list[str]:
    """The command line the controller-manager and the scheduler share: one kubeconfig file for
    the API, its authentication and authorization; no server of their own (``--secure-port=0``),
    no leader election (one of each per cluster), then the component's ``flags``."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig_file}",
        f"--authentication-kubeconfig={kubeconfig_file}",
        f"--authorization-kubeconfig={kubeconfig_file}",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        "--leader-elect=false",
        *flags,
        "--profiling=false",
    ]
