"""End-to-end fixtures: a real Celery worker process and real agent processes against
Django's live server (real HTTP), all on the real PostgreSQL test database and real Redis."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from django.conf import settings

from tests.helpers import broker_client, database_url, wire_inventory_gpus

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def service_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        REDIS_URL=settings.REDIS_URL,
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        DJANGO_SETTINGS_MODULE="nvke.settings",
        NVKE_SIMULATED_CONTROL_PLANE_DELAY_S="0.5",
        NVKE_SIMULATED_NODE_DELAY_S="0.5",
        NVKE_SIMULATED_HOSTS_DIR=str(settings.NVKE_SIMULATED_HOSTS_DIR),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@pytest.fixture
def worker(transactional_db, tmp_path):
    """A real ``celery worker`` on every queue, consuming from a flushed broker DB."""
    proc, log = start_worker(tmp_path)
    yield proc
    stop(proc)
    log.close()
    print((tmp_path / "worker.log").read_text()[-5000:])


def start_worker(tmp_path: Path, **extra_env: str):
    """Start the worker of :func:`worker` with ``extra_env`` on top of :func:`service_env`;
    returns ``(process, open log file)``."""
    broker_client().flushdb()
    log = (tmp_path / "worker.log").open("w")
    proc = subprocess.Popen(
        [
            str(BIN / "celery"),
            "-A",
            "nvke",
            "worker",
            "-Q",
            "reconcile,telemetry,billing,default,webhooks",
            "--concurrency",
            "2",
            "--loglevel",
            "INFO",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
        ],
        cwd=ROOT,
        env=service_env(**extra_env),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, log


def start_simulated_agent(tmp_path: Path, server: str, host, interval: str = "0.5"):
    """A real ``nvke-agent`` process with the ``simulated`` source of SIMULATED host ``host``
    (its state file from clusters.providers.simhosts), registering with a fresh bootstrap token,
    reporting every ``interval`` s with the inventory each time. Returns (process, log file);
    the caller stops it with :func:`stop` and closes the log (``tmp_path/agent.log``)."""
    from clusters.providers import simhosts
    from fleet.services import reissue_bootstrap_token

    token = reissue_bootstrap_token(host)
    log = (tmp_path / "agent.log").open("w")
    proc = subprocess.Popen(
        [
            str(BIN / "nvke-agent"), "run",
            "--server", server,
            "--state-dir", str(tmp_path / "agent"),
            "--source", "simulated",
            "--sim-state", str(simhosts.state_path(host.id)),
            "--interval", interval,
            "--inventory-every", "1",
            "--bootstrap-token", token,
        ],
        cwd=ROOT, env=service_env(), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    return proc, log


def wait_for(predicate, timeout: float = 60, interval: float = 0.25, what: str = "condition"):
    """Poll ``predicate()`` until it returns a truthy value; returns it."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def register_host(server: str) -> tuple[requests.Session, dict]:
    """Register host ``h1`` (us-east-1a) with the SIMULATED nvidia-smi capture ``a10g.xml``
    through ``server``'s fleet API as an operator; returns (the operator's HTTP session, the
    created host's JSON, with its ``gpus`` and ``bootstrap_token``)."""
    from tenants.services import create_api_key
    from tests.conftest import capture

    operator = requests.Session()
    operator.headers["Authorization"] = f"Bearer {create_api_key(tenant=None, name='op')[1]}"
    resp = operator.post(
        server + "/api/v1/fleet/hosts",
        json={"hostname": "h1", "zone": "us-east-1a", "nvidia_smi_xml": capture("a10g.xml")},
        timeout=30,
    )
    assert resp.status_code == 201, resp.text
    return operator, resp.json()


def replay_file(path: Path, gpus: list[dict], times: list, util: float = 10.0) -> Path:
    """Write the agent's ``replay`` source file at ``path``: an inventory of ``gpus`` (the
    API's host GPUs) and one SIMULATED sample of the first GPU per time in ``times`` (aware
    datetimes), utilization ``util`` + 0, 1, 2 ... %."""
    lines = [
        {"kind": "inventory", "driver_version": "535.54.03", "gpus": wire_inventory_gpus(gpus)}
    ]
    lines += [
        {"kind": "sample", "ts": ts.isoformat(), "gpu_uuid": gpus[0]["uuid"],
         "utilization_gpu_pct": util + i}
        for i, ts in enumerate(times)
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebProcess:
    """gunicorn serving ``nvke.wsgi`` on 127.0.0.1 (2 sync workers) in its own process group,
    so that :meth:`kill` takes the arbiter and its workers at once; :meth:`start` again after
    a kill serves on the same port. Output is appended to ``log``; ``env`` is the process'
    whole environment (:func:`service_env` for the suite's database). ``argv`` replaces the
    command line (one that binds ``port``), e.g. the supervisor's own for the web process."""

    def __init__(
        self,
        log: Path,
        env: dict[str, str],
        *,
        port: int | None = None,
        argv: list[str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.argv = argv or [
            str(BIN / "gunicorn"), "nvke.wsgi", "--bind", f"127.0.0.1:{self.port}",
            "--workers", "2", "--timeout", "60",
        ]  # fmt: skip
        self.env = env
        self.log = log.open("a")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, answering: bool = True) -> None:
        """Start it and wait (60 s at most) until ``/healthz`` answers without a 5xx, or, with
        ``answering=False``, only until the port accepts connections (no request served yet:
        the moment the soak test takes for the end of an outage)."""
        self.proc = subprocess.Popen(
            self.argv, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

        def answers() -> bool:
            try:
                return requests.get(f"{self.url}/healthz", timeout=2).status_code < 500
            except requests.RequestException:
                return False

        def listens() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                return False

        wait_for(
            answers if answering else listens,
            timeout=60,
            what=f"gunicorn on port {self.port} to {'answer' if answering else 'listen'}",
        )

    def kill(self) -> None:
        """SIGKILL the whole process group (arbiter and workers): a crash, mid-request."""
        if self.proc is None:
            raise RuntimeError("kill() before start(): no gunicorn to kill")
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM the process group if it runs (waits 30 s at most) and close the log."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        self.log.close()


@pytest.fixture
def nvkectl(tmp_path):
    """Run the real ``nvkectl`` console script in its own process (own config file and
    kubeconfig under ``tmp_path``); ``expect`` is the exit code; ``run.history`` the args."""
    env = {
        **os.environ,
        "NVKECTL_CONFIG": str(tmp_path / "nvkectl.yaml"),
        "KUBECONFIG": str(tmp_path / "kube" / "config"),
        "COLUMNS": "200",
    }

    def run(*args: str, expect: int = 0) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(BIN / "nvkectl"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert result.returncode == expect, (args, result.stdout, result.stderr)
        run.history.append(list(args))
        return result

    run.history = []
    return run
