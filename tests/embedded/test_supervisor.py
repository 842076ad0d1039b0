"""The honcho supervisor with stand-in programs: Ctrl-C, a crash, and processes that resist.

A driver script (a separate process, as honcho installs signal handlers and forks) supervises:

- ``web``: answers 200 on every path and has a child of its own (like gunicorn workers);
- ``stubborn``: ignores SIGTERM, so only honcho's SIGKILL after ``kill_wait`` stops it;
- ``escaper``: starts a grandchild in a new session (outside honcho's process group), which
  only the final sweep of the runner's descendants can find.

Every stand-in writes its pid(s) to ``pids/``; afterwards none may be running.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import textwrap
import time
from pathlib import Path

from .support import (
    PYTHON,
    REPO_ROOT,
    alive,
    all_gone,
    processes_mentioning,
    python_env,
    wait_until,
)

WEB = """
import http.server, os, subprocess, sys
d = sys.argv[2]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", d])
open(os.path.join(d, "web"), "w").write(f"{os.getpid()}\\n{child.pid}\\n")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(sys.argv[1], "stubborn"), "w").write(f"{os.getpid()}\\n")
while True: time.sleep(1)
"""
ESCAPER = """
import os, sys, time
d = sys.argv[1]
pid = os.fork()
if pid == 0:
    os.setsid()
    time.sleep(300)
    os._exit(0)
open(os.path.join(d, "escaper"), "w").write(f"{os.getpid()}\\n{pid}\\n")
time.sleep(300)
"""
FLAKY = """
import os, subprocess, sys, time
# a pool child in its process group, as a Celery worker's prefork children are
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", sys.argv[1]])
with open(os.path.join(sys.argv[1], "flaky-children"), "a") as f:
    f.write(f"{child.pid}\\n")
with open(os.path.join(sys.argv[1], "flaky"), "a") as f:
    f.write(f"{os.getpid()}\\n")
while True: time.sleep(1)
"""
CRASHER = """
import os, sys, time
open(os.path.join(sys.argv[1], "crasher"), "w").write(f"{os.getpid()}\\n")
time.sleep(float(sys.argv[2])); sys.exit(3)
"""
DRIVER = """
import sys
from pathlib import Path
from nvke.embedded.datadir import StateFile
from nvke.embedded.procutil import become_child_subreaper
from nvke.embedded.supervisor import ProcessSpec, Supervisor

tmp, port, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
pids = str(tmp / "pids")
py = sys.executable
specs = [
    ProcessSpec("web", (py, str(tmp / "web.py"), port, pids)),
    ProcessSpec("stubborn", (py, str(tmp / "stubborn.py"), pids)),
    ProcessSpec("escaper", (py, str(tmp / "escaper.py"), pids)),
]
if mode == "crash":
    specs.append(ProcessSpec("crasher", (py, str(tmp / "crasher.py"), pids, "1")))
if mode == "restart":
    specs.append(ProcessSpec("flaky", (py, str(tmp / "flaky.py"), pids), restart=True))
essential = {}
if mode == "essential":  # stands in for the embedded PostgreSQL: not supervised, but vital
    import subprocess
    db = subprocess.Popen([py, "-c", "import time; time.sleep(300)"])
    (tmp / "db.pid").write_text(str(db.pid))
    essential = {"PostgreSQL": db.pid}
