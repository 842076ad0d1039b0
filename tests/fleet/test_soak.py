"""Soak: the control plane's API is killed while agents report, agents are restarted (cleanly
and with SIGKILL) during the outage, and not one sample is lost or stored twice.

Real processes on the real PostgreSQL test database: ``gunicorn`` serving ``nvke.wsgi`` (killed
with SIGKILL, started again on the same port after the outage) and ``NVKE_SOAK_AGENTS`` agents
(5) — the real ``nvke-agent`` with the ``replay`` source looping over SIMULATED samples of its
host's GPUs every second, fast retries — each wrapped by ``soak_agent.py``, which journals the
``(gpu, ts)`` of every sample the agent durably spooled. During the outage one agent is stopped
with SIGTERM and another killed with SIGKILL, and both are started again.

At the end each agent is stopped and run once more to empty its spool; then the set of
``(gpu, ts)`` the agents spooled must equal the set stored in ``fleet_gpusample`` — compared as
sets, not counts — and no pair may be stored twice.

The outage lasts ``NVKE_SOAK_OUTAGE_S`` seconds: 30 in ``make test``, 600 with ``make soak``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection

from tests.e2e.conftest import WebProcess, wait_for
from tests.helpers import database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
OUTAGE_S = float(os.environ.get("NVKE_SOAK_OUTAGE_S", "30"))
AGENTS = int(os.environ.get("NVKE_SOAK_AGENTS", "5"))
GPUS_PER_HOST = 2
RUN_S = 5.0  # normal running before the outage and after it


def env() -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "nvke.settings",
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "WARNING",
    }


class SoakAgent:
    """One agent process (journaling wrapper around the real nvke-agent)."""

    def __init__(self, n: int, api: WebProcess, token: str, replay: Path, tmp_path: Path) -> None:
        self.n = n
        self.dir = tmp_path / f"agent-{n}"
        self.journal = tmp_path / f"journal-{n}.jsonl"
        self.log = (tmp_path / f"agent-{n}.log").open("a")
        self.args = [
            "run", "--server", api.url, "--state-dir", str(self.dir), "--source", "replay",
            "--replay", str(replay), "--loop", "--interval", "1", "--bootstrap-token", token,
            "--retry-base-s", "0.2", "--retry-cap-s", "2", "--log-level", "WARNING",
        ]  # fmt: skip
        self.proc: subprocess.Popen | None = None

    def command(self, extra: list[str] = ()) -> list[str]:  # type: ignore[assignment]
        wrapper = str(Path(__file__).with_name("soak_agent.py"))
        return [sys.executable, wrapper, str(self.journal), "--", *self.args, *extra]

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.command(), cwd=ROOT, env=env(), stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def signal(self, sig: int) -> None:
        if self.proc is None:
            raise RuntimeError("signal() before start()")
        self.proc.send_signal(sig)
        self.proc.wait(30)

    def flush(self) -> None:
        """Run once more until its spool is empty (one more report, then exit 0)."""
        done = subprocess.run(
            self.command(["--max-reports", "1"]), cwd=ROOT, env=env(), stdout=self.log,
            stderr=subprocess.STDOUT, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, (self.dir / "..").resolve()

    def spooled(self) -> set[tuple[str, datetime]]:
        keys: set[tuple[str, datetime]] = set()
        for line in self.journal.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line torn by SIGKILL: its batch was journaled again on restart
            for gpu, ts in entry["keys"]:
                keys.add((gpu, datetime.fromisoformat(ts)))
        return keys


def write_replay(path: Path, uuids: list[str]) -> None:
    """A minute of samples, one per GPU per second (looped by the agent)."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    lines = []
    for step in range(60):
        ts = (t0 + timedelta(seconds=step)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        for n, uuid in enumerate(uuids):
            lines.append(
                {"kind": "sample", "ts": ts, "gpu_uuid": uuid, "utilization_gpu_pct": float(step),
                 "power_mw": 250_000 + n, "energy_mj": 1_000_000 + step * 250_000}
            )  # fmt: skip
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")


def stored_rows(host_ids: list[str]) -> list[tuple[str, datetime]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT gpu_uuid, ts FROM fleet_gpusample WHERE host_id::text = ANY(%s)", [host_ids]
        )
        return cursor.fetchall()


def test_an_api_outage_and_agent_restarts_lose_no_sample(make_host, tmp_path):
    from fleet.models import AgentReport
    from fleet.services import reissue_bootstrap_token

    api = WebProcess(tmp_path / "api.log", env())
    hosts = [
        make_host("h100-sxm5-80gb", gpus=GPUS_PER_HOST, zone="us-east-1a", hostname=f"soak-{n}")
        for n in range(AGENTS)
    ]
    agents = []
    for n, host in enumerate(hosts):
        replay = tmp_path / f"replay-{n}.jsonl"
        write_replay(replay, list(host.gpus.order_by("index").values_list("uuid", flat=True)))
        agents.append(SoakAgent(n, api, reissue_bootstrap_token(host), replay, tmp_path))
    host_ids = [str(h.id) for h in hosts]
    try:
        api.start(answering=False)
        for agent in agents:
            agent.start()
        wait_for(
            lambda: (
                AgentReport.objects.filter(host__in=hosts).values("host").distinct().count()
                == AGENTS
            ),
            timeout=120,
            what="every agent to deliver a report",
        )
        time.sleep(RUN_S)

        api.kill()
        down_at = datetime.now(UTC)
        time.sleep(OUTAGE_S / 3)
        agents[0].signal(signal.SIGTERM)  # a clean restart (systemd restart)
        agents[0].start()
        time.sleep(OUTAGE_S / 3)
        agents[1].signal(signal.SIGKILL)  # a crash
        agents[1].start()
        time.sleep(OUTAGE_S - 2 * OUTAGE_S / 3)
        api.start(answering=False)
        up_at = datetime.now(UTC)
        time.sleep(RUN_S)

        for agent in agents:
            agent.signal(signal.SIGTERM)
        for agent in agents:
            agent.flush()
    finally:
        for agent in agents:
            if agent.proc is not None and agent.proc.poll() is None:
                agent.proc.kill()
            agent.log.close()
        api.stop()

    spooled = set().union(*(agent.spooled() for agent in agents))
    rows = stored_rows(host_ids)
    stored = set(rows)
    # every sample spooled during the outage and the restarts is stored, once, and only those
    assert len(spooled) >= AGENTS * GPUS_PER_HOST * (OUTAGE_S + 2 * RUN_S) * 0.5
    assert spooled - stored == set()
    assert stored - spooled == set()
    assert len(rows) == len(stored)
    # the outage really happened: nothing arrived while the API was down, and batches made
    # during it arrived after it
    received = list(AgentReport.objects.filter(host__in=hosts).values_list("received_at", "min_ts"))
    assert not [r for r, _ in received if down_at + timedelta(seconds=1) < r < up_at]
    assert any(r >= up_at and m is not None and m < up_at for r, m in received)
    print(
        f"\nsoak: {AGENTS} agents, API down {OUTAGE_S:g} s, {len(spooled)} samples spooled, "
        f"{len(stored)} stored, {len(received)} reports"
    )
