"""The main job end to end, over real HTTP with a real Celery worker and a real agent process.

Values are worked out independently: the GPU UUID comes from parsing the capture here with
ElementTree, the utilization mean of 10/40/70/N-A is 40.0, GPU-seconds over a window inside
the allocation are GPUs x window length.
"""

from __future__ import annotations

import json
import subprocess
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
import requests

from tests.conftest import CAPTURES, capture
from tests.e2e.conftest import BIN, ROOT, service_env, wait_for
from tests.helpers import wire_inventory_gpus

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def xml_gpu_uuids(name: str) -> list[str]:
    # DOCTYPE without entities: ElementTree does not fetch external DTDs
    root = ET.fromstring((CAPTURES / name).read_bytes())
    return [gpu.findtext("uuid") for gpu in root.iter("gpu")]


class Api:
    def __init__(self, base: str, key: str) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {key}"

    def __call__(self, method: str, path: str, expect: int, **kwargs):
        resp = self.session.request(method, self.base + path, timeout=30, **kwargs)
        assert resp.status_code == expect, (method, path, resp.status_code, resp.text)
        return resp.json()


def test_tenant_gets_a_gpu_cluster_the_fleet_reports_usage_comes_back(
    live_server, worker, catalog, tmp_path
):
    from tenants.services import create_api_key, create_tenant

    op_key = create_api_key(tenant=None, name="op")[1]
    tenant_key = create_api_key(tenant=create_tenant(name="acme"), name="k", role="owner")[1]
    operator, tenant = Api(live_server.url, op_key), Api(live_server.url, tenant_key)

    # 1. operator imports a host from a real capture
    host = operator(
        "POST",
        "/api/v1/fleet/hosts",
        201,
        json={
            "hostname": "gpu-a100-01",
            "zone": "us-east-1a",
            "nvidia_smi_xml": capture("a100-sxm4-v12.xml"),
        },
    )
    expected_uuids = xml_gpu_uuids("a100-sxm4-v12.xml")
    assert [g["uuid"] for g in host["gpus"]] == expected_uuids

    # 2. tenant creates a cluster and a MIG node pool; the worker reconciles both
    op = tenant(
        "POST",
        "/api/v1/clusters",
        202,
        json={"name": "llm", "kubernetes_version": "1.36", "region": "us-east-1"},
    )
    cluster_id = op["target_id"]
    wait_for(
        lambda: tenant("GET", f"/api/v1/clusters/{cluster_id}", 200)["phase"] == "RUNNING",
        what="cluster RUNNING",
    )
    assert tenant("GET", f"/api/v1/operations/{op['id']}", 200)["status"] == "DONE"
    pool_op = tenant(
        "POST",
        f"/api/v1/clusters/{cluster_id}/nodepools",
        202,
        json={
            "name": "a100",
            "gpu_model": "a100-sxm4-80gb",
            "gpus_per_node": 1,
            "node_count": 1,
            "isolation": {"mode": "mig", "mig_profile": "1g.20gb"},
        },
    )
    pool_url = f"/api/v1/clusters/{cluster_id}/nodepools/{pool_op['target_id']}"
    pool = wait_for(
        lambda: (p := tenant("GET", pool_url, 200))["phase"] == "RUNNING" and p,
        what="node pool RUNNING",
    )
    (node,) = pool["nodes"]
    assert node["gpu_uuids"] == expected_uuids
    assert node["host"] == "gpu-a100-01"
    assert tenant("GET", f"/api/v1/operations/{pool_op['id']}", 200)["status"] == "DONE"

    # 3. the agent registers and replays 10, 40, 70 and N/A utilization
    replay = tmp_path / "replay.jsonl"
    t0 = datetime.fromisoformat("2026-01-01T00:00:00+00:00")
    lines = [
        {
            "kind": "inventory",
            "driver_version": "535.54.03",
            "gpus": wire_inventory_gpus(host["gpus"]),
        }
    ]
    for i, util in enumerate([10.0, 40.0, 70.0, None]):
        lines.append(
            {
                "kind": "sample",
                "ts": (t0 + timedelta(seconds=i)).isoformat(),
                "gpu_uuid": expected_uuids[0],
                "utilization_gpu_pct": util,
                "memory_used_bytes": 12 * 2**20,
            }
        )
    replay.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    agent = subprocess.run(
        [
            str(BIN / "nvke-agent"),
            "run",
            "--server",
            live_server.url,
            "--state-dir",
            str(tmp_path / "agent"),
            "--source",
            "replay",
            "--replay",
            str(replay),
            "--interval",
            "0.5",
            "--bootstrap-token",
            host["bootstrap_token"],
        ],
        cwd=ROOT,
        env=service_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert agent.returncode == 0, agent.stderr[-3000:]
    usage = tenant("GET", f"/api/v1/clusters/{cluster_id}/usage", 200)
    assert usage["mean_gpu_utilization_pct"] == 40.0
    assert usage["sample_count"] == 4
    assert usage["utilization_sample_count"] == 3
    assert operator("GET", f"/api/v1/fleet/hosts/{host['id']}", 200)["last_report_seq"] >= 1

    # 4. GPU-hours over [start, end) inside the allocation = GPUs x (end - start)
    ready_at = datetime.fromisoformat(node["ready_at"].replace("Z", "+00:00"))
    start, end = ready_at + timedelta(seconds=1), ready_at + timedelta(seconds=4)
    wait_for(
        lambda: datetime.now(ready_at.tzinfo) > end + timedelta(seconds=0.2), what="window end"
    )
    window = tenant(
        "GET",
        f"/api/v1/clusters/{cluster_id}/usage",
        200,
        params={"start": start.isoformat(), "end": end.isoformat()},
    )
    assert Decimal(str(window["gpu_seconds"])) == Decimal(3) * len(expected_uuids)
    assert window["by_gpu_model"][0]["gpu_model"] == "a100-sxm4-80gb"

    # 5. delete: phases run to DELETED, host free, ledger closed, usage still readable
    delete_op = tenant("DELETE", f"/api/v1/clusters/{cluster_id}", 202)
    wait_for(
        lambda: tenant("GET", f"/api/v1/clusters/{cluster_id}", 200)["phase"] == "DELETED",
        what="cluster DELETED",
    )
    assert tenant("GET", f"/api/v1/operations/{delete_op['id']}", 200)["status"] == "DONE"
    assert tenant("GET", pool_url, 200)["phase"] == "DELETED"
    host_after = operator("GET", f"/api/v1/fleet/hosts/{host['id']}", 200)
    assert host_after["state"] == "AVAILABLE"
    assert [g["held"] for g in host_after["gpus"]] == [False]
    first = tenant(
        "GET", f"/api/v1/clusters/{cluster_id}/usage", 200, params={"end": end.isoformat()}
    )
    time.sleep(1.0)
    second = tenant(
        "GET", f"/api/v1/clusters/{cluster_id}/usage", 200, params={"end": end.isoformat()}
    )
    assert first == second
    full = tenant("GET", f"/api/v1/clusters/{cluster_id}/usage", 200)
    time.sleep(1.0)
    assert (
        tenant("GET", f"/api/v1/clusters/{cluster_id}/usage", 200)["gpu_seconds"]
        == full["gpu_seconds"]
    )
