"""Checkpoint-aware disruption end to end: a real Celery worker drives a driver upgrade of a
pool with a disruption hook; the real webhook delivery (signed CloudEvent
``nodepool.disruption.requested``) reaches a real HTTP receiver on 127.0.0.1, which — as a
training job's controller would — checkpoints for 5 s, then acknowledges through the API of
Django's live server. The node is drained right after the ack, not before, and never by the
delivery's 200."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tests.e2e.conftest import start_worker, stop, wait_for
from tests.helpers import running_h100_pool

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

EVENT = "nodepool.disruption.requested"
CHECKPOINT_S = 5.0
WEBHOOK_ENV = {"NVKE_WEBHOOK_ALLOW_HTTP": "true", "NVKE_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8"}


class Tenant:
    """The tenant's side: an HTTP receiver that acknowledges CHECKPOINT_S after the event,
    reading what NVKE says just before (the request, the operation)."""

    def __init__(self, api: str, key: str, op_url: str = "") -> None:
        self.api, self.op_url = api, op_url
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {key}"
        self.events: list[tuple[float, dict]] = []
        self.before_ack: dict = {}
        self.acked_at: float | None = None
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/nvke"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handler(self):
        tenant = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                event = json.loads(body)
                tenant.events.append((time.monotonic(), event))
                if event["type"] == f"dev.nvke.{EVENT}" and len(tenant.events) == 1:
                    threading.Timer(CHECKPOINT_S, tenant.ack, (event["data"],)).start()
                self.send_response(200)  # received: not an ack
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        return Handler

    def ack(self, data: dict) -> None:
        request = self.session.get(
            f"{self.api}{data['ack']['url'].removesuffix('/ack')}", timeout=30
        ).json()
        op = self.session.get(self.op_url, timeout=30).json()
        self.before_ack = {"request": request, "op": op}
        resp = self.session.post(f"{self.api}{data['ack']['url']}", timeout=30)
        assert resp.status_code == 200, resp.text
        self.acked_at = time.monotonic()


def test_a_driver_upgrade_waits_for_the_ack_the_receiver_sends_through_the_api_5_s_later(
    live_server, owner, make_host, tenant_a, settings, tmp_path
):
    from nodepools.models import DisruptionRequest, Node
    from tenants.services import create_api_key

    settings.NVKE_WEBHOOK_ALLOW_HTTP = True
    settings.NVKE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    cluster, pool_id = running_h100_pool(owner, make_host, hosts=2, nodes=1)
    (node,) = Node.objects.filter(nodepool_id=pool_id)
    api = f"{live_server.url}"
    pool_url = f"/api/v1/clusters/{cluster}/nodepools/{pool_id}"
    tenant = Tenant(api, create_api_key(tenant=tenant_a, name="ctl", role="owner")[1])
    hook = tenant.session.put(
        f"{api}{pool_url}/disruption-hook", json={"checkpoint_deadline_s": 120}, timeout=30
    )
    assert hook.json() == {"checkpoint_deadline_s": 120}, hook.text
    made = tenant.session.post(
        f"{api}/api/v1/webhooks", json={"url": tenant.url, "event_types": [EVENT]}, timeout=30
    )
    assert made.status_code == 201, made.text

    proc, log = start_worker(tmp_path, **WEBHOOK_ENV)
    try:
        op = tenant.session.post(
            f"{api}{pool_url}/upgrade", json={"driver_version": "580.95.05"}, timeout=30
        ).json()
        tenant.op_url = f"{api}/api/v1/operations/{op['id']}"
        released = wait_for(
            lambda: DisruptionRequest.objects.filter(released_at__isnull=False).first(),
            timeout=90,
            what="the drain released after the ack",
        )
        drained_seen = time.monotonic()
        upgraded = wait_for(  # drained: installed, then verified (or verifying)
            lambda: Node.objects.get(pk=node.pk).upgrade_state != "draining",
            timeout=30,
            what="the node past its drain",
        )
    finally:
        stop(proc)
        log.close()
        tenant.server.shutdown()
        tenant.session.close()  # a kept-alive connection holds a live-server thread's DB session
        print((tmp_path / "worker.log").read_text()[-5000:])
    assert upgraded

    (received_at, event), *others = tenant.events
    assert others == []  # one event: the 200 answer did not make NVKE ask again
    data = event["data"]
    assert (event["type"], event["subject"], data["id"]) == (
        f"dev.nvke.{EVENT}",
        str(released.id),
        str(released.id),
    )
    assert (data["nodes"], data["reason"], data["nodepool_id"]) == ([node.name], "upgrade", pool_id)
    assert data["deadline"] == released.deadline.isoformat()
    assert (released.deadline - released.requested_at).total_seconds() == 120

    # just before the ack: still waiting, nothing released, the operation says why
    waiting = f"{node.name}: waiting for checkpoint (deadline {released.deadline.isoformat()})"
    before = tenant.before_ack
    assert (before["request"]["state"], before["request"]["released_at"]) == ("waiting", None)
    assert before["op"]["progress"]["stage"] == f"upgrading {node.name}; {waiting}"

    # the ack came CHECKPOINT_S after the event; the drain went on right after it, not before
    assert tenant.acked_at is not None and tenant.acked_at - received_at >= CHECKPOINT_S
    assert released.acknowledged_via == "api"
    assert released.acknowledged_by.startswith("apikey:")
    waited = (released.acknowledged_at - released.requested_at).total_seconds()
    assert CHECKPOINT_S <= waited < CHECKPOINT_S + 10
    after_ack = (released.released_at - released.acknowledged_at).total_seconds()
    assert 0 <= after_ack < 3.0, after_ack
    assert drained_seen - tenant.acked_at < 5.0
