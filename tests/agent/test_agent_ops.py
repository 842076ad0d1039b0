"""The agent, operable: a real ``nvke-agent run`` process serves ``/metrics`` (dcgm-exporter
names where the quantity is the same, base units otherwise) and ``/healthz`` on a local port
and talks sd_notify to a socket playing systemd (READY=1, then WATCHDOG=1); a stalled agent
reports 503 and stops feeding the watchdog; unknown configuration keys are refused by name; the
systemd unit is hardened (``systemd-analyze security``)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.agent.test_agent_run import write_replay

AGENT = Path(sys.executable).with_name("nvke-agent")
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "agent"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout: float = 20.0) -> requests.Response:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return requests.get(url, timeout=2)
        except requests.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_running_agent_serves_metrics_health_and_feeds_the_watchdog(api_server, tmp_path):
    replay = tmp_path / "r.jsonl"
    (uuid,) = write_replay(replay, gpus=1, steps=1, step_s=1)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    # a wait, not a speed check: READY=1 comes after the agent's start and registration,
    # which took over 10 s once on a loaded 2-core CI machine (the test timed out there)
    notify.settimeout(60)
    port = free_port()
    env = {
        **os.environ,
        "NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
        "WATCHDOG_USEC": "400000",  # ping every 0.2 s
    }
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen(
        [
            str(AGENT),
            "run",
            "--server",
            api_server.url,
            "--state-dir",
            str(tmp_path / "s"),
            "--bootstrap-token",
            api_server.add_token(),
            "--source",
            "replay",
            "--replay",
            str(replay),
            "--loop",
            "--interval",
            "0.2",
            "--metrics-address",
            f"127.0.0.1:{port}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert notify.recv(64) == b"READY=1"
        assert notify.recv(64) == b"WATCHDOG=1"
        health = wait_http(f"http://127.0.0.1:{port}/healthz")
        assert health.status_code == 200
        assert health.json()["status"] == "ok"
        deadline = time.monotonic() + 20
        while not api_server.reports() and time.monotonic() < deadline:
            time.sleep(0.1)
        text = wait_http(f"http://127.0.0.1:{port}/metrics").text
        metrics = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        gpu = (("UUID", uuid), ("gpu", "0"), ("modelName", "NVIDIA H100 80GB HBM3"))
        # the replay's one sample: 0 %, 0 bytes used, 300 000 mW, 1 000 000 mJ, 45 C
        assert metrics[("DCGM_FI_DEV_GPU_UTIL", gpu)] == 0.0
        assert metrics[("DCGM_FI_DEV_POWER_USAGE", gpu)] == 300.0  # W
        assert metrics[("DCGM_FI_DEV_GPU_TEMP", gpu)] == 45.0
        assert metrics[("nvke_gpu_energy_joules_total", gpu)] == 1000.0
        assert metrics[("nvke_gpu_memory_total_bytes", gpu)] == 85520809984
        assert metrics[("nvke_gpu_memory_used_bytes", gpu)] == 0
        assert metrics[("nvke_agent_reports_total", (("outcome", "acked"),))] >= 1
        assert metrics[("nvke_agent_info", (("source", "replay"), ("version", "0.1.0")))] == 1
        assert wait_http(f"http://127.0.0.1:{port}/nothing").status_code == 404
    finally:
        proc.terminate()
        proc.wait(20)
        notify.close()
    assert proc.returncode == 0, proc.stdout.read().decode()[-3000:]


def test_health_turns_503_when_collections_stop():
    from nvke_agent.ops import ObservedSource, health

    now = [100.0]

    class Source:
        name = "replay"

        def collect(self, at):
            return []

    observed = ObservedSource(Source(), monotonic=lambda: now[0])
    assert health(observed, 10.0)[0] is True  # starting: within 3 x interval
    now[0] = 131.0
    ok, body = health(observed, 10.0)
    assert (ok, body["status"], body["last_collect_age_s"]) == (False, "stalled", None)
    observed.collect(None)
    now[0] = 150.0
    ok, body = health(observed, 10.0)
    assert (ok, body["last_collect_age_s"]) == (True, 19.0)
    now[0] = 161.5
    assert health(observed, 10.0) == (
        False,
        {"status": "stalled", "last_collect_age_s": 30.5, "limit_s": 30.0, "collect_errors": 0},
    )


def test_unknown_configuration_keys_are_refused_by_name(tmp_path, capsys):
    from nvke_agent import cli

    config = tmp_path / "agent.toml"
    config.write_text('server = "http://x"\nstate_dir = "/tmp/s"\nintreval = 5\n')
    assert cli.main(["run", "--config", str(config), "--source", "replay"]) == 2
    assert "unknown configuration key(s): intreval" in capsys.readouterr().err


def test_the_deployed_configuration_has_no_unknown_keys():
    from nvke_agent import cli
    from nvke_agent.config_keys import unknown_keys

    config = cli.load_config(str(DEPLOY / "agent.toml"))
    assert config["metrics-address"] == "127.0.0.1:9401"
    assert unknown_keys(config, cli.build_parser(config)) == []


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_the_systemd_unit_is_notify_with_a_watchdog_and_hardened():
    unit = (DEPLOY / "nvke-agent.service").read_text()
    assert "Type=notify" in unit and "WatchdogSec=90" in unit
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(DEPLOY / "nvke-agent.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    score = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)[1])
    assert score <= 2.5  # 8.9 before hardening


def test_observing_a_partial_inventory_never_fails():
    from nvke_agent.ops import ObservedSource

    class Source:
        name = "replay"

        def inventory(self):
            return {"gpus": [{"uuid": "GPU-1"}, {"index": 3}], "driver_version": None}

    observed = ObservedSource(Source())
    assert observed.inventory()["gpus"][0] == {"uuid": "GPU-1"}
    assert observed.models == {"GPU-1": (-1, "")}
