"""Smoke test of ``make run`` itself: a fresh data dir, embedded PostgreSQL and Redis from pip
packages, ``/readyz``, the start-up banner's URLs and demo login, the curl tour
(docs/getting-started/tour.md, repeated in README.md) executed as written, the worker and beat
killed with SIGKILL and restarted by the supervisor, Ctrl-C, no process or socket left.

One ``make run`` serves the whole module (it takes a minute to start); the tests run in file
order and the last one stops it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.docs_blocks import bash_block
from tests.e2e.conftest import ROOT, wait_for
from tests.embedded.support import alive, all_gone, processes_mentioning

pytestmark = pytest.mark.e2e

SERVICE_ENV = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "TEST_DATABASE_NAME")


def readme_tour() -> str:
    """The curl tour (docs/getting-started/tour.md; README.md shows the same block)."""
    return bash_block("tour")


class MakeRun:
    """A ``make run`` on a fresh data folder, its log and the last ``services.json`` read."""

    def __init__(self, tmp: Path) -> None:
        self.data = tmp / "data"
        self.log_path = tmp / "run.log"
        self.env = {k: v for k, v in os.environ.items() if k not in SERVICE_ENV}
        # the default provider: the tour's cluster gets a real API (tests/hosted's binaries)
        self.env.update(
            NVKE_DATA_DIR=str(self.data), PORT="0", PYTHONUNBUFFERED="1",
            NVKE_DEFAULT_PROVIDER="hosted",
        )  # fmt: skip
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            ["make", "run"],
            cwd=ROOT,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.services: dict = {}
        self.seen_pids: set[int] = set()

    def read_services(self) -> dict:
        try:
            self.services = json.loads((self.data / "services.json").read_text())
        except (OSError, ValueError):
            return {}
        self.seen_pids |= set(self.pids().values())
        return self.services

    def pids(self) -> dict[str, int]:
        return {
            n: p["pid"] for n, p in (self.services.get("processes") or {}).items() if p.get("pid")
        }

    @property
    def url(self) -> str:
        return self.services["web"]["url"].rstrip("/")

    def key(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {(self.data / name).read_text().strip()}"}

    def tail(self) -> str:
        return self.log_path.read_text()[-4000:]

    def stop(self) -> int:
        """Ctrl-C in the terminal; returns make's exit code."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                raise
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def make_run(tmp_path_factory):
    from tests.hosted.conftest import require_binaries

    require_binaries(("etcd", "v1.36", "kwok"))
    run = MakeRun(tmp_path_factory.mktemp("make-run"))
    try:
        wait_for(
            lambda: (run.read_services().get("web") or {}).get("ready"),
            timeout=240,
            interval=1,
            what="make run to be ready",
        )
        yield run
    finally:
        run.stop()


def test_make_run_serves_the_readme_tour(make_run):
    url = make_run.url
    ready_body = requests.get(f"{url}/readyz", timeout=10).json()
    assert ready_body == {"status": "ready", "checks": {"database": "ok", "redis": "ok"}}
    tour = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_tour()],
        cwd=ROOT,
        env={**make_run.env, "NVKE": url},
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert tour.returncode == 0, tour.stdout + tour.stderr
    out = tour.stdout
    assert "GPU-513536b6-7d19-9063-b049-1e69664bb298" in out
    assert "NVIDIA RTX 4000 SFF Ada Generation" in out  # refused, naming the product
    assert "1g.18gb" in out and "1g.20gb" in out  # the refusal lists valid profiles
    assert "Server Version: v1.36.3" in out  # kubectl against the cluster's own API
    assert re.search(r"^kube-system +Active", out, re.M)  # kubectl get namespaces
    # the pool's node in the cluster's API: Ready (KWOK), 4 MIG 1g.20gb devices (single)
    assert re.search(
        r"^\S+ +Ready +<none> +\S+ +v1\.36\.3 +NVIDIA-A100-SXM4-80GB-MIG-1g\.20gb$", out, re.M
    )
    assert "nvidia.com/gpu: 4\n" in out
    # the H100 node: 8 whole GPUs and GFD's labels, a Job on one of them, then MIG mixed
    # (7 x 1g.10gb on 8 GPUs) and single (the MIG devices counted as nvidia.com/gpu)
    h100 = re.search(r"^(\S+) +Ready +<none> +\S+ +v1\.36\.3 +NVIDIA-H100-80GB-HBM3 +8$", out, re.M)
    assert h100, out
    assert "job.batch/cuda condition met\n" in out
    assert f"\n{h100.group(1)}\n" in out  # the Job's pod ran on the H100 node
    assert "nvidia.com/mig-1g.10gb: 56\n" in out
    assert "nvidia.com/gpu: 56\n" in out
    assert re.search(
        rf"^{re.escape(h100.group(1))} +Ready +<none> +\S+ +v1\.36\.3 +"
        r"NVIDIA-H100-80GB-HBM3-MIG-1g\.10gb$",
        out,
        re.M,
    ), out
    assert "DELETE_CLUSTER" in out
    assert out.rstrip().splitlines()[-2] == "AVAILABLE"
    hosts = requests.get(
        f"{url}/api/v1/fleet/hosts", headers=make_run.key("operator-api-key"), timeout=10
    ).json()["results"]
    demo = {h["hostname"]: h for h in hosts}
    assert {"gpu-a10g-01", "gpu-t4-01", "gpu-a100-01"} <= set(demo)
    assert demo["gpu-a10g-01"]["last_report_seq"] >= 1  # the demo agents report


