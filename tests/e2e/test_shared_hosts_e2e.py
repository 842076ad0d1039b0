"""A shared host end to end (#18): a real Celery worker, a real ``nvke-agent`` process over
real HTTP, a SIMULATED 1-GPU H100 hypervisor below it (clusters/providers/simhosts.py).

Two tenants' ``tenancy: shared`` MIG pools get their own GPU instances of the one GPU; when
tenant B leaves, its instances are destroyed and cleared on the host, yet stay SCRUBBING while
the agent process is paused (nothing but its report may free them); once it reports again
they are FREE and a third tenant's instance lands on B's old slices.

Placements worked by hand from the catalog's H100-SXM5-80GB table: 3g.40gb {0,4}:4 -> A at
0 (slices 0-3); 1g.10gb {0..6}:1 -> B's three at 4, 5, 6; then no 1g.10gb start is left
(compute 3 + 3 = 6 of 7, slice 7 is no 1g.10gb start). C's 1g.10gb after B left: 4.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.e2e.conftest import start_simulated_agent, stop, wait_for
from tests.e2e.test_observed_gates import Api, gated_worker  # noqa: F401  (fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MODEL = "h100-sxm5-80gb"


@pytest.fixture
def hypervisor(live_server, gated_worker, catalog, tmp_path):  # noqa: F811
    from clusters.providers import simhosts
    from tenants.services import create_api_key, create_tenant

    host = simhosts.create_simulated_host(
        hostname="sim-hv-e2e", zone="us-east-1a", gpu_model=MODEL, gpus=1
    )
    agent, agent_log = start_simulated_agent(tmp_path, live_server.url, host)
    operator = Api(live_server.url, create_api_key(tenant=None, name="op")[1])
    tenants = {
        name: Api(
            live_server.url,
            create_api_key(tenant=create_tenant(name=name), name="k", role="owner")[1],
        )
        for name in ("tenant-a", "tenant-b", "tenant-c")
    }
    wait_for(
        lambda: operator("GET", f"/api/v1/fleet/hosts/{host.id}", 200)["last_seen_at"],
        what="the agent's first report",
    )
    body = operator(
        "POST", f"/api/v1/fleet/hosts/{host.id}/tenancy", 200, json={"tenancy": "shared"}
    )
    assert body["tenancy"] == "shared"
    yield {"host": host, "operator": operator, "tenants": tenants, "agent": agent}
    if agent.poll() is None:
        os.killpg(agent.pid, signal.SIGCONT)
    stop(agent)
    agent_log.close()
    print((tmp_path / "agent.log").read_text()[-3000:])


def running_pool(api: Api, name: str, profile: str, gpus: int) -> tuple[str, str]:
    """A cluster with one shared MIG pool, both waited for; returns (cluster id, pool url)."""
    cluster = api(
        "POST",
        "/api/v1/clusters",
        202,
        json={"name": name, "kubernetes_version": "1.36", "region": "us-east-1"},
    )["target_id"]
    wait_for(
        lambda: api("GET", f"/api/v1/clusters/{cluster}", 200)["phase"] == "RUNNING",
        what=f"cluster {name} RUNNING",
    )
    op = api(
        "POST",
        f"/api/v1/clusters/{cluster}/nodepools",
        202,
        json={
            "name": "mig",
            "gpu_model": MODEL,
            "gpus_per_node": gpus,
            "node_count": 1,
            "isolation": {"mode": "mig", "mig_profile": profile, "tenancy": "shared"},
        },
    )
    url = f"/api/v1/clusters/{cluster}/nodepools/{op['target_id']}"
    wait_for(lambda: api("GET", url, 200)["phase"] == "RUNNING", timeout=90, what=f"{name} RUNNING")
    return cluster, url


def slice_map(world) -> list[tuple[str, str, int, str]]:
    (gpu,) = world["operator"]("GET", f"/api/v1/fleet/hosts/{world['host'].id}/slices", 200)
    return [(i["tenant"], i["profile"], i["start"], i["state"]) for i in gpu["instances"]]


def test_release_scrub_and_reuse_by_another_tenant_only_after_the_agent_confirms(hypervisor):
    from clusters.providers import simhosts

    world = hypervisor
    a, b, c = (world["tenants"][n] for n in ("tenant-a", "tenant-b", "tenant-c"))
    _, a_pool = running_pool(a, "a", "3g.40gb", 1)
    _, b_pool = running_pool(b, "b", "1g.10gb", 3)
    assert slice_map(world) == [
        ("tenant-a", "3g.40gb", 0, "ACTIVE"),
        ("tenant-b", "1g.10gb", 4, "ACTIVE"),
        ("tenant-b", "1g.10gb", 5, "ACTIVE"),
        ("tenant-b", "1g.10gb", 6, "ACTIVE"),
    ]
    (node_a,) = a("GET", a_pool, 200)["nodes"]
    assert node_a["gpu_layout"][0]["mig_devices"] == [
        {"profile": "3g.40gb", "start": 0, "size": 4}
    ]  # only A's own instance, though B's three are on the same GPU

    os.killpg(world["agent"].pid, signal.SIGSTOP)  # the host's agent stops reporting
    b("DELETE", b_pool, 202)
    wait_for(lambda: b("GET", b_pool, 200)["phase"] == "DELETED", what="B's pool DELETED")
    # on the host the instances are gone and cleared ...
    state = simhosts.read(world["host"].id)
    assert [i["start"] for i in state["gpus"][0]["instances"]] == [0]
    assert sorted(s["start"] for s in state["gpus"][0]["slice_scrubs"]) == [4, 5, 6]
    # ... but without a report saying so the instances stay SCRUBBING (watched for 3 s)
    for _ in range(6):
        assert [s[3] for s in slice_map(world)] == ["ACTIVE", "SCRUBBING", "SCRUBBING", "SCRUBBING"]
        time.sleep(0.5)

    os.killpg(world["agent"].pid, signal.SIGCONT)
    wait_for(lambda: len(slice_map(world)) == 1, what="B's instances FREE after the agent reported")
    assert slice_map(world) == [("tenant-a", "3g.40gb", 0, "ACTIVE")]

    _, c_pool = running_pool(c, "c", "1g.10gb", 1)
    assert slice_map(world) == [
        ("tenant-a", "3g.40gb", 0, "ACTIVE"),
        ("tenant-c", "1g.10gb", 4, "ACTIVE"),
    ]
    (node_c,) = c("GET", c_pool, 200)["nodes"]
    assert node_c["gpu_layout"][0]["mig_devices"] == [{"profile": "1g.10gb", "start": 4, "size": 1}]
    # the scrub is on the host's record with the agent as witness
    events = world["operator"]("GET", f"/api/v1/fleet/hosts/{world['host'].id}/events", 200)
    verified = [e for e in events["results"] if "verified by the agent" in e["message"]]
    assert len(verified) == 3 and {e["actor"] for e in verified} == {"agent"}
