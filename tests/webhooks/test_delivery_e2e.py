"""Webhooks end to end: a tenant admin registers a real local receiver; a cluster created
through the API is reconciled by a real Celery worker process, whose finished operation
becomes a signed CloudEvent. The receiver answers 500 twice: it sees the retries (same
``webhook-id``, growing backoff), every signature verifies, and the delivery log shows
500, 500, 200. Then a secret rotation and a redelivery signed with both secrets."""

from __future__ import annotations

import json

import pytest
import requests

from tests.e2e.conftest import start_worker, stop, wait_for
from tests.webhooks.receiver import Receiver, start

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WEBHOOK_ENV = {
    "NVKE_WEBHOOK_ALLOW_HTTP": "true",
    "NVKE_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
    "NVKE_WEBHOOK_BACKOFF_S": "0.5",
}


@pytest.fixture
def webhook_settings(settings):
    settings.NVKE_WEBHOOK_ALLOW_HTTP = True
    settings.NVKE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.NVKE_WEBHOOK_BACKOFF_S = 0.5


@pytest.fixture
def webhook_worker(transactional_db, tmp_path):
    """A real worker whose settings allow loopback webhook targets (as the tests configure)."""
    proc, log = start_worker(tmp_path, **WEBHOOK_ENV)
    yield proc
    stop(proc)
    log.close()
    print((tmp_path / "worker.log").read_text()[-5000:])


def test_signed_cloudevents_are_retried_after_500_and_logged(
    live_server, webhook_worker, webhook_settings, import_capture
):
    from tenants.services import create_api_key, create_tenant

    import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b")
    tenant = create_tenant(name="acme")
    admin = requests.Session()
    admin.headers["Authorization"] = (
        "Bearer " + create_api_key(tenant=tenant, name="adm", role="admin")[1]
    )
    api = f"{live_server.url}/api/v1"

    receiver = Receiver(answers=[500, 500])
    server = start(receiver)
    try:
        made = admin.post(
            f"{api}/webhooks",
            json={"url": receiver.url, "event_types": ["operation.finished", "operation.failed"]},
            timeout=30,
        )
        assert made.status_code == 201, made.text
        hook = made.json()
        assert hook["secret"].startswith("whsec_")
        receiver.secrets = [hook["secret"]]

        op = admin.post(
            f"{api}/clusters",
            json={"name": "hooked", "kubernetes_version": "1.36", "region": "us-east-1"},
            timeout=30,
        ).json()
        wait_for(lambda: len(receiver.received) >= 3, timeout=90, what="3 webhook attempts")

        first, second, third = receiver.received[:3]
        assert [r.answered for r in (first, second, third)] == [500, 500, 200]
        assert {r.headers["webhook-id"] for r in (first, second, third)} == {
            first.headers["webhook-id"]
        }
        assert all(r.verified_with == [0] for r in (first, second, third))
        # backoff 0.5 s then 1.0 s (base x 2^(n-1)); the queue adds, never removes, time
        assert second.at - first.at >= 0.45
        assert third.at - second.at >= 0.95
        event = json.loads(third.body)
        assert third.headers["content-type"] == "application/cloudevents+json"
        assert (event["specversion"], event["type"], event["subject"]) == (
            "1.0",
            "dev.nvke.operation.finished",
            op["id"],
        )
        assert event["id"] == first.headers["webhook-id"]
        assert (event["data"]["type"], event["data"]["status"]) == ("CREATE_CLUSTER", "DONE")

        deliveries = admin.get(f"{api}/webhooks/{hook['id']}/deliveries", timeout=30).json()
        (delivery,) = deliveries["results"]
        assert (delivery["status"], delivery["attempts"]) == ("DELIVERED", 3)
        assert [a["status_code"] for a in delivery["log"]] == [500, 500, 200]

        # rotation: the new secret signs, and the old one too for a day
        rotated = admin.post(f"{api}/webhooks/{hook['id']}/rotate-secret", timeout=30).json()
        receiver.secrets = [hook["secret"], rotated["secret"]]
        again = admin.post(
            f"{api}/webhooks/{hook['id']}/deliveries/{delivery['id']}/redeliver", timeout=30
        )
        assert again.status_code == 202
        wait_for(lambda: len(receiver.received) >= 4, timeout=30, what="redelivery")
        redelivered = receiver.received[3]
        assert redelivered.headers["webhook-id"] == event["id"]  # same event: receivers dedupe
        assert redelivered.verified_with == [0, 1]
        assert len(redelivered.headers["webhook-signature"].split(" ")) == 2
    finally:
        server.shutdown()
