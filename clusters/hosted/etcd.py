"""The one etcd every hosted control plane shares, with a key prefix and a credential per cluster.

Datastore choice (docs/concepts/hosted-control-planes.md says why): etcd, built from
``go.etcd.io/etcd/server/v3`` by ``deploy/k8s/build.sh``, TLS only, ``--client-cert-auth`` and
etcd authentication enabled. Each cluster's kube-apiserver stores under ``/nvke/<cluster id>/``
(``--etcd-prefix``) and authenticates with its own client certificate, whose common name
``nvke-<cluster id>`` is an etcd user holding one role: readwrite on that prefix and nothing
else. A credential used on another cluster's keys is refused by etcd itself
(``etcdserver: permission denied``). NVKE administers etcd as ``root`` (a client certificate
with CN ``root``) through ``etcdctl``, built from the same module.

Files (under ``<data dir>/etcd/``): ``data/`` (etcd's), ``pki/`` (CA, server and root client
certificates), ``clients/<cluster id>.{crt,key}``, ``ports.json`` (client and peer ports,
chosen once and kept).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import binaries, pki

ROOT_USER = "root"


class DatastoreError(RuntimeError):
    """etcd (or etcdctl) failed; the message carries etcdctl's own words."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_secret(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def prefix(cluster_id: str) -> str:
    """The key prefix of a cluster's objects (kube-apiserver's ``--etcd-prefix``)."""
    return f"/nvke/{cluster_id}"


def user(cluster_id: str) -> str:
    """The etcd user (and role) of a cluster: its client certificate's common name."""
    return f"nvke-{cluster_id}"


