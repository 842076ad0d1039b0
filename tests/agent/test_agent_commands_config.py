"""Scrub commands on acknowledgements, DCGM diagnostics and the configuration file."""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from nvke_agent import cli
from nvke_agent.commands import CommandRunner, dcgm_diagnostics, simulated_scrub
from nvke_agent.sources.replay import ReplaySource
from test_agent_nvml_source import SimGpu, SimulatedNvml, a100_with_mig, t4
from test_agent_run import make_agent, write_replay

SCRUB = {
    "type": "scrub",
    "scrub_id": 7,
    "gpu_uuid": "GPU-d37e67a5-91dd-3774-a5cb-99096249601a",
    "gpu_index": 0,
    "steps": ["gpu_reset", "memory_clear"],
}


def wait_for(predicate, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("timed out")


def test_a_scrub_asked_on_an_ack_is_run_and_its_result_rides_on_a_later_report(
    api_server, tmp_path: Path
) -> None:
    replay = tmp_path / "r.jsonl"
    write_replay(replay, gpus=1, steps=3, step_s=0.05)
    agent = make_agent(api_server, tmp_path, ReplaySource(replay, start=datetime.now(UTC)))
    api_server.state.commands = [SCRUB]
    agent.produce()
    agent.send_oldest()  # the ack carries the command
    api_server.state.commands = []
    results = wait_for(lambda: agent.commands._results and list(agent.commands._results))
    assert results == [simulated_scrub(SCRUB, "replay")]
    assert results[0]["executor"] == "nvke-agent replay (simulated: no GPU to reset)"
    agent.produce()
    agent.send_oldest()
    last = api_server.reports()[-1]
    assert last["scrub_results"] == results
    agent.commands.close()


def test_the_same_scrub_asked_twice_runs_once_per_run() -> None:
    ran = []
    runner = CommandRunner(lambda c: ran.append(c["scrub_id"]) or simulated_scrub(c, "x"))
    assert runner.submit([SCRUB, SCRUB, {"type": "other"}]) == 1
    assert runner.submit([SCRUB]) == 0
    wait_for(lambda: runner._results)
    runner.close()
    assert ran == [7]


def test_a_scrub_that_raises_is_reported_failed_and_the_runner_goes_on() -> None:
    def boom(command: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("driver gone")

    runner = CommandRunner(boom)
    runner.submit([SCRUB])
    [result] = wait_for(lambda: runner._results and list(runner._results))
    runner.close()
    assert (result["ok"], result["steps"][0]["status"]) == (False, "failed")
    assert "driver gone" in result["steps"][0]["detail"]


class FakeRunner:
    """Plays nvidia-smi: answers per command line, records the calls."""

    def __init__(self, answers: dict[str, tuple[int, str]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def __call__(self, args) -> subprocess.CompletedProcess[str]:
        line = " ".join(args)
        self.calls.append(line)
        code, out = self.answers.get(line, (0, "done"))
        return subprocess.CompletedProcess(list(args), code, out, "")


def nvml_source(gpus: list[SimGpu], runner: FakeRunner, processes=()):
    from nvke_agent.sources.nvml import NvmlSource

    sim = SimulatedNvml(gpus)
    sim.nvmlDeviceGetComputeRunningProcesses = lambda handle: list(processes)
    return NvmlSource(nvml=sim, xid_events=False, runner=runner)


def test_an_nvml_scrub_tears_down_mig_resets_and_checks_the_gpu() -> None:
    gpu = a100_with_mig()
    runner = FakeRunner({"nvidia-smi mig -dgi -i 1": (6, "No GPU instance found")})
    source = nvml_source([t4("GPU-other"), gpu], runner)
    command = {**SCRUB, "gpu_uuid": gpu.uuid, "gpu_index": 0,
               "steps": ["mig_teardown", "gpu_reset", "memory_clear"]}  # fmt: skip
    result = source.scrub(command)
    source.close()
    # found by UUID at NVML index 1 (the server's index 0 is not trusted)
    assert runner.calls == [
        "nvidia-smi mig -dci -i 1",
        "nvidia-smi mig -dgi -i 1",
        "nvidia-smi --gpu-reset -i 1",
    ]
    assert result["ok"] is True and result["executor"] == "nvke-agent nvml"
    assert [(s["step"], s["status"]) for s in result["steps"]] == [
        ("mig_teardown", "ok"),
        ("gpu_reset", "ok"),
        ("memory_clear", "ok"),
    ]
    assert result["steps"][2]["detail"] == "no process on the GPU; 50 MiB used"


def test_an_nvml_scrub_stops_at_a_failed_reset_or_a_process_left() -> None:
    runner = FakeRunner({"nvidia-smi --gpu-reset -i 0": (255, "GPU is in use by pid 4242")})
    result = nvml_source([t4()], runner).scrub(SCRUB)
    assert result["ok"] is False
    assert [(s["step"], s["status"]) for s in result["steps"]] == [("gpu_reset", "failed")]
    assert "GPU is in use by pid 4242" in result["steps"][0]["detail"]

    busy = nvml_source([t4()], FakeRunner({}), processes=[SimpleNamespace(pid=4242)])
    result = busy.scrub(SCRUB)
    assert result["ok"] is False
    assert result["steps"][-1]["detail"].startswith("processes still on the GPU: 4242")


def test_dcgm_diagnostics_where_dcgm_is_installed() -> None:
    assert dcgm_diagnostics(1, which=lambda name: None) is None
    passed = FakeRunner({"dcgmi diag -r 1": (0, "| Deployment | Pass |")})
    assert dcgm_diagnostics(1, runner=passed, which=lambda n: "/usr/bin/dcgmi") == {
        "command": "dcgmi diag -r 1",
        "passed": True,
        "output": "| Deployment | Pass |",
    }
    failed = FakeRunner({"dcgmi diag -r 2": (226, "| Memory | Fail - GPU 0 |")})
    result = dcgm_diagnostics(2, runner=failed, which=lambda n: "/usr/bin/dcgmi")
    assert result["passed"] is False


def test_options_come_from_a_toml_file_below_the_environment_and_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        'server = "https://nvke.example"\nstate_dir = "/var/lib/nvke-agent"\n'
        'source = "nvml"\ninterval = 15\nloop = true\n'
    )
    monkeypatch.delenv("NVKE_INTERVAL", raising=False)
    monkeypatch.setenv("NVKE_SOURCE", "replay")
    args = cli.build_parser(cli.load_config(str(config))).parse_args(["run", "--interval", "5"])
    assert (args.server, args.state_dir) == ("https://nvke.example", "/var/lib/nvke-agent")
    assert args.source == "replay"  # the environment beats the file
    assert args.interval == 5.0  # the command line beats both
    assert args.loop is True
    bad = tmp_path / "bad.toml"
    bad.write_text("server = [1, 2]\n")
    with pytest.raises(cli.ConfigError, match="plain value"):
        cli.load_config(str(bad))
    assert cli.main(["run", "--config", str(tmp_path / "missing.toml")]) == 2


def test_the_nvml_inventory_carries_health_attributes_and_the_topology() -> None:
    from nvke_agent.sources.nvml import NvmlSource

    a = t4("GPU-a", bus_id="00000000:01:00.0", nvlinks=["00000000:02:00.0"] * 4,
           serial="1650522003820", retired_pending=pynvml.NVMLError_NotSupported,
           remapped_rows=(2, 0, 1, 0), recovery_action=2)  # fmt: skip
    b = t4("GPU-b", bus_id="00000000:02:00.0", nvlinks=["00000000:01:00.0"] * 4)
    c = t4("GPU-c", bus_id="00000000:03:00.0", recovery_action=None)  # no NVLink, no field
    source = NvmlSource(nvml=SimulatedNvml([a, b, c]), xid_events=False)
    inventory = source.inventory()
    first = inventory["gpus"][0]
    assert first["attributes"] == {
        "serial": "1650522003820",
        "architecture": "Ampere",
        "compute_capability": "8.0",
        "vbios_version": "92.00.36.00.02",
        "power_limit_mw": 400_000,
        "power_limit_default_mw": 400_000,
        "power_limit_max_mw": 400_000,
        "max_sm_clock_mhz": 1410,
        "max_memory_clock_mhz": 1593,
        "nvlink_links_active": 4,
    }
    assert first["health"]["remapped_rows_correctable"] == 2
    assert first["health"]["remapped_rows_pending"] is True
    assert first["health"]["retired_pages_pending"] is None  # NotSupported: null, not False
    assert first["health"]["ecc_aggregate_uncorrected"] == 0
    assert first["health"]["gpu_recovery_action"] == 2  # Node Reboot Required
    assert inventory["gpus"][2]["attributes"]["nvlink_links_active"] is None
    assert inventory["gpus"][2]["health"]["gpu_recovery_action"] is None
    # 4 links from a to b's bus: NV4; c has none: the PCIe level (SYSTEM -> SYS)
    assert inventory["topology"] == {
        "links": [["X", "NV4", "SYS"], ["NV4", "X", "SYS"], ["SYS", "SYS", "X"]]
    }
    [sample, *_] = source.collect(datetime(2024, 5, 1, tzinfo=UTC))
    assert (sample["sm_clock_mhz"], sample["memory_clock_mhz"]) == (1410, 1593)
    assert (sample["clocks_event_reasons"], sample["ecc_volatile_corrected"]) == (0x1, 3)
    source.close()
