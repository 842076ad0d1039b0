"""Real ``nvke-agent`` processes against the live server, in the faults a trial found (issue 29):

* a state dir on a small tmpfs that is full, or read-only, at start (mounted as root inside
  ``unshare -m``): the agent stays up, delivers what is spooled, makes no new reports
  (counted as dropped) and says so on ``/healthz``, ``/metrics`` and in its reports (the host
  gets an ``agent spool:`` warning) — before, it died on ENOSPC at every start;
* two agents run from one state dir (a copy beside the original): the host is flagged with
  the evidence kept — before, the copy's batches were acknowledged as duplicates and its
  samples dropped silently; a restarted agent is not flagged.
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

import pytest

from tests.e2e.conftest import (
    BIN,
    ROOT,
    free_port,
    register_host,
    replay_file,
    service_env,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def agent_args(server: str, state_dir, replay, *extra: str) -> list[str]:
    return [
        str(BIN / "nvke-agent"), "run", "--server", server, "--state-dir", str(state_dir),
        "--source", "replay", "--replay", str(replay), "--interval", "0.2",
        "--retry-base-s", "0.2", "--retry-cap-s", "0.5", *extra,
    ]  # fmt: skip


@pytest.fixture
def host(live_server, catalog):
    return register_host(live_server.url)[1]


def run(args: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(
        args, cwd=ROOT, env=service_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def registered(live_server, host, tmp_path):
    """A registered state dir (the agent ran once, everything delivered)."""
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    first = replay_file(tmp_path / "first.jsonl", host["gpus"], [t0, t0 + timedelta(seconds=1)])
    state = tmp_path / "state"
    token = host["bootstrap_token"]
    run([*agent_args(live_server.url, state, first, "--no-rebase", "--bootstrap-token"), token])
    return state


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="mounting a tmpfs inside unshare -m needs root and util-linux's unshare",
)
@pytest.mark.parametrize("fault", ["full", "read-only", "full, spool empty"])
def test_an_agent_whose_state_dir_cannot_be_written_stays_up_and_delivers_its_spool(
    live_server, host, tmp_path, fault
):
    from fleet.models import AgentReport, Host

    state = registered(live_server, host, tmp_path)
    acked = set(AgentReport.objects.values_list("seq", flat=True))
    looping = replay_file(tmp_path / "loop.jsonl", host["gpus"], [datetime.now(UTC)])
    spool_empty = fault == "full, spool empty"

    def spooled_now() -> set[int]:
        return {
            json.loads(line)["seq"]
            for segment in (state / "spool").glob("seg-*.jsonl")
            for line in segment.read_text().splitlines()
            if line.endswith("}")  # a line being written is read next time
        } - acked

    if not spool_empty:
        # an API outage: the agent spools batches against a closed port until it holds 3
        # (waited for, not slept: under load the agent's start alone took over 1.5 s)
        dead = f"http://127.0.0.1:{free_port()}"
        outage = subprocess.Popen(
            agent_args(dead, state, looping, "--loop"), cwd=ROOT, env=service_env(),
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while len(spooled_now()) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        outage.send_signal(signal.SIGTERM)
        assert outage.wait(30) == 0
    spooled = spooled_now()
    # with an empty spool nothing is left to carry agent_status: status reports say it
    assert len(spooled) >= 3 if not spool_empty else spooled == set()

    mnt, port = tmp_path / "mnt", free_port()
    mnt.mkdir()
    break_it = (
        f"dd if=/dev/zero of={mnt}/fill bs=4k 2>/dev/null || true"
        if fault != "read-only"
        else f"mount -o remount,ro {mnt}"
    )
    probe = (
        "import json, urllib.request, urllib.error\n"
        "def get(p):\n"
        "    try:\n"
        f"        r = urllib.request.urlopen('http://127.0.0.1:{port}' + p, timeout=5)\n"
        "        return r.status, r.read().decode()\n"
        "    except urllib.error.HTTPError as e:\n"
        "        return e.code, e.read().decode()\n"
        "print(json.dumps({'healthz': get('/healthz'), 'metrics': get('/metrics')}))\n"
    )
    fill_rest = f"dd if=/dev/zero of={mnt}/fill2 bs=1k 2>/dev/null || true"
    if fault == "read-only":
        fill_rest = ""
    script = f"""
