"""The production gunicorn settings (nvke/gunicorn_conf.py) as gunicorn runs them."""

from __future__ import annotations

import gc
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_startup_freeze_moves_the_loaded_application_out_of_the_collectors_reach():
    from nvke.gunicorn_conf import freeze_startup_objects

    try:
        frozen = freeze_startup_objects()
        assert frozen > 50_000  # Django, DRF, every app and view module: no garbage
        # what it froze stays in the permanent generation; a frozen object freed by its
        # reference count leaves it (the CI run saw 8 fewer by the time it read the count)
        assert frozen * 0.99 < gc.get_freeze_count() <= frozen
        # what the collector still walks is what was made after the freeze
        assert len(gc.get_objects()) < frozen / 5
    finally:
        gc.unfreeze()


def test_each_worker_freezes_its_startup_objects(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "gunicorn.log"
    server = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("gunicorn")),
            "-c",
            "python:nvke.gunicorn_conf",
            "nvke.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
            "--log-level",
            "info",
            "--access-logfile",
            "/dev/null",
        ],
        cwd=ROOT,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            frozen = re.findall(r"gc: (\d+) start-up objects frozen", log.read_text())
            if len(frozen) == 2:
                break
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert all(int(n) > 50_000 for n in frozen), frozen
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
            assert resp.status == 200
    finally:
        server.terminate()
        server.wait(30)
