"""One tenant's slow endpoints do not stall another's webhooks or clusters (issue 26, item 3).

The report: 30 endpoints on a tarpit and one event took another tenant's delivery from 0.1 s to
151 s and, under ``make run``'s single worker, its cluster create from 2.1 s to 8.3 s. Here the
workers run as ``make run`` runs them — one Celery worker for reconcile/telemetry/billing/
default and the ``webhooks`` worker (threads) — against the live server. The attacker sits at
its endpoint cap (the next one is a 409 naming the setting), every endpoint a tarpit that
accepts and never answers, and fires 20 events (400 deliveries). Then the victim creates a
cluster: the create takes at most the baseline measured in this test + 2 s, and the victim's
delivery of its ``operation.finished`` starts at most 5 s after the event. The tarpit never
holds more than the attacker's share of connections at once."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from datetime import datetime

import pytest
import requests

from tests.e2e.conftest import BIN, ROOT, service_env, stop, wait_for
from tests.helpers import broker_client
from tests.webhooks.receiver import Receiver, start

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ENV = {
    "NVKE_WEBHOOK_ALLOW_HTTP": "true",
    "NVKE_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
}
EVENTS = 20


class Tarpit:
    """Accepts connections on 127.0.0.1 and never answers; counts them, and the most open at
    once."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.open = 0
        self.most_open = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.open += 1
                self.most_open = max(self.most_open, self.open)
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        try:
            while conn.recv(65536):
                pass  # read the request, answer nothing
        except OSError:
            pass
        finally:
            conn.close()
            with self.lock:
                self.open -= 1

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def workers(transactional_db, tmp_path):
    """The two workers of ``make run`` (nvke.embedded.supervisor.default_processes)."""
    from nvke.embedded.supervisor import default_processes

    broker_client().flushdb()
    specs = {p.name: p for p in default_processes(data_dir=tmp_path, port=1)}
    procs = []
    for name in ("worker", "webhooks"):
        argv = [str(BIN / "celery"), *specs[name].argv[specs[name].argv.index("-A") :]]
        argv += ["--without-heartbeat", "--without-mingle", "--without-gossip"]
        log = (tmp_path / f"{name}.log").open("w")
        procs.append(
            (
                subprocess.Popen(
                    argv,
                    cwd=ROOT,
                    env=service_env(**ENV),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                ),
                log,
            )
        )
    yield
    for proc, log in procs:
        stop(proc)
        log.close()


@pytest.fixture
def webhook_settings(settings):
    settings.NVKE_WEBHOOK_ALLOW_HTTP = True
    settings.NVKE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]


def session(tenant) -> requests.Session:
    from tenants.services import create_api_key

    s = requests.Session()
    s.headers["Authorization"] = "Bearer " + create_api_key(tenant=tenant, name="a")[1]
    return s


def create_cluster(client, api: str, name: str) -> tuple[float, str]:
    """Seconds from POST to the operation DONE, and the operation's id."""
    started = time.monotonic()
    op = client.post(
        f"{api}/clusters",
        json={"name": name, "kubernetes_version": "1.36", "region": "us-east-1"},
        timeout=30,
    ).json()

    def done() -> bool:
        status = client.get(f"{api}/operations/{op['id']}", timeout=30).json()["status"]
        assert status != "FAILED"
        return status == "DONE"

    wait_for(done, timeout=120, interval=0.05, what=f"cluster {name}")
    return time.monotonic() - started, op["id"]


def delivery_delay_s(receiver: Receiver, operation_id: str) -> float:
    """Seconds from the event's time to the receiver getting its delivery."""
    (got,) = [r for r in receiver.received if json.loads(r.body)["subject"] == operation_id]
    event_at = datetime.fromisoformat(json.loads(got.body)["time"]).timestamp()
    received_at = time.time() - (time.monotonic() - got.at)
    return received_at - event_at


def test_a_tenant_at_its_cap_on_a_tarpit_does_not_stall_another(
    live_server, workers, webhook_settings, import_capture, tenant_a, tenant_b, settings
):
    from webhooks import services

    import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b")
    api = f"{live_server.url}/api/v1"
    victim, attacker = session(tenant_a), session(tenant_b)
    receiver = Receiver()
    server = start(receiver)
    tarpit = Tarpit()
    try:
        made = victim.post(
            f"{api}/webhooks",
            json={"url": receiver.url, "event_types": ["operation.finished"]},
            timeout=30,
        ).json()
        receiver.secrets = [made["secret"]]

        baseline_s, op = create_cluster(victim, api, "baseline")
        wait_for(lambda: len(receiver.received) == 1, timeout=30, what="baseline delivery")
        baseline_delay = delivery_delay_s(receiver, op)

        cap = settings.NVKE_MAX_WEBHOOK_ENDPOINTS_PER_TENANT
        for i in range(cap + 1):
            answer = attacker.post(
                f"{api}/webhooks",
                json={"url": f"http://127.0.0.1:{tarpit.port}/t{i}", "event_types": ["quota.80"]},
                timeout=30,
            )
            assert answer.status_code == (201 if i < cap else 409), answer.text
        assert answer.json()["setting"] == "NVKE_MAX_WEBHOOK_ENDPOINTS_PER_TENANT"
        for i in range(EVENTS):
            services.emit(
                tenant_id=tenant_b.id, event_type="quota.80", source="/t", subject=f"e{i}", data={}
            )
        wait_for(lambda: tarpit.accepted >= 1, timeout=30, what="the tarpit to be hit")

        attacked_s, op = create_cluster(victim, api, "under-attack")
        wait_for(lambda: len(receiver.received) == 2, timeout=30, what="the victim's delivery")
        attacked_delay = delivery_delay_s(receiver, op)
        print(
            f"cluster create: baseline {baseline_s:.2f} s, under attack {attacked_s:.2f} s; "
            f"victim delivery: baseline {baseline_delay:.2f} s, under attack "
            f"{attacked_delay:.2f} s; tarpit accepted {tarpit.accepted}, at most "
            f"{tarpit.most_open} open at once"
        )
        assert attacked_s <= baseline_s + 2
        assert attacked_delay <= 5
        assert tarpit.most_open <= settings.NVKE_WEBHOOK_TENANT_CONCURRENCY
    finally:
        server.shutdown()
        tarpit.close()
