"""Agent registration and report ingestion through the HTTP API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from rest_framework.test import APIClient

from tests.conftest import capture

pytestmark = pytest.mark.django_db

A10G = "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"


@pytest.fixture
def agent(operator, anonymous, catalog):
    host = operator.post(
        "/api/v1/fleet/hosts",
        {"hostname": "h1", "zone": "us-east-1a", "nvidia_smi_xml": capture("a10g.xml")},
        format="json",
    ).json()
    reg = anonymous.post(
        "/api/v1/agent/register", {"bootstrap_token": host["bootstrap_token"]}, format="json"
    ).json()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {reg['credential']}")
    return client, reg["host_id"]


def report(client, host_id, seq, samples, **extra):
    body = {"host_id": host_id, "seq": seq, "samples": samples, **extra}
    return client.post("/api/v1/agent/reports", body, format="json")


def sample(ts, uuid=A10G, util=50.0):
    return {"ts": ts.isoformat(), "gpu_uuid": uuid, "utilization_gpu_pct": util, "power_mw": 25580}


def stored():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT gpu_uuid, ts, utilization_gpu_pct, power_mw FROM fleet_gpusample ORDER BY ts"
        )
        return cursor.fetchall()


def test_reports_are_idempotent_on_host_and_seq(agent):
    client, host_id = agent
    now = datetime.now(UTC).replace(microsecond=0)
    first = report(client, host_id, 1, [sample(now), sample(now + timedelta(seconds=10))])
    assert first.status_code == 200
    assert first.json() == {
        "seq": 1,
        "duplicate": False,
        "samples_stored": 2,
        "samples_rejected": 0,
        "samples_deduplicated": 0,
        "rejections": {},
        "commands": [],
    }
    again = report(client, host_id, 1, [sample(now), sample(now + timedelta(seconds=10))])
    assert again.json() == {
        "seq": 1,
        "duplicate": True,
        "samples_stored": 2,
        "samples_rejected": 0,
        "samples_deduplicated": 0,
        "rejections": {},
        "commands": [],
    }
    assert stored() == [
        (A10G, now, 50.0, 25580),
        (A10G, now + timedelta(seconds=10), 50.0, 25580),
    ]


def test_samples_of_other_gpus_or_far_off_clocks_are_rejected(agent):
    client, host_id = agent
    now = datetime.now(UTC)
    resp = report(
        client,
        host_id,
        1,
        [
            sample(now),
            sample(now, uuid="GPU-00000000-0000-0000-0000-000000000000"),
            sample(now + timedelta(days=2)),
            sample(now - timedelta(days=400)),
        ],
    )
    assert resp.json()["samples_stored"] == 1
    assert resp.json()["samples_rejected"] == 3
    assert len(stored()) == 1


def test_na_utilization_is_stored_as_null(agent):
    client, host_id = agent
    now = datetime.now(UTC).replace(microsecond=0)
    report(client, host_id, 1, [sample(now, util=None)])
    assert stored() == [(A10G, now, None, 25580)]


def test_an_agent_seeing_fewer_gpus_flags_the_host_without_shrinking_it(agent, operator):
    client, host_id = agent
    report(client, host_id, 1, [], inventory={"gpus": []}, driver_version="550.54.15")
    host = operator.get(f"/api/v1/fleet/hosts/{host_id}").json()
    assert host["gpu_count"] == 1 and len(host["gpus"]) == 1
    assert host["warnings"] == [f"agent inventory: GPU(s) not reported: {A10G}"]
    assert host["driver_version"] == "550.54.15"
    assert host["last_report_seq"] == 1


def test_bad_credentials_and_bad_bodies(agent, anonymous):
    client, host_id = agent
    resp = anonymous.post("/api/v1/agent/reports", {"seq": 1}, format="json")
    assert resp.status_code == 401
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Bearer not-a-credential")
    assert bad.post("/api/v1/agent/reports", {"seq": 1}, format="json").status_code == 401
    resp = report(client, host_id, 0, [])
    assert (resp.status_code, resp.json()["code"], resp.json()["field"]) == (
        400,
        "invalid_report",
        "seq",
    )
    resp = report(client, host_id, 2, [{"ts": "noon", "gpu_uuid": A10G}])
    assert resp.json()["field"] == "samples[0].ts"


def test_samples_land_in_daily_partitions(agent):
    client, host_id = agent
    now = datetime.now(UTC)
    report(client, host_id, 1, [sample(now)])
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM fleet_gpusample")
        (partition,) = cursor.fetchone()
    assert partition == f"fleet_gpusample_p{now:%Y%m%d}"
