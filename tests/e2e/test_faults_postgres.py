"""Fault suite, PostgreSQL: the database is stopped while agents report, then started again;
the API answers 503 problem+json meanwhile, and not one sample is lost or stored twice.

Real processes on a PRIVATE embedded PostgreSQL (nvke.embedded.postgres, in the test's temp
folder, migrated with ``manage.py migrate``) so stopping it never touches the suite's database:
``gunicorn`` serving ``nvke.wsgi`` and ``AGENTS`` real ``nvke-agent`` processes (replay source,
SIMULATED samples of their hosts' GPUs every second, journaled by ``tests/fleet/soak_agent.py``).
The outage lasts ``NVKE_FAULT_PG_OUTAGE_S`` (10 s in ``make test``, 60 s in ``make faults``).
At the end every agent empties its spool; the ``(gpu, ts)`` pairs spooled must equal the pairs
stored, as sets, and no pair may be stored twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime

import pytest
import requests

from tests.e2e.conftest import ROOT, WebProcess, wait_for
from tests.fleet.test_soak import GPUS_PER_HOST, SoakAgent, write_replay

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

OUTAGE_S = float(os.environ.get("NVKE_FAULT_PG_OUTAGE_S", "10"))
AGENTS = 3
RUN_S = 4.0

SETUP = """
import json, uuid
from catalog.models import GpuModel
from fleet.models import Gpu, Host
from fleet.services import reissue_bootstrap_token
model = GpuModel.objects.get(slug="h100-sxm5-80gb")
out = []
for n in range({agents}):
    host = Host.objects.create(hostname=f"pg-{{n}}", zone="us-east-1a", gpu_model=model,
                               gpu_count={gpus})
    Gpu.objects.bulk_create([
        Gpu(uuid=f"GPU-sim-{{uuid.uuid4()}}", host=host, index=i,
            pci_bus_id=f"00000000:{{i + 1:02X}}:00.0", gpu_model=model,
            product_name=(model.product_names or [model.name])[0])
        for i in range({gpus})])
    out.append({{"host": str(host.id), "token": reissue_bootstrap_token(host),
                "uuids": list(host.gpus.order_by("index").values_list("uuid", flat=True))}})
print("SETUP " + json.dumps(out))
"""


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_postgres_stopped_while_agents_report_loses_and_duplicates_no_sample(tmp_path):
    import psycopg

    from nvke.embedded.postgres import start_postgres

    pg = start_postgres(tmp_path / "pg", dbname="nvke_faults")
    env = {
        **os.environ,
        "DATABASE_URL": pg.url,
        "DJANGO_SETTINGS_MODULE": "nvke.settings",
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "WARNING",
        "DB_CONN_MAX_AGE": "60",  # persistent connections must survive the restart too
    }
    api = WebProcess(tmp_path / "api.log", env)
    agents: list[SoakAgent] = []
    try:
        manage(env, "migrate", "--no-input")
        manage(env, "load_catalog")
        out = manage(env, "shell", "-c", SETUP.format(agents=AGENTS, gpus=GPUS_PER_HOST))
        hosts = json.loads(next(line for line in out.splitlines() if line.startswith("SETUP "))[6:])
        for n, host in enumerate(hosts):
            replay = tmp_path / f"replay-{n}.jsonl"
            write_replay(replay, host["uuids"])
            agents.append(SoakAgent(n, api, host["token"], replay, tmp_path))
        api.start()
        for agent in agents:
            agent.start()

        def reports() -> int:
            with psycopg.connect(**pg.conninfo()) as conn:
                row = conn.execute("SELECT count(DISTINCT host_id) FROM fleet_agentreport")
                return row.fetchone()[0]

        wait_for(lambda: reports() == AGENTS, timeout=120, what="every agent to report")
        time.sleep(RUN_S)

        pg.stop()
        down_at = time.monotonic()
        time.sleep(2.0)
        during = requests.get(
            f"{api.url}/api/v1/clusters", headers={"Authorization": "Bearer x"}, timeout=30
        )
        time.sleep(max(OUTAGE_S - (time.monotonic() - down_at), 0))
        pg = start_postgres(tmp_path / "pg", dbname="nvke_faults")
        print(f"PostgreSQL down {time.monotonic() - down_at:.1f} s")
        time.sleep(RUN_S)
        for agent in agents:
            agent.signal(signal.SIGTERM)
        for agent in agents:
            agent.flush()
        with psycopg.connect(**pg.conninfo()) as conn:
            rows = conn.execute(
                "SELECT gpu_uuid, ts FROM fleet_gpusample WHERE host_id::text = ANY(%s)",
                [[h["host"] for h in hosts]],
            ).fetchall()
    finally:
        for agent in agents:
            if agent.proc is not None and agent.proc.poll() is None:
                agent.proc.kill()
            agent.log.close()
        api.stop()
        pg.stop()

    # while PostgreSQL was down the API said so in problem+json, never an HTML 500
    assert during.status_code == 503, during.text[:500]
    assert during.headers["Content-Type"] == "application/problem+json"
    assert (during.json()["code"], during.json()["retryable"]) == ("database_unavailable", True)
    spooled = set().union(*(agent.spooled() for agent in agents))
    stored = {(gpu, ts) for gpu, ts in rows}
    assert len(spooled) >= AGENTS * GPUS_PER_HOST * (OUTAGE_S + RUN_S) * 0.5
    assert spooled - stored == set()  # nothing lost
    assert stored - spooled == set()
    assert len(rows) == len(stored)  # nothing stored twice
    assert all(isinstance(ts, datetime) for _, ts in rows[:1])
    print(f"\n{AGENTS} agents, {len(spooled)} samples spooled, {len(rows)} stored")
