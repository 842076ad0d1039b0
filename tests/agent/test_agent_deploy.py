"""deploy/agent: the systemd unit passes ``systemd-analyze verify``, the DaemonSet validates
against the Kubernetes schema, and both configuration files are options the agent accepts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from nvke_agent import cli

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "agent"


def test_the_example_configuration_is_understood_by_the_agent(monkeypatch) -> None:
    for name in ("NVKE_SERVER", "NVKE_SOURCE", "NVKE_STATE_DIR", "NVKE_DCGM_DIAG"):
        monkeypatch.delenv(name, raising=False)
    config = cli.load_config(str(DEPLOY / "agent.toml"))
    args = cli.build_parser(config).parse_args(["run"])
    assert (args.server, args.source, args.state_dir, args.dcgm_diag) == (
        "https://nvke.example.com",
        "nvml",
        "/var/lib/nvke-agent",
        1,
    )


def test_the_daemonset_validates_and_its_configuration_is_understood(tmp_path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    objects = [o for o in yaml.safe_load_all((DEPLOY / "daemonset.yaml").read_text()) if o]
    assert [o["kind"] for o in objects] == ["ConfigMap", "DaemonSet"]
    for obj in objects:
        kubernetes_validate.validate(obj, "1.34", strict=True)
    toml = tmp_path / "agent.toml"
    toml.write_text(objects[0]["data"]["agent.toml"])
    args = cli.build_parser(cli.load_config(str(toml))).parse_args(["run"])
    assert (args.server, args.source) == ("http://nvke-web.nvke-system.svc", "nvml")
    pod = objects[1]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["volumes"][0]["hostPath"]["path"] == "/var/lib/nvke-agent"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    # verify needs ExecStart to exist: point it at this environment's nvke-agent
    agent = Path(sys.executable).with_name("nvke-agent")
    unit = (DEPLOY / "nvke-agent.service").read_text()
    assert (
        "ExecStart=/opt/nvke-agent/bin/nvke-agent run --config /etc/nvke-agent/agent.toml" in unit
    )
    path = tmp_path / "nvke-agent.service"
    path.write_text(unit.replace("/opt/nvke-agent/bin/nvke-agent", str(agent)))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    problems = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if "nvke-agent.service" in line and "nvidia-persistenced" not in line
    ]
    assert problems == [], problems
