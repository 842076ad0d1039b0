"""The control-plane manager: the one owner of every hosted control plane's processes.

Celery workers only write desired state (:class:`clusters.models.HostedControlPlane` rows);
this loop, run by ``manage.py run_control_planes`` (a supervised process of ``make run``),
makes the machine match it:

- it runs the shared etcd (:mod:`clusters.hosted.etcd`) as its child;
- for each row that should run: waits for the version's binaries (starting
  ``deploy/k8s/build.sh`` when they are missing, and saying so in the row's message), writes
  the files, ensures the cluster's etcd user, starts kube-apiserver, kube-controller-manager and
  kube-scheduler as its children on the row's port, and marks the row ready once
  kube-apiserver's ``/readyz`` answers ``ok`` (``running_version`` from ``/version``); then
  starts the cluster's KWOK (the kubelets of its simulated hosts: it keeps the Nodes NVKE
  writes alive), supervised the same way, stopped with the others;
- a child that exits is seen at once by a thread blocked in ``wait()``: the row and the
  cluster's ``ControlPlaneReady`` go False with the exit status in the message, and the process
  is started again after a backoff (1, 2, 4 ... 30 s; back to 1 s after 60 s of running);
- a row at a version ``deploy/k8s`` pins no binaries of gets that said in its message, once,
  and nothing started (the provider fails the cluster's operation for it);
- a row whose version changed (an upgrade) gets its processes stopped and started again on the
  new binaries, with the same etcd prefix (its data);
- a row marked ``deleted`` (or gone from the database) gets its processes stopped, its etcd
  keys, user and role and its files removed, then ``state=deleted``;
- SIGTERM / SIGINT stop every child (they also get SIGTERM if the manager dies:
  ``PR_SET_PDEATHSIG``).

Nothing here decides what should run; a second manager started on the same data folder would
fight the first, so ``make run`` runs exactly one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from django.conf import settings
from django.db import close_old_connections, connection

from nvke import crypto
from nvke.embedded.procutil import set_parent_death_signal

from ..models import HostedControlPlane
from . import binaries, status
from .etcd import Etcd
from .pki import ControlPlanePki
from .processes import COMPONENTS, KWOK, ControlPlaneFiles, argv, environment, kwok_argv

log = logging.getLogger(__name__)

BACKOFF_S = (1.0, 30.0)  # first restart delay, cap
STABLE_S = 60.0  # a process that ran this long restarts its backoff from the first delay
STOP_TIMEOUT_S = 15.0
READY_POLL_S = 5.0  # how often a ready apiserver's /readyz is checked again
RSS_POLL_S = 10.0
ORPHAN_SWEEP_S = 30.0
State = HostedControlPlane.State


def _preexec() -> None:
    set_parent_death_signal(signal.SIGTERM)


def describe_exit(returncode: int) -> str:
    """``-9`` -> ``"killed by SIGKILL"``, ``1`` -> ``"exit status 1"``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


