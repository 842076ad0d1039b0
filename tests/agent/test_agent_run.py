"""The agent end to end: CLI, registration, spool and delivery against the local test server.

The server is ``api_server`` (conftest): a real HTTP server on 127.0.0.1 playing the NVKE
agent API. Sources are the real ``replay`` and ``nvidia-smi-xml`` sources.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nvke_agent import cli
from nvke_agent.agent import Agent
from nvke_agent.client import Ack, ApiClient, Backoff, RetryLater
from nvke_agent.sources.base import format_ts
from nvke_agent.sources.replay import ReplaySource
from nvke_agent.sources.smi_xml import SmiXmlSource
from nvke_agent.spool import Spool
from nvke_agent.state import StateStore

FAST = ["--retry-base-s", "0.01", "--retry-cap-s", "0.05"]
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
AGENT_DIR = Path(__file__).resolve().parents[2] / "agent"


def write_replay(path: Path, *, gpus: int, steps: int, step_s: float, xid_at: int | None = None):
    """A replay file: inventory + ``steps`` samples per GPU ``step_s`` apart (+ one Xid)."""
    uuids = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(gpus)]
    lines: list[dict] = [
        {
            "kind": "inventory",
            "driver_version": "550.54.15",
            "cuda_version": "12.4",
            "gpus": [
                {
                    "uuid": uuid,
                    "index": i,
                    "name": "NVIDIA H100 80GB HBM3",
                    "pci_bus_id": f"00000000:{i + 16:02X}:00.0",
                    "memory_total_bytes": 85520809984,
                    "mig_mode": "disabled",
                    "mig_devices": [],
                }
                for i, uuid in enumerate(uuids)
            ],
        }
    ]
    for step in range(steps):
        ts = format_ts(T0 + timedelta(seconds=step * step_s))
        for uuid in uuids:
            lines.append(
                {
                    "kind": "sample",
                    "ts": ts,
                    "gpu_uuid": uuid,
                    "mig_gpu_instance_id": None,
                    "utilization_gpu_pct": float(step % 100),
                    "utilization_memory_pct": None,
                    "memory_used_bytes": step * 2**20,
                    "memory_total_bytes": 85520809984,
                    "power_mw": 300_000 + step,
                    "energy_mj": 1_000_000 + step * 3000,
                    "temperature_c": 45.0,
                    "ecc_volatile_uncorrected": 0,
                }
            )
        if xid_at == step:
            lines.append(
                {
                    "kind": "event",
                    "ts": ts,
                    "gpu_uuid": uuids[0],
                    "type": "xid",
                    "xid": 79,
                    "message": "fell off the bus",
                }
            )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return uuids


def make_agent(api_server, tmp_path: Path, source, **kwargs) -> Agent:
    store = StateStore(tmp_path / "state")
    if not store.state.registered:
        host_id, credential = api_server.add_host()
        store.set_registration(host_id, credential, 10)
    kwargs.setdefault("interval_s", 0.02)
    kwargs.setdefault("backoff", Backoff(base_s=0.01, cap_s=0.05))
    return Agent(
        source=source,
        client=ApiClient(api_server.url),
        store=store,
        spool=Spool(tmp_path / "state", max_bytes=kwargs.pop("max_bytes", 2**28)),
        **kwargs,
    )


def received_keys(api_server) -> list[tuple[str, str, int | None]]:
    return [
        (s["gpu_uuid"], s["ts"], s["mig_gpu_instance_id"])
        for report in api_server.reports()
        for s in report["samples"]
    ]


# --- delivery -------------------------------------------------------------------------------


def test_batches_survive_an_api_outage_and_every_sample_arrives_once(
    api_server, tmp_path: Path
) -> None:
    replay = tmp_path / "r.jsonl"
    uuids = write_replay(replay, gpus=2, steps=20, step_s=0.01, xid_at=5)
    start = datetime.now(UTC)
    produced = {
        (uuid, format_ts(start + timedelta(seconds=step * 0.01)), None)
        for step in range(20)
        for uuid in uuids
    }
    api_server.fail_next(6, 503)  # the API is down for the first six calls
    agent = make_agent(api_server, tmp_path, ReplaySource(replay, start=start))

    assert agent.run() == 0

    statuses = api_server.report_statuses()
    assert statuses[:6] == [503] * 6
    assert set(statuses[6:]) == {200}
    keys = received_keys(api_server)
    assert len(keys) == len(set(keys))  # nothing twice
    assert set(keys) == produced  # nothing lost
    reports = api_server.reports()
    assert [r["seq"] for r in reports] == list(range(1, len(reports) + 1))
    assert [e["xid"] for r in reports for e in r["events"]] == [79]
    assert agent.spool.pending() == []
    agent.spool.close()
    assert Spool(tmp_path / "state").pending() == []


def test_retry_after_is_honoured(api_server, tmp_path: Path) -> None:
    replay = tmp_path / "r.jsonl"
    write_replay(replay, gpus=1, steps=1, step_s=1)
    api_server.fail_next(1, 503, retry_after="1")
    agent = make_agent(api_server, tmp_path, ReplaySource(replay, start=datetime.now(UTC)))
    assert agent.run() == 0
    first, second = api_server.state.request_times
    assert second - first >= 1.0
    assert len(api_server.reports()) == 1


def test_a_batch_is_kept_on_500_and_deleted_after_200(api_server, tmp_path: Path) -> None:
    replay = tmp_path / "r.jsonl"
    write_replay(replay, gpus=1, steps=1, step_s=1)
    agent = make_agent(api_server, tmp_path, ReplaySource(replay, start=datetime.now(UTC)))
    [seq] = agent.produce()

    api_server.fail_next(1, 500)
    assert isinstance(agent.send_oldest(), RetryLater)
    assert agent.spool.pending() == [seq]
    agent.spool.close()
    assert Spool(tmp_path / "state").pending() == [seq]  # on disk, not only in memory

    assert agent.send_oldest() == Ack(seq, False, 1, 0)
    assert agent.spool.pending() == []
    agent.spool.close()
    assert Spool(tmp_path / "state").pending() == []
    [report] = api_server.reports()
    assert report["seq"] == seq
    assert report["host_id"] == agent.store.state.host_id
    assert report["source"] == "replay"
    assert report["sent_at"].endswith("Z")


def test_a_batch_the_server_already_has_is_deleted(api_server, tmp_path: Path) -> None:
    replay = tmp_path / "r.jsonl"
    write_replay(replay, gpus=1, steps=1, step_s=1)
    agent = make_agent(api_server, tmp_path, ReplaySource(replay, start=datetime.now(UTC)))
    [seq] = agent.produce()
    body = agent.spool.load(seq)
    body["host_id"] = agent.store.state.host_id
    ApiClient(api_server.url).send_report(agent.store.state.credential, body)  # ack got lost
    assert agent.send_oldest() == Ack(seq, True, 0, 0)
    assert agent.spool.pending() == []


def test_a_refused_batch_goes_to_rejected_and_the_rest_still_flows(
    api_server, tmp_path: Path
) -> None:
    replay = tmp_path / "r.jsonl"
    write_replay(replay, gpus=1, steps=3, step_s=0.01)
    api_server.state.refuse_seqs[2] = 400
    source = ReplaySource(replay, start=T0, rebase=False)
    agent = make_agent(api_server, tmp_path, source, max_samples_per_report=1)
    assert agent.run() == 0
    assert [r["seq"] for r in api_server.reports()] == [1, 3]
    assert (agent.spool.rejected_dir / "000000000002.json").exists()
    reason = json.loads((agent.spool.rejected_dir / "000000000002.reason.json").read_text())
    assert reason["status"] == 400


def test_a_revoked_credential_stops_the_agent_and_keeps_the_spool(
    api_server, tmp_path: Path
) -> None:
    replay = tmp_path / "r.jsonl"
    write_replay(replay, gpus=1, steps=3, step_s=0.01)
    agent = make_agent(api_server, tmp_path, ReplaySource(replay, start=datetime.now(UTC)))
    api_server.state.credentials.clear()  # an operator revoked the host
    assert agent.run() == 1
    assert agent.spool.pending() == [1]
    assert api_server.reports() == []


def test_the_spool_cap_drops_the_oldest_and_counts_it(api_server, tmp_path: Path, caplog) -> None:
    replay = tmp_path / "r.jsonl"
    write_replay(replay, gpus=1, steps=4, step_s=0.01)
    agent = make_agent(
        api_server, tmp_path, ReplaySource(replay, start=T0, rebase=False), max_bytes=1
    )
    agent.max_samples_per_report = 1  # four batches from one collection
    with caplog.at_level("ERROR", logger="nvke_agent"):
        assert agent.produce() == [1, 2, 3, 4]
    assert agent.spool.pending() == [4]
    state = json.loads(agent.store.path.read_text())
    assert (state["dropped_batches"], state["dropped_samples"]) == (3, 3)
    assert "SPOOL OVER ITS CAP" in caplog.text


def test_inventory_goes_in_the_first_report_every_tenth_and_when_it_changes(
    api_server, captures: Path, tmp_path: Path
) -> None:
    xml = tmp_path / "smi.xml"
    shutil.copy(captures / "a100-sxm4-v12.xml", xml)
    agent = make_agent(api_server, tmp_path, SmiXmlSource(xml))
    for _ in range(12):
        agent.produce()
    xml.write_text(xml.read_text().replace("<current_mig>Enabled", "<current_mig>Disabled"))
    agent.produce()
    bodies = [agent.spool.load(seq) for seq in agent.spool.pending()]
    with_inventory = [b["seq"] for b in bodies if b["inventory"] is not None]
    assert with_inventory == [1, 11, 13]
    assert bodies[0]["inventory"]["gpus"][0]["mig_mode"] == "enabled"
    assert bodies[12]["inventory"]["gpus"][0]["mig_mode"] == "disabled"
    assert all(b["driver_version"] == "535.54.03" and b["cuda_version"] == "12.2" for b in bodies)
    assert set(bodies[0]) == {
        "host_id", "seq", "instance_id", "agent_version", "source", "sent_at", "driver_version",
        "cuda_version", "inventory", "samples", "events", "source_error",
    }  # fmt: skip
    assert {b["instance_id"] for b in bodies} == {agent.instance_id}
    assert all(b["source_error"] is None for b in bodies)  # the XML was read every time


# --- CLI ------------------------------------------------------------------------------------


def test_register_command_stores_a_0600_credential(api_server, tmp_path: Path, capsys) -> None:
    token = api_server.add_token()
    state_dir = tmp_path / "state"
    status = cli.main(
        ["register", "--server", api_server.url, "--bootstrap-token", token,
         "--state-dir", str(state_dir), "--hostname", "gpu-7"]
    )  # fmt: skip
    assert status == 0
    state = json.loads((state_dir / "state.json").read_text())
    assert api_server.state.credentials[state["credential"]] == state["host_id"]
    assert api_server.state.hosts[state["host_id"]] == "gpu-7"
    assert (state_dir / "state.json").stat().st_mode & 0o777 == 0o600
    out, err = capsys.readouterr()
    assert json.loads(out)["host_id"] == state["host_id"]
    assert state["credential"] not in out + err  # the secret is never printed or logged


def test_register_with_a_bad_token_exits_non_zero_with_the_servers_detail(
    api_server, tmp_path: Path, capsys
) -> None:
    status = cli.main(
        ["register", "--server", api_server.url, "--bootstrap-token", "nope",
         "--state-dir", str(tmp_path)]
    )  # fmt: skip
    assert status == 1
    err = capsys.readouterr().err
    assert "invalid_bootstrap_token" in err
    assert "bootstrap token unknown, used or expired" in err
    assert not (tmp_path / "state.json").exists()


def test_run_registers_replays_and_exits_when_the_file_is_exhausted(
    api_server, tmp_path: Path, monkeypatch, capsys
) -> None:
    replay = tmp_path / "r.jsonl"
    uuids = write_replay(replay, gpus=2, steps=5, step_s=0.02)
    token = api_server.add_token()
    # Options from the environment (NVKE_*), as a DaemonSet would pass them.
    monkeypatch.setenv("NVKE_SERVER", api_server.url)
    monkeypatch.setenv("NVKE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("NVKE_BOOTSTRAP_TOKEN", token)
    monkeypatch.setenv("NVKE_SOURCE", "replay")
    monkeypatch.setenv("NVKE_REPLAY", str(replay))
    status = cli.main(["run", "--interval", "0.02", *FAST])
    assert status == 0
    reports = api_server.reports()
    assert len({(s["gpu_uuid"], s["ts"]) for r in reports for s in r["samples"]}) == 10
    assert {s["gpu_uuid"] for r in reports for s in r["samples"]} == set(uuids)
    assert reports[0]["inventory"]["gpus"][0]["uuid"] == uuids[0]
    assert reports[0]["agent_version"] == "0.1.0"
    # Logs are JSON lines on stderr.
    logs = [
        json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")
    ]
    assert any(entry["msg"] == "registered" for entry in logs)
    assert all({"ts", "level", "logger", "msg"} <= set(entry) for entry in logs)


def test_seqs_continue_across_runs_and_leftovers_are_sent_first(api_server, tmp_path: Path) -> None:
    replay = tmp_path / "r.jsonl"
    write_replay(replay, gpus=1, steps=1, step_s=1)
    state_dir = tmp_path / "state"
    args = ["run", "--server", api_server.url, "--state-dir", str(state_dir),
            "--source", "replay", "--replay", str(replay), "--no-rebase",
            "--interval", "0.01", *FAST]  # fmt: skip
    host_id, credential = api_server.add_host()
    StateStore(state_dir).set_registration(host_id, credential, 10)

    assert cli.main([*args, "--max-reports", "2"]) == 0
    # The file was exhausted after one report: --max-reports 2 made only seq 1.
    assert StateStore(state_dir).state.next_seq == 2
    # A crash after seq 2 was allocated but before its batch was written:
    assert StateStore(state_dir).allocate_seq() == 2
    # A batch (seq 3) a previous run spooled but never sent:
    seq = StateStore(state_dir).allocate_seq()
    leftover = {"host_id": host_id, "seq": seq, "agent_version": "0.1.0", "source": "replay",
                "sent_at": None, "driver_version": None, "cuda_version": None,
                "inventory": None, "samples": [], "events": []}  # fmt: skip
    Spool(state_dir).put(seq, leftover)

    assert cli.main(args) == 0
    seqs = [seq for path, status, seq in api_server.state.requests if status == 200]
    assert seqs == [1, 3, 4]  # the leftover first; 2 is skipped, never reused
    assert StateStore(state_dir).state.next_seq == 5


def test_run_without_credential_or_token_is_a_usage_error(tmp_path: Path, capsys) -> None:
    status = cli.main(
        ["run", "--server", "http://127.0.0.1:9", "--state-dir", str(tmp_path),
         "--source", "replay", "--replay", str(tmp_path / "x")]
    )  # fmt: skip
    assert status == 2
    assert "--bootstrap-token" in capsys.readouterr().err


def test_loop_with_no_rebase_is_a_usage_error(api_server, tmp_path: Path) -> None:
    StateStore(tmp_path).set_registration(*api_server.add_host(), 10)
    status = cli.main(
        ["run", "--server", api_server.url, "--state-dir", str(tmp_path), "--source", "replay",
         "--replay", "x", "--loop", "--no-rebase"]
    )  # fmt: skip
    assert status == 2


def test_record_command_prints_a_summary(captures: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "t4.jsonl"
    status = cli.main(
        ["record", "--source", "nvidia-smi-xml", "--xml", str(captures / "tesla-t4.xml"),
         "--out", str(out), "--duration", "0.05", "--interval", "0.02"]
    )  # fmt: skip
    assert status == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("recorded 1 GPU(s), 3 sample(s), 0 event(s) in 3 collection(s)")
    assert len(out.read_text().splitlines()) == 4


def test_sigterm_finishes_cleanly_and_leaves_unsent_batches_in_the_spool(
    api_server, captures: Path, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    StateStore(state_dir).set_registration(*api_server.add_host(), 10)
    api_server.fail_next(10_000, 503)  # the API stays down
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(AGENT_DIR), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "nvke_agent", "run", "--server", api_server.url,
         "--state-dir", str(state_dir), "--source", "nvidia-smi-xml",
         "--xml", str(captures / "a10g.xml"), "--interval", "0.1", *FAST],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    spool_dir = state_dir / "spool"

    def spooled() -> int:  # lines appended so far (read only: the agent owns the spool)
        return sum(len(p.read_bytes().splitlines()) for p in spool_dir.glob("seg-*.jsonl"))

    deadline = time.monotonic() + 20
    while spooled() < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
    left = Spool(state_dir).pending()
    assert len(left) >= 3
    assert "left in the spool" in stderr
    assert api_server.reports() == []

    # The next start sends them, oldest first.
    api_server.state.failures.clear()
    assert cli.main(["run", "--server", api_server.url, "--state-dir", str(state_dir),
                     "--source", "nvidia-smi-xml", "--xml", str(captures / "a10g.xml"),
                     "--interval", "0.01", "--max-reports", "1", *FAST]) == 0  # fmt: skip
    seqs = [r["seq"] for r in api_server.reports()]
    assert seqs == sorted(seqs)
    assert seqs[: len(left)] == left
    assert Spool(state_dir).pending() == []


@pytest.mark.parametrize("flag", ["--xml", "--replay"])
def test_a_missing_input_file_fails_to_start_with_status_2(
    tmp_path: Path, capsys, flag: str
) -> None:
    source = "nvidia-smi-xml" if flag == "--xml" else "replay"
    status = cli.main(
        ["record", "--source", source, flag, str(tmp_path / "missing"), "--out",
         str(tmp_path / "o"), "--duration", "0"]
    )  # fmt: skip
    assert status == 2
    assert "cannot start source" in capsys.readouterr().err


def test_a_second_agent_on_the_same_state_dir_is_refused(
    api_server, tmp_path: Path, capsys
) -> None:
    store = StateStore(tmp_path)
    store.set_registration(*api_server.add_host(), 10)
    with store.exclusive():  # the first agent
        status = cli.main(
            ["run", "--server", api_server.url, "--state-dir", str(tmp_path),
             "--source", "replay", "--replay", "x"]
        )  # fmt: skip
    assert status == 1
    assert "another nvke-agent is using" in capsys.readouterr().err
    assert store.state.next_seq == 1
