"""An agent that lost its state registers again and resends: nothing is lost, nothing counted
twice. Real agent processes (replay source: SIMULATED GPU readings from a file) against the
live server over HTTP, on the real database.

Worked out by hand: the first run stores samples t0..t0+4 (5); the state folder is then lost
(state.json and spool gone) and the agent registers again with a re-issued token. Its replay
holds the same 5 samples and 3 new ones. Without a sequence baseline its seqs would restart at
1 and be acknowledged as duplicates of the first run's reports (the 3 new samples lost); with
it they start above the server's last seq. Samples are unique per (GPU, GI, ts): 8 stored, each
once, 5 counted as deduplicated.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta

import pytest
import requests

from tests.e2e.conftest import BIN, ROOT, register_host, replay_file, service_env

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def run_agent(server: str, state_dir, replay, token: str) -> subprocess.CompletedProcess:
    agent = subprocess.run(
        [
            str(BIN / "nvke-agent"),
            "run",
            "--server",
            server,
            "--state-dir",
            str(state_dir),
            "--source",
            "replay",
            "--replay",
            str(replay),
            "--no-rebase",  # the recorded timestamps: the resent samples are the same samples
            "--interval",
            "0.2",
            "--bootstrap-token",
            token,
        ],
        cwd=ROOT,
        env=service_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert agent.returncode == 0, agent.stderr[-3000:]
    return agent


def test_a_reregistered_agent_gets_a_seq_baseline_and_resent_samples_are_stored_once(
    live_server, catalog, tmp_path
):
    from django.db import connection

    from fleet.models import AgentReport

    operator, host = register_host(live_server.url)
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    times = [t0 + timedelta(seconds=i) for i in range(8)]

    first = replay_file(tmp_path / "first.jsonl", host["gpus"], times[:5])
    run_agent(live_server.url, tmp_path / "state-1", first, host["bootstrap_token"])
    last_seq = max(AgentReport.objects.values_list("seq", flat=True))
    assert last_seq >= 1

    # the state folder is lost; the operator re-issues a token; the agent registers again
    token = operator.post(
        live_server.url + f"/api/v1/fleet/hosts/{host['id']}/bootstrap-token", timeout=30
    ).json()["bootstrap_token"]
    answer = requests.post(
        live_server.url + "/api/v1/agent/register", json={"bootstrap_token": token}, timeout=30
    ).json()
    assert answer["seq_baseline"] == last_seq  # what the server holds
    token = operator.post(
        live_server.url + f"/api/v1/fleet/hosts/{host['id']}/bootstrap-token", timeout=30
    ).json()["bootstrap_token"]
    second = replay_file(tmp_path / "second.jsonl", host["gpus"], times)
    run_agent(live_server.url, tmp_path / "state-2", second, token)
    state = json.loads((tmp_path / "state-2" / "state.json").read_text())

    new_reports = list(AgentReport.objects.filter(seq__gt=last_seq).order_by("seq"))
    assert new_reports, "the re-registered agent's reports were taken for duplicates"
    assert state["next_seq"] == new_reports[-1].seq + 1
    assert sum(r.samples_stored for r in new_reports) == 3
    assert sum(r.samples_deduplicated for r in new_reports) == 5
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT ts, count(*) FROM fleet_gpusample WHERE host_id = %s GROUP BY ts ORDER BY ts",
            [host["id"]],
        )
        assert cursor.fetchall() == [(ts, 1) for ts in times]
