"""Smoke test of ``make run`` itself: a fresh data dir, embedded PostgreSQL and Redis from pip
packages, ``/readyz``, the README's curl tour executed as written, Ctrl-C, no process left."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import ROOT, wait_for

pytestmark = pytest.mark.e2e

SERVICE_ENV = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "TEST_DATABASE_NAME")


def readme_tour() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- tour:start -->\s*```bash\n(.*?)```\s*<!-- tour:end -->", text, re.S)
    assert block, "README.md lost its tour block"
    return block.group(1)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def processes_mentioning(needle: str) -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmdline and alive(int(proc.name)):
            out.append(f"{proc.name}: {cmdline[:120]}")
    return out


def test_make_run_serves_the_readme_tour_and_ctrl_c_leaves_nothing(tmp_path):
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_ENV}
    env.update(NVKE_DATA_DIR=str(data), PORT="0", PYTHONUNBUFFERED="1")
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen(
        ["make", "run"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    services: dict = {}
    try:

        def ready():
            nonlocal services
            try:
                services = json.loads((data / "services.json").read_text())
            except (OSError, ValueError):
                return False
            return (services.get("web") or {}).get("ready") and services

        wait_for(ready, timeout=240, interval=1, what="make run to be ready")
        url = services["web"]["url"].rstrip("/")
        ready_body = requests.get(f"{url}/readyz", timeout=10).json()
        assert ready_body == {"status": "ready", "checks": {"database": "ok", "redis": "ok"}}
        tour = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", readme_tour()],
            cwd=ROOT,
            env={**env, "NVKE": url},
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert tour.returncode == 0, tour.stdout + tour.stderr
        out = tour.stdout
        assert "GPU-513536b6-7d19-9063-b049-1e69664bb298" in out
        assert "NVIDIA RTX 4000 SFF Ada Generation" in out  # refused, naming the product
        assert "1g.18gb" in out and "1g.20gb" in out  # the refusal lists valid profiles
        assert "DELETE_CLUSTER" in out
        assert out.rstrip().splitlines()[-2] == "AVAILABLE"
        hosts = requests.get(
            f"{url}/api/v1/fleet/hosts",
            headers={"Authorization": f"Bearer {(data / 'operator-api-key').read_text().strip()}"},
            timeout=10,
        ).json()["results"]
        demo = {h["hostname"]: h for h in hosts}
        assert {"gpu-a10g-01", "gpu-t4-01", "gpu-a100-01"} <= set(demo)
        assert demo["gpu-a10g-01"]["last_report_seq"] >= 1  # the demo agents report
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        log.close()
    pids = [p["pid"] for p in (services.get("processes") or {}).values() if p.get("pid")]
    for name in ("postgres", "redis"):
        if (services.get(name) or {}).get("pid"):
            pids.append(services[name]["pid"])
    time.sleep(0.5)
    assert [pid for pid in pids if alive(pid)] == [], (tmp_path / "run.log").read_text()[-3000:]
    assert processes_mentioning(str(data)) == []