set -e
mount -t tmpfs -o size=512k tmpfs {mnt}
cp -a {state}/. {mnt}/
{break_it}
{" ".join(agent_args(live_server.url, mnt, looping, "--loop", "--metrics-address"))} \
    127.0.0.1:{port} 2>{tmp_path}/agent.err &
pid=$!
sleep 4
{fill_rest}
sleep 3
{sys.executable} -c "{probe}"
kill -0 $pid && echo ALIVE
kill -TERM $pid
wait $pid && echo EXIT=0
"""
    proc = subprocess.Popen(
        ["unshare", "-m", "sh", "-c", script], cwd=ROOT, env=service_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def spool_warning() -> str | None:
        warnings = Host.objects.get(pk=host["id"]).warnings
        return next((w for w in warnings if w.startswith("agent spool:")), None)

    # the reports it sends say so: the host carries the warning (shown on the console)
    warning = wait_for(spool_warning, timeout=20, interval=0.1, what="the agent spool warning")
    reports_at_warning = AgentReport.objects.count()
    stdout, stderr = proc.communicate(timeout=120)
    err = (tmp_path / "agent.err").read_text()
    assert proc.returncode == 0, stderr[-2000:] + err[-3000:]
    lines = stdout.splitlines()
    probed = json.loads(lines[0])
    assert lines[1:] == ["ALIVE", "EXIT=0"], stdout + err[-3000:]

    # every spooled batch was delivered
    assert spooled <= set(AgentReport.objects.values_list("seq", flat=True)), err[-3000:]
    if spool_empty:  # the disk stayed full: only status reports went out, claiming no seq
        assert AgentReport.objects.count() == reports_at_warning
        assert err.count("status report acknowledged") >= 3, err[-3000:]
    errno_text = "[Errno 30]" if fault == "read-only" else "[Errno 28] No space left on device"
    status, body = probed["healthz"]
    health = json.loads(body)
    assert (status, health["status"], health["spool_writable"]) == (200, "degraded", False)
    assert health["spool_error"].startswith(errno_text)
    assert health["dropped_reports"] >= 1 and health["dropped_samples"] >= 1
    assert "nvke_agent_spool_writable 0.0" in probed["metrics"][1]
    assert "nvke_agent_dropped_reports_total" in probed["metrics"][1]
    assert errno_text in warning
    if fault == "read-only":  # one clear line at start
        assert err.count("cannot be written") == 1, err[-3000:]


def test_two_agents_from_one_state_dir_flag_the_host_and_a_restart_does_not(
    live_server, host, tmp_path
):
    from fleet.models import AgentReport, Host, HostEvent

    state = registered(live_server, host, tmp_path)
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=4)
    again = replay_file(tmp_path / "again.jsonl", host["gpus"], [t0, t0 + timedelta(seconds=1)])
    run(agent_args(live_server.url, state, again, "--no-rebase"))  # restarted: not flagged
    assert not HostEvent.objects.filter(kind="identity").exists()
    assert not any("agent identity" in w for w in Host.objects.get(pk=host["id"]).warnings)

    copy = tmp_path / "copy"
    shutil.copytree(state, copy)
    times = [t0 + timedelta(seconds=10 + i) for i in range(6)]
    mine = replay_file(tmp_path / "a.jsonl", host["gpus"], times, util=10.0)
    theirs = replay_file(
        tmp_path / "b.jsonl", host["gpus"], [t + timedelta(seconds=100) for t in times], 60.0
    )
    procs = [
        subprocess.Popen(
            agent_args(live_server.url, folder, replay, "--no-rebase"),
            cwd=ROOT,
            env=service_env(),
            stderr=subprocess.PIPE,
            text=True,
        )
        for folder, replay in ((state, mine), (copy, theirs))
    ]
    errs = [proc.communicate(timeout=120)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], errs

    events = list(HostEvent.objects.filter(kind="identity"))
    assert events, "two agents with one identity went unnoticed"
    first = events[0].data
    assert first["first"]["instance_id"] != first["again"]["instance_id"]
    stored = AgentReport.objects.get(host_id=host["id"], seq=first["seq"])
    assert stored.instance_id == first["first"]["instance_id"]
    assert first["body"]["samples"], "the evidence keeps the other agent's samples"
    (warning,) = [w for w in Host.objects.get(pk=host["id"]).warnings if "agent identity" in w]
    assert "two agents report as this host" in warning
    assert any("another agent is using this host's identity" in err for err in errs)