become_child_subreaper()
state = StateFile(tmp)
state.update(web={"port": int(port)})
rc = Supervisor(
    specs, {"PATH": "/usr/bin:/bin"}, tmp, state=state,
    health_url=f"http://127.0.0.1:{port}/healthz", banner="STAND-INS READY", kill_wait=2,
    essential=lambda: essential,
).run()
print("SUPERVISOR RC", rc, flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    for name, source in [
        ("web.py", WEB),
        ("stubborn.py", STUBBORN),
        ("escaper.py", ESCAPER),
        ("crasher.py", CRASHER),
        ("flaky.py", FLAKY),
        ("driver.py", DRIVER),
    ]:
        (tmp_path / name).write_text(textwrap.dedent(source))
    (tmp_path / "pids").mkdir()
    return subprocess.Popen(
        [PYTHON, str(tmp_path / "driver.py"), str(tmp_path), str(_free_port()), mode],
        cwd=REPO_ROOT,
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _recorded_pids(tmp_path: Path) -> list[int]:
    return [int(x) for f in (tmp_path / "pids").iterdir() for x in f.read_text().split()]


def test_sigint_stops_every_process_including_stubborn_and_escaped_ones(tmp_path: Path) -> None:
    driver = _start(tmp_path, "signal")
    state_file = tmp_path / "services.json"

    def ready() -> bool:
        try:
            return json.loads(state_file.read_text()).get("web", {}).get("ready") is True
        except (OSError, ValueError):
            return False

    assert wait_until(ready, 30), driver.stdout and driver.stdout.read()
    assert wait_until(lambda: len(list((tmp_path / "pids").iterdir())) == 3, 10)
    state = json.loads(state_file.read_text())
    assert set(state["processes"]) == {"web", "stubborn", "escaper"}
    assert all(p["pid"] and p["create_time"] for p in state["processes"].values())
    pids = _recorded_pids(tmp_path)
    assert len(pids) == 5

    started = time.monotonic()
    driver.send_signal(signal.SIGINT)
    out, _ = driver.communicate(timeout=40)

    assert "STAND-INS READY" in out
    assert "SUPERVISOR RC 130" in out
    assert time.monotonic() - started < 30
    assert all_gone(pids) == []
    assert processes_mentioning(str(tmp_path)) == []


def test_a_crashing_process_stops_all_the_others(tmp_path: Path) -> None:
    driver = _start(tmp_path, "crash")

    out, _ = driver.communicate(timeout=40)

    assert "SUPERVISOR RC 3" in out
    assert "crasher stopped (rc=3)" in out
    assert all_gone(_recorded_pids(tmp_path)) == []
    assert processes_mentioning(str(tmp_path)) == []


def _state(tmp_path: Path) -> dict:
    try:
        return json.loads((tmp_path / "services.json").read_text())
    except (OSError, ValueError):
        return {}


def test_a_restartable_process_killed_comes_back_with_backoff_and_is_recorded(
    tmp_path: Path,
) -> None:
    driver = _start(tmp_path, "restart")
    assert wait_until(lambda: _state(tmp_path).get("web", {}).get("ready") is True, 30)
    first = _state(tmp_path)["processes"]["flaky"]["pid"]
    assert wait_until(lambda: (tmp_path / "pids" / "flaky").exists(), 10)

    os.kill(first, signal.SIGKILL)
    # back after the first backoff step (1 s), with its new pid in services.json
    assert wait_until(lambda: _state(tmp_path)["processes"]["flaky"]["pid"] != first, 15)
    second = _state(tmp_path)["processes"]["flaky"]["pid"]
    assert wait_until(lambda: len((tmp_path / "pids" / "flaky").read_text().split()) == 2, 10)
    assert (tmp_path / "pids" / "flaky").read_text().split() == [str(first), str(second)]
    # the killed process's pool child (left in its process group, reparented) was stopped
    # before the restart: no orphan keeps running tasks beside the new worker
    children = [int(p) for p in (tmp_path / "pids" / "flaky-children").read_text().split()]
    assert len(children) == 2
    assert all_gone([children[0]]) == []
    assert alive(children[1])  # the new one's child runs
    assert driver.poll() is None  # the others kept running

    driver.send_signal(signal.SIGINT)
    out, _ = driver.communicate(timeout=40)
    assert "flaky exited (rc=-9); restarting in 1s (restart 1 in a row)" in out
    assert "SUPERVISOR RC 130" in out
    assert all_gone(_recorded_pids(tmp_path)) == []
    assert processes_mentioning(str(tmp_path)) == []


def test_the_death_of_an_essential_service_ends_the_run_naming_it(tmp_path: Path) -> None:
    driver = _start(tmp_path, "essential")
    assert wait_until(lambda: _state(tmp_path).get("web", {}).get("ready") is True, 30)
    os.kill(int((tmp_path / "db.pid").read_text()), signal.SIGKILL)

    out, _ = driver.communicate(timeout=40)

    assert "PostgreSQL exited: stopping everything" in out
    assert "SUPERVISOR RC 1" in out
    assert all_gone(_recorded_pids(tmp_path)) == []