@dataclass
class Etcd:
    """The shared etcd under ``home`` (``<data dir>/etcd``)."""

    home: Path

    @property
    def pki_dir(self) -> Path:
        return self.home / "pki"

    @property
    def ca_file(self) -> Path:
        return self.pki_dir / "ca.crt"

    def ports(self) -> dict[str, int]:
        """``{"client": p, "peer": q}``: chosen on first use, then the same on every start."""
        path = self.home / "ports.json"
        if path.exists():
            return json.loads(path.read_text())
        ports = {"client": free_port(), "peer": free_port()}
        self.home.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(ports))
        return ports

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.ports()['client']}"

    def ensure_pki(self) -> None:
        """The etcd CA, server certificate and root client certificate (once)."""
        if (self.pki_dir / "root.key").exists():
            return
        ca = pki.new_ca("nvke-etcd-ca")
        server = pki.issue(ca, "nvke-etcd", server_names=("127.0.0.1", "localhost"), client=True)
        root = pki.issue(ca, ROOT_USER, client=True)
        for name, pair in (("ca", ca), ("server", server), ("root", root)):
            write_secret(self.pki_dir / f"{name}.crt", pair.cert)
            write_secret(self.pki_dir / f"{name}.key", pair.key)

    def argv(self, etcd_binary: Path) -> list[str]:
        """etcd's command line: TLS, client-certificate authentication, periodic compaction
        (kube-apiservers run with ``--etcd-compaction-interval=0``: their compaction key lies
        outside any cluster's prefix)."""
        ports = self.ports()
        peer = f"http://127.0.0.1:{ports['peer']}"
        p = self.pki_dir
        return [
            str(etcd_binary),
            "--name=nvke",
            f"--data-dir={self.home / 'data'}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=nvke={peer}",
            f"--cert-file={p / 'server.crt'}",
            f"--key-file={p / 'server.key'}",
            f"--trusted-ca-file={p / 'ca.crt'}",
            "--client-cert-auth=true",
            "--auto-compaction-mode=periodic",
            "--auto-compaction-retention=1h",
            "--log-level=warn",
        ]

    def etcdctl(self, *args: str, cert: str = ROOT_USER, timeout: float = 30) -> str:
        """Run etcdctl as ``cert`` (``root``, or a cluster id: that cluster's credential);
        returns its stdout. Raises DatastoreError with etcdctl's message."""
        tool = binaries.binary("etcd", "etcdctl")
        if tool is None:
            raise DatastoreError("etcdctl is not built (deploy/k8s/build.sh etcd)")
        if cert == ROOT_USER:
            crt, key = self.pki_dir / "root.crt", self.pki_dir / "root.key"
        else:
            crt, key = self.client_files(cert)
        out = subprocess.run(
            [
                str(tool),
                f"--endpoints={self.url}",
                f"--cacert={self.ca_file}",
                f"--cert={crt}",
                f"--key={key}",
                "--command-timeout=10s",
                *args,
            ],
            capture_output=True,
            encoding="utf-8",
            errors="replace",  # values are bytes (a Secret's is ciphertext)
            timeout=timeout,
        )
        if out.returncode != 0:
            raise DatastoreError(f"etcdctl {' '.join(args[:2])}: {out.stderr.strip()}")
        return out.stdout

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until etcd answers ``endpoint health`` (DatastoreError after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.etcdctl("endpoint", "health", timeout=10)
                return
            except (DatastoreError, subprocess.TimeoutExpired) as exc:
                if time.monotonic() > deadline:
                    raise DatastoreError(f"etcd did not become healthy: {exc}") from exc
                time.sleep(0.2)

    def ensure_auth(self) -> None:
        """Authentication on, with ``root`` (once; a marker file remembers it)."""
        marker = self.home / "auth-enabled"
        if marker.exists():
            return
        users = self.etcdctl("user", "list")
        if ROOT_USER not in users.split():
            self.etcdctl("user", "add", ROOT_USER, "--no-password")
            self.etcdctl("user", "grant-role", ROOT_USER, "root")
        self.etcdctl("auth", "enable")
        marker.write_text("1\n")

    def client_files(self, cluster_id: str) -> tuple[Path, Path]:
        """The (certificate, key) files of a cluster's etcd credential."""
        base = self.home / "clients" / cluster_id
        return base.with_suffix(".crt"), base.with_suffix(".key")

    def endpoint(self, cluster_id: str):
        """How the cluster's kube-apiserver reaches this etcd (its own credential)."""
        from .processes import EtcdEndpoint

        crt, key = self.client_files(cluster_id)
        return EtcdEndpoint(self.url, self.ca_file, crt, key)

    def ensure_tenant(self, cluster_id: str) -> tuple[Path, Path]:
        """A cluster's etcd user, role (readwrite on its prefix only) and client certificate;
        idempotent. Returns the certificate and key files."""
        crt, key = self.client_files(cluster_id)
        name = user(cluster_id)
        if not key.exists():
            ca = pki.KeyPair(self.ca_file.read_text(), (self.pki_dir / "ca.key").read_text())
            pair = pki.issue(ca, name, client=True)
            write_secret(crt, pair.cert)
            write_secret(key, pair.key)
        if name not in self.etcdctl("user", "list").split():
            if name not in self.etcdctl("role", "list").split():
                self.etcdctl("role", "add", name)
            self.etcdctl(
                "role", "grant-permission", name, "readwrite", prefix(cluster_id) + "/", "--prefix"
            )
            self.etcdctl("user", "add", name, "--no-password")
            self.etcdctl("user", "grant-role", name, name)
        return crt, key

    def remove_tenant(self, cluster_id: str) -> None:
        """Delete a cluster's keys, etcd user and role and its client certificate files;
        idempotent."""
        self.etcdctl("del", prefix(cluster_id) + "/", "--prefix")
        name = user(cluster_id)
        if name in self.etcdctl("user", "list").split():
            self.etcdctl("user", "delete", name)
        if name in self.etcdctl("role", "list").split():
            self.etcdctl("role", "delete", name)
        for path in self.client_files(cluster_id):
            path.unlink(missing_ok=True)

    def count_keys(self, cluster_id: str) -> int:
        """How many keys a cluster has in etcd (as root)."""
        out = self.etcdctl("get", prefix(cluster_id) + "/", "--prefix", "--keys-only")
        return len([line for line in out.splitlines() if line.strip()])

    def tenants(self) -> list[str]:
        """Cluster ids that have an etcd user."""
        return [
            u.removeprefix("nvke-")
            for u in self.etcdctl("user", "list").split()
            if u.startswith("nvke-")
        ]