@dataclass
class Child:
    """One supervised process (a control-plane component or etcd)."""

    name: str
    argv: list[str]
    log_path: Path
    #: variables set on top of the manager's environment
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    failures: int = 0  # consecutive short runs (backoff exponent)
    not_before: float = 0.0
    stopping: bool = False
    on_exit: object = None  # callable(child, returncode) run in the waiter thread

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start it (from the manager's main thread: the parent-death signal is per thread)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = self.log_path.open("ab")
        self.stopping = False
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env} if self.env else None,
            preexec_fn=_preexec,
        )
        log_file.close()
        self.started_at = time.monotonic()
        proc = self.proc
        threading.Thread(
            target=self._wait, args=(proc,), name=f"wait-{self.name}", daemon=True
        ).start()

    def _wait(self, proc: subprocess.Popen) -> None:
        returncode = proc.wait()
        if self.stopping or proc is not self.proc:
            return
        ran = time.monotonic() - self.started_at
        self.failures = 0 if ran >= STABLE_S else self.failures + 1
        self.restarts += 1
        self.not_before = time.monotonic() + self.backoff()
        if self.on_exit is not None:
            self.on_exit(self, returncode)

    def backoff(self) -> float:
        """Seconds before the next start: 1, 2, 4 ... 30."""
        first, cap = BACKOFF_S
        return min(first * 2 ** max(self.failures - 1, 0), cap)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` s; returns once it has exited."""
        self.stopping = True
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass
class ControlPlane:
    """What the manager holds for one cluster."""

    cluster_id: str
    files: ControlPlaneFiles
    target: str = ""  # the build target its processes run ("v1.36")
    children: dict[str, Child] = field(default_factory=dict)
    ready: bool = False
    last_ready_check: float = 0.0
    last_rss: float = 0.0

    def stop(self) -> None:
        for name in (KWOK, *reversed(COMPONENTS)):
            if name in self.children:
                self.children[name].stop()
        self.children.clear()
        self.ready = False


class ControlPlaneManager:
    """Runs every hosted control plane of the database it is connected to (see module doc).

    ``data_dir``: the folder of the etcd and the control planes' files;
    ``poll_s``: seconds between looks at the desired state."""

    def __init__(self, data_dir: Path, *, poll_s: float = 1.0) -> None:
        self.data_dir = Path(data_dir)
        self.poll_s = poll_s
        self.etcd = Etcd(self.data_dir / "etcd")
        self.etcd_child: Child | None = None
        self.planes: dict[str, ControlPlane] = {}
        self.stop_event = threading.Event()
        self.build: subprocess.Popen | None = None
        self.last_sweep = 0.0
        #: (cluster id, target) of rows at a version NVKE builds no binaries of, logged once
        self.unbuildable: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ main loop
    def run(self) -> None:
        """Until :meth:`request_stop` (or SIGTERM/SIGINT in the command): look, act, sleep."""
        try:
            while not self.stop_event.is_set():
                try:
                    self.sync()
                except Exception:  # one bad pass (a DB restart) must not end the manager
                    log.exception("control-plane manager pass failed")
                    close_old_connections()
                self.stop_event.wait(self.poll_s)
        finally:
            self.shutdown()

    def request_stop(self) -> None:
        self.stop_event.set()

    def shutdown(self) -> None:
        """Stop every control plane (SIGTERM to all at once, then wait), then etcd."""
        children = [c for p in self.planes.values() for c in p.children.values()]
        for child in children:
            child.stopping = True
            if child.running:
                child.proc.terminate()
        for plane in list(self.planes.values()):
            plane.stop()
        if self.etcd_child is not None:
            self.etcd_child.stop()
        if self.build is not None and self.build.poll() is None:
            self.build.terminate()

    def sync(self) -> None:
        """One pass over the desired state."""
        close_old_connections()
        rows = list(HostedControlPlane.objects.select_related("cluster"))
        wanted = {str(r.pk) for r in rows if r.desired == HostedControlPlane.Desired.RUNNING}
        for cluster_id in list(self.planes):
            if cluster_id not in wanted:
                self.planes.pop(cluster_id).stop()
        if not rows and self.etcd_child is None:
            return  # nothing hosted: no etcd either (and no build)
        if not self._ensure_etcd(rows):
            return
        for row in rows:
            if row.desired == HostedControlPlane.Desired.DELETED:
                if row.state != State.DELETED:
                    self._teardown(str(row.pk))
                    status.record(
                        row.pk,
                        state=State.DELETED,
                        ready=False,
                        pids={},
                        rss_bytes=0,
                        message="control plane deleted",
                    )
                continue
            try:
                self._ensure(row)
            except Exception as exc:
                log.exception("control plane %s", row.pk)
                status.record(row.pk, ready=False, message=f"control-plane manager: {exc}")
        self._write_scrape_config(rows)
        if time.monotonic() - self.last_sweep > ORPHAN_SWEEP_S:
            self.last_sweep = time.monotonic()
            self._sweep_orphans({str(r.pk) for r in rows})

    # ------------------------------------------------------------------ etcd
    def _ensure_etcd(self, rows: list[HostedControlPlane]) -> bool:
        missing = binaries.missing("etcd")
        if missing:
            self._build(["etcd"])
            progress = binaries.build_progress() or "starting the build"
            for row in rows:
                if row.desired == HostedControlPlane.Desired.RUNNING:
                    status.record(
                        row.pk,
                        state=State.WAITING_FOR_BINARIES,
                        ready=False,
                        message=f"waiting for the etcd binaries to be built ({progress})",
                    )
            return False
        child = self.etcd_child
        if child is None:
            self.etcd.ensure_pki()
            child = Child(
                "etcd",
                self.etcd.argv(binaries.binary("etcd", "etcd")),
                self.data_dir / "logs" / "etcd.log",
            )
            self.etcd_child = child
        if not child.running:
            if time.monotonic() < child.not_before:
                return False
            child.start()
            self.etcd.wait_healthy()
            self.etcd.ensure_auth()
        return True

    # ------------------------------------------------------------------ one control plane
    def _ensure(self, row: HostedControlPlane) -> None:
        cluster_id = str(row.pk)
        target = binaries.target_of(row.version)
        if target not in binaries.supported_targets():
            self._unbuildable(row, target)
            return
        missing = binaries.missing(target)
        if missing:
            self._build([target])
            progress = binaries.build_progress() or "starting the build"
            status.record(
                row.pk,
                state=State.WAITING_FOR_BINARIES,
                ready=False,
                message=f"waiting for the Kubernetes {target[1:]} binaries "
                f"({', '.join(missing)}) to be built: {progress}",
            )
            return
        plane = self.planes.get(cluster_id)
        if plane is None:
            plane = ControlPlane(
                cluster_id, ControlPlaneFiles(self.data_dir / "control-planes" / cluster_id)
            )
            self.planes[cluster_id] = plane
        if plane.target and plane.target != target:  # an upgrade: same data, new binaries
            log.info("control plane %s: %s -> %s", cluster_id, plane.target, target)
            plane.stop()
            status.record(
                row.pk,
                state=State.STARTING,
                ready=False,
                message=f"restarting on Kubernetes {target[1:]}",
            )
        if not plane.children:
            pki = ControlPlanePki.from_dict(json.loads(crypto.decrypt(row.pki_encrypted)))
            plane.files.write(name=row.cluster.name, port=row.port, pki=pki)
            self.etcd.ensure_tenant(cluster_id)
            plane.target = target
            for name in COMPONENTS:
                child = Child(
                    name,
                    argv(
                        name,
                        binary=binaries.binary(target, name),
                        cluster_id=cluster_id,
                        cluster_name=row.cluster.name,
                        port=row.port,
                        files=plane.files,
                        etcd=self.etcd.endpoint(cluster_id),
                    ),
                    plane.files.path(f"{name}.log"),
                    env=environment(name),
                )
                child.on_exit = lambda c, rc, p=plane: self._exited(p, c, rc)
                plane.children[name] = child
            status.record(
                row.pk,
                state=State.STARTING,
                ready=False,
                message=f"starting Kubernetes {target[1:]}",
            )
        for name, child in plane.children.items():
            if name != KWOK and not child.running and time.monotonic() >= child.not_before:
                child.start()
        self._observe(plane, row)
        self._ensure_kwok(plane, row)

    def _unbuildable(self, row: HostedControlPlane, target: str) -> None:
        """A row at a version ``deploy/k8s`` pins no binaries of (asked for before the API
        refused such versions, or the operator removed one): said in its message and logged
        once, nothing started or stopped (the provider fails the cluster's operation for it,
        non-retryable; processes that already run are left as they are). A trial saw a
        traceback a second and the operation RUNNING until its wait ran out."""
        minors = ", ".join(binaries.kubernetes_minors()) or "none"
        message = (
            f"NVKE builds no Kubernetes binaries for {target[1:]} (deploy/k8s pins {minors}): "
            "this control plane cannot be started"
        )
        if (str(row.pk), target) not in self.unbuildable:
            self.unbuildable.add((str(row.pk), target))
            log.warning("control plane %s: %s", row.pk, message)
        if row.message != message:
            status.record(row.pk, message=message)

    def _ensure_kwok(self, plane: ControlPlane, row: HostedControlPlane) -> None:
        """The cluster's KWOK (the kubelets of its simulated hosts): started once its
        kube-apiserver is ready, supervised as the other processes (restarted after the same
        backoff, stopped with them). Its binary missing starts the build; the control plane
        stays ready meanwhile (no node of the cluster comes up until KWOK runs)."""
        if not plane.ready:
            return
        child = plane.children.get(KWOK)
        if child is None:
            if binaries.missing("kwok"):
                self._build(["kwok"])
                return
            child = Child(
                KWOK,
                kwok_argv(
                    binary=binaries.binary("kwok", "kwok"),
                    kubeconfig=plane.files.path("kwok.kubeconfig"),
                    stages=binaries.kwok_stages(),
                    lease_duration_s=int(settings.NVKE_KWOK_NODE_LEASE_S),
                ),
                plane.files.path(f"{KWOK}.log"),
            )
            child.on_exit = lambda c, rc, p=plane: self._kwok_exited(p, c, rc)
            plane.children[KWOK] = child
        if not child.running and time.monotonic() >= child.not_before:
            child.start()
            status.record(
                row.pk, pids={n: c.proc.pid for n, c in plane.children.items() if c.running}
            )

    def _kwok_exited(self, plane: ControlPlane, child: Child, returncode: int) -> None:
        """KWOK exited on its own (waiter thread): the control plane is still ready (its API
        answers); the Nodes' Leases stop being renewed until the restart."""
        log.warning(
            "control plane %s: kwok exited (%s); restarting in %.0f s (restart %d)",
            plane.cluster_id,
            describe_exit(returncode),
            child.backoff(),
            child.restarts,
        )

    def _observe(self, plane: ControlPlane, row: HostedControlPlane) -> None:
        now = time.monotonic()
        apiserver = plane.children["kube-apiserver"]
        if not all(c.running for c in plane.children.values()):
            return  # an exit was recorded by the waiter thread; wait for the restart
        if plane.ready and now - plane.last_ready_check < READY_POLL_S:
            pass
        else:
            plane.last_ready_check = now
            ok, detail = readyz(row.port, row.ca_cert)
            if ok and not plane.ready:
                version = server_version(row.port, row.ca_cert)
                plane.ready = True
                restarts = sum(c.restarts for c in plane.children.values())
                status.record(
                    row.pk,
                    state=State.RUNNING,
                    ready=True,
                    running_version=version,
                    message=f"kube-apiserver {version} is ready",
                    restarts=restarts,
                    pids={n: c.proc.pid for n, c in plane.children.items() if c.proc},
                )
                status.publish_ready(row.pk, True, "Ready", "control plane is ready")
            elif not ok and plane.ready:
                plane.ready = False
                message = f"kube-apiserver /readyz: {detail}"
                status.record(row.pk, state=State.STARTING, ready=False, message=message)
                status.publish_ready(row.pk, False, "NotReady", message)
            elif (
                not ok
                and row.message != f"kube-apiserver /readyz: {detail}"
                and (now - apiserver.started_at > 5)
            ):
                status.record(row.pk, message=f"kube-apiserver /readyz: {detail}")
        if now - plane.last_rss > RSS_POLL_S:
            plane.last_rss = now
            rss = 0
            # the control plane's cost: KWOK stands in for the hosts' kubelets, not counted
            for c in (c for n, c in plane.children.items() if n != KWOK):
                with contextlib.suppress(psutil.Error, AttributeError):
                    rss += psutil.Process(c.proc.pid).memory_info().rss
            status.record(row.pk, rss_bytes=rss)

    def _exited(self, plane: ControlPlane, child: Child, returncode: int) -> None:
        """A component exited on its own (waiter thread): not ready, at once, with why."""
        plane.ready = False
        message = (
            f"{child.name} exited ({describe_exit(returncode)}); restarting in "
            f"{child.backoff():.0f} s (restart {child.restarts})"
        )
        log.warning("control plane %s: %s", plane.cluster_id, message)
        try:
            status.record(
                plane.cluster_id,
                state=State.RESTARTING,
                ready=False,
                message=message,
                restarts=sum(c.restarts for c in plane.children.values()),
            )
            status.publish_ready(plane.cluster_id, False, "ProcessExited", message)
        finally:
            connection.close()

    def _teardown(self, cluster_id: str) -> None:
        plane = self.planes.pop(cluster_id, None)
        if plane is not None:
            plane.stop()
        self.etcd.remove_tenant(cluster_id)
        shutil.rmtree(self.data_dir / "control-planes" / cluster_id, ignore_errors=True)

    def _sweep_orphans(self, known: set[str]) -> None:
        """etcd users and file folders of clusters the database no longer has (a database
        reset, a row removed by hand): removed."""
        for cluster_id in self.etcd.tenants():
            if cluster_id not in known:
                log.info("removing orphaned control plane data of %s", cluster_id)
                self._teardown(cluster_id)
        folder = self.data_dir / "control-planes"
        if folder.is_dir():
            for path in folder.iterdir():
                if path.name not in known and path.name not in self.planes:
                    shutil.rmtree(path, ignore_errors=True)

    def _write_scrape_config(self, rows: list[HostedControlPlane]) -> None:
        """``<data dir>/prometheus.yml``: one Prometheus scrape job per running control plane
        (its kube-apiserver's ``/metrics``, trusting its CA, as ``system:monitoring``)."""
        jobs = []
        for row in rows:
            if row.desired != HostedControlPlane.Desired.RUNNING or str(row.pk) not in self.planes:
                continue
            files = self.planes[str(row.pk)].files
            jobs.append(
                {
                    "job_name": f"kube-apiserver-{row.pk}",
                    "scheme": "https",
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{row.port}"],
                            "labels": {
                                "cluster_id": str(row.pk),
                                "cluster": row.cluster.name,
                                "tenant_id": str(row.cluster.tenant_id),
                            },
                        }
                    ],
                    "tls_config": {
                        "ca_file": str(files.path("ca.crt")),
                        "cert_file": str(files.path("monitoring.crt")),
                        "key_file": str(files.path("monitoring.key")),
                    },
                }
            )
        text = json.dumps({"scrape_configs": jobs}, indent=1)  # JSON is YAML
        path = self.data_dir / "prometheus.yml"
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def _build(self, targets: list[str]) -> None:
        if self.build is not None and self.build.poll() is None:
            return
        log.info("building Kubernetes binaries: %s", " ".join(targets))
        self.build = binaries.start_build(
            ["etcd", *[t for t in targets if t != "etcd"]], self.data_dir / "logs" / "build.log"
        )


def _ssl(ca_cert: str) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca_cert)


def readyz(port: int, ca_cert: str, timeout: float = 3.0) -> tuple[bool, str]:
    """(whether kube-apiserver on 127.0.0.1:``port`` answers ``/readyz`` with 200, and its
    words otherwise)."""
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/readyz", context=_ssl(ca_cert), timeout=timeout
        ) as resp:
            return resp.status == 200, resp.read().decode(errors="replace")[:200]
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        failed = [line for line in body.splitlines() if "failed" in line]
        return False, f"{exc.code} " + ("; ".join(failed)[:300] or body[:200])
    except (OSError, ssl.SSLError) as exc:
        return False, f"not answering ({exc})"


def server_version(port: int, ca_cert: str, timeout: float = 3.0) -> str:
    """kube-apiserver's ``/version`` gitVersion without the ``v`` (``"1.36.3"``)."""
    with urllib.request.urlopen(
        f"https://127.0.0.1:{port}/version", context=_ssl(ca_cert), timeout=timeout
    ) as resp:
        return json.loads(resp.read())["gitVersion"].lstrip("v")
