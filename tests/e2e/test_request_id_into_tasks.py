"""Structured JSON logs: the request id of an API call follows it into the Celery tasks it
causes (django-structlog), across a real worker process."""

from __future__ import annotations

import json

import pytest
import requests

from tests.e2e.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_request_id_reaches_the_reconcile_task_logs(live_server, worker, catalog, tmp_path):
    from fleet.services import import_host
    from tenants.services import create_api_key, create_tenant
    from tests.conftest import capture

    import_host(hostname="h1", zone="us-east-1a", nvidia_smi_xml=capture("a10g.xml"))
    key = create_api_key(tenant=create_tenant(name="obs"), name="k", role="owner")[1]
    headers = {"Authorization": f"Bearer {key}", "X-Request-ID": "trace-7f3a"}
    resp = requests.post(
        f"{live_server.url}/api/v1/clusters",
        json={"name": "c1", "kubernetes_version": "1.36", "region": "us-east-1"},
        headers=headers,
        timeout=10,
    )
    assert resp.status_code == 202
    assert resp.headers["X-Request-ID"] == "trace-7f3a"
    cluster = resp.json()["target_id"]

    def task_lines():
        lines = []
        for raw in (tmp_path / "worker.log").read_text().splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if record.get("request_id") == "trace-7f3a":
                lines.append(record)
        return lines

    wait_for(
        lambda: (
            requests.get(
                f"{live_server.url}/api/v1/clusters/{cluster}", headers=headers, timeout=10
            ).json()["phase"]
            == "RUNNING"
        ),
        what="cluster RUNNING",
    )
    records = wait_for(
        lambda: [r for r in task_lines() if r.get("event") == "task_succeeded"],
        what="task logs with the request id",
    )
    assert {r["level"] for r in records} <= {"info", "debug"}
    assert any(r.get("task_id") for r in records)