def banner_lines(log: str) -> dict[str, str]:
    """``{label: value}`` of the start-up banner (the lines after ``NVKE is up``)."""
    block = log.split("NVKE is up\n", 1)[1].split("Press Ctrl-C", 1)[0]
    found = {}
    for line in block.splitlines():
        line = line.split("| ", 1)[-1]  # the supervisor's "10:12:21 nvke  | " prefix
        label, _, value = line.strip().partition("  ")
        if label and value:
            found[label] = value.strip()
    return found


def test_the_banner_urls_answer_and_its_demo_login_works(make_run):
    banner = banner_lines(make_run.log_path.read_text())
    url = make_run.url
    assert banner["API"] == f"{url}/api/v1/"
    assert banner["portal"].startswith(f"{url}/ ")
    assert banner["console"].startswith(f"{url}/console/ ")
    # each URL answers: the API's root (its index), a collection (401 without a key,
    # problem+json), its docs, the portal's login
    root = requests.get(banner["API"], timeout=10)
    assert root.status_code == 200 and root.json()["docs"] == "/api/v1/docs/"
    api = requests.get(banner["API"] + "clusters", timeout=10)
    assert api.status_code == 401 and api.headers["Content-Type"] == "application/problem+json"
    docs = requests.get(banner["API docs"], timeout=10)
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    for page in (banner["portal"].split()[0], banner["console"].split()[0]):
        r = requests.get(page, timeout=10)  # both send an anonymous visitor to the login page
        assert r.status_code == 200 and r.url.startswith(f"{url}/login"), (page, r.url)
    assert requests.get(banner["readiness"], timeout=10).json()["status"] == "ready"
    # the manage.py line's env file holds the embedded services' addresses
    env_file = Path(banner["manage.py"].split(". ", 1)[1].split(";", 1)[0])
    assert "DATABASE_URL=" in env_file.read_text() and env_file.parent == make_run.data
    key = Path(banner["demo tenant key"]).read_text().strip()
    me = requests.get(
        f"{url}/api/v1/clusters", headers={"Authorization": f"Bearer {key}"}, timeout=10
    )
    assert me.status_code == 200

    # the demo login: "demo (owner of the demo tenant), password in <file>"
    username, _, rest = banner["demo logins"].partition(" ")
    password = Path(rest.rsplit("password in ", 1)[1]).read_text().strip()
    session = requests.Session()
    login_page = session.get(f"{url}/login", timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page.text).group(1)
    after = session.post(
        f"{url}/login",
        data={"username": username, "password": password, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{url}/login"},
        timeout=10,
    )
    assert after.status_code == 200 and not after.url.startswith(f"{url}/login"), after.url
    clusters = session.get(f"{url}/clusters", timeout=10)
    assert clusters.status_code == 200 and "Log out" in clusters.text


def test_a_password_reset_is_mailed_into_the_data_dir_and_no_log_line_holds_its_link(make_run):
    """Issue 26 leftover: make run printed reset mails, link and all, to its log. Now they are
    files in <data dir>/mail (the banner's "mail" line); the link works, the log never has it."""
    banner = banner_lines(make_run.log_path.read_text())
    outbox = Path(banner["mail"].split()[0])
    assert outbox == make_run.data / "mail"
    env_file = Path(banner["manage.py"].split(". ", 1)[1].split(";", 1)[0])
    username = banner["demo logins"].split()[0]
    code = (
        "from django.contrib.auth import get_user_model; "
        f"get_user_model().objects.filter(username={username!r})"
        ".update(email='demo@example.com')"
    )
    subprocess.run(
        ["bash", "-c", f'set -a; . "{env_file}"; set +a; exec "$0" manage.py shell -c "$1"',
         sys.executable, code],
        cwd=ROOT, env=make_run.env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    url = make_run.url
    session = requests.Session()
    form = session.get(f"{url}/password-reset", timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    sent = session.post(
        f"{url}/password-reset",
        data={"email": "demo@example.com", "csrfmiddlewaretoken": token},
        headers={"Referer": f"{url}/password-reset"},
        timeout=10,
        allow_redirects=False,
    )
    assert sent.status_code == 302, sent.text[:300]
    (mailed,) = outbox.iterdir()
    text = mailed.read_text()
    # (its origin is NVKE_PUBLIC_URL, which the test process's environment may set)
    links = re.findall(r"^https?://\S+?/password-reset/(\S+)/(\S+?)/?$", text, re.M)
    assert len(links) == 1, text
    uid, reset_token = links[0]
    page = session.get(f"{url}/password-reset/{uid}/{reset_token}", timeout=10)
    assert page.status_code == 200 and "new_password1" in page.text
    if make_run.env.get("LOG_LEVEL", "INFO").upper() in ("DEBUG", "INFO"):  # a request log
        wait_for(
            lambda: "/password-reset/[redacted]" in make_run.log_path.read_text(),
            timeout=30,
            what="the request in the log",
        )
    assert reset_token not in make_run.log_path.read_text()


def test_a_killed_worker_and_beat_come_back_and_a_new_cluster_reaches_running(make_run):
    before = make_run.pids()
    for name in ("worker", "beat"):
        os.kill(before[name], signal.SIGKILL)

    def restarted():
        now = make_run.read_services() and make_run.pids()
        return all(now.get(n) and now[n] != before[n] and alive(now[n]) for n in ("worker", "beat"))

    wait_for(restarted, timeout=60, interval=0.5, what="the supervisor to restart both")
    assert make_run.proc.poll() is None, make_run.tail()
    assert alive(make_run.pids()["web"]) and make_run.pids()["web"] == before["web"]
    log = make_run.log_path.read_text()
    assert "worker exited (rc=-9); restarting in 1s" in log
    assert "beat exited (rc=-9); restarting in 1s" in log

    tenant = {**make_run.key("demo-tenant-api-key"), "Content-Type": "application/json"}
    created = requests.post(
        f"{make_run.url}/api/v1/clusters",
        headers=tenant,
        json={"name": "after-sigkill", "kubernetes_version": "1.36", "region": "us-east-1"},
        timeout=10,
    )
    assert created.status_code == 202, created.text
    cluster = created.json()["target_id"]

    def phase():
        r = requests.get(f"{make_run.url}/api/v1/clusters/{cluster}", headers=tenant, timeout=10)
        return r.json()["phase"] == "RUNNING" and r.json()

    body = wait_for(phase, timeout=120, interval=1, what="the new cluster to reach RUNNING")
    assert body["name"] == "after-sigkill"


def test_ctrl_c_leaves_no_process_and_no_socket(make_run):
    services = make_run.read_services()
    sockets = [
        Path(services["redis"]["socket"]),
        Path(services["postgres"]["socket"]),
    ]
    assert all(s.exists() for s in sockets)
    pids = set(make_run.seen_pids)
    for name in ("postgres", "redis"):
        pids.add(services[name]["pid"])

    # make itself dies of the SIGINT it forwards (-2); the runner below it exits 0
    assert make_run.stop() in (0, -signal.SIGINT), make_run.tail()
    assert "embedded INFO stopped" in make_run.tail()
    assert "exited: stopping everything" not in make_run.log_path.read_text()

    assert all_gone(pids, timeout=5) == [], make_run.tail()
    assert [s for s in sockets if s.exists()] == []
    assert processes_mentioning(str(make_run.data)) == []
