"""Observed-state gates end to end: a real Celery worker, real ``nvke-agent`` processes over
real HTTP, SIMULATED hosts below them (clusters/providers/simhosts.py).

Each test makes the simulated host disobey (a fault injected in its hardware state, as
``manage.py simulate`` does), shows the node waiting with a condition that names expected vs
reported and the host warned, then the operation failing or rolling back after the deadline
(``NVKE_OBSERVED_STATE_TIMEOUT_S`` = 8 s here) — and the same flow passing once the host
agrees. NVKE learns what the host did only from its agent process.

Expected values are worked out by hand from the catalog's H100 placement table: ``1g.10gb``
x7 sits at starts 0..6, ``3g.40gb`` x2 at starts 0 and 4 (memory slices, size 1 and 4).
"""

from __future__ import annotations

import pytest
import requests

from tests.e2e.conftest import start_simulated_agent, start_worker, stop, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TIMEOUT_S = 8
ONE_G = "[1g.10gb@0, 1g.10gb@1, 1g.10gb@2, 1g.10gb@3, 1g.10gb@4, 1g.10gb@5, 1g.10gb@6]"
THREE_G = "[3g.40gb@0, 3g.40gb@4]"


class Api:
    def __init__(self, base: str, key: str) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {key}"

    def __call__(self, method: str, path: str, expect: int, **kwargs):
        resp = self.session.request(method, self.base + path, timeout=30, **kwargs)
        assert resp.status_code == expect, (method, path, resp.status_code, resp.text)
        return resp.json()


@pytest.fixture
def gated_worker(transactional_db, tmp_path):
    # two repairs in a row of a one-node pool: past the circuit breaker's default budget
    # (max(1, floor(0.05 x 1)) = 1 an hour; tests/nodepools/test_circuit_breaker.py)
    proc, log = start_worker(
        tmp_path, NVKE_OBSERVED_STATE_TIMEOUT_S=str(TIMEOUT_S), NVKE_BREAKER_SHARE="2.0"
    )
    yield proc
    stop(proc)
    log.close()
    print((tmp_path / "worker.log").read_text()[-5000:])


@pytest.fixture
def world(live_server, gated_worker, catalog, tmp_path):
    """A simulated 2-GPU H100 host with its agent process running, an operator, a tenant
    with a RUNNING cluster. Yields a dict; stops the agent afterwards."""
    from clusters.providers import simhosts
    from tenants.services import create_api_key, create_tenant

    host = simhosts.create_simulated_host(
        hostname="sim-h100-e2e", zone="us-east-1a", gpu_model="h100-sxm5-80gb", gpus=2
    )
    agent, agent_log = start_simulated_agent(tmp_path, live_server.url, host)
    operator = Api(live_server.url, create_api_key(tenant=None, name="op")[1])
    tenant = Api(
        live_server.url,
        create_api_key(tenant=create_tenant(name="acme"), name="k", role="owner")[1],
    )
    wait_for(
        lambda: operator("GET", f"/api/v1/fleet/hosts/{host.id}", 200)["last_seen_at"],
        what="the agent's first report",
    )
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
    yield {"host": host, "operator": operator, "tenant": tenant, "cluster": cluster_id}
    stop(agent)
    agent_log.close()
    print((tmp_path / "agent.log").read_text()[-3000:])


def fault(host, name: str, on: bool = True) -> None:
    """What ``manage.py simulate fault`` does: the agent process reports the effect."""
    from clusters.providers import simhosts

    simhosts.change(host, lambda state: simhosts.set_fault(state, name, on))


def create_pool(world, name: str, isolation: dict, gpus_per_node: int = 1) -> tuple[str, str]:
    op = world["tenant"](
        "POST",
        f"/api/v1/clusters/{world['cluster']}/nodepools",
        202,
        json={
            "name": name,
            "gpu_model": "h100-sxm5-80gb",
            "gpus_per_node": gpus_per_node,
            "node_count": 1,
            "isolation": isolation,
        },
    )
    return f"/api/v1/clusters/{world['cluster']}/nodepools/{op['target_id']}", op["id"]


def condition(pool: dict, type_: str) -> dict:
    return next((c for c in pool["conditions"] if c["type"] == type_), {})


def finished(world, op_id: str) -> dict:
    return wait_for(
        lambda: (
            (o := world["tenant"]("GET", f"/api/v1/operations/{op_id}", 200))["status"]
            in ("DONE", "FAILED")
            and o
        ),
        timeout=90,
        what=f"operation {op_id} finished",
    )


def seen_pool(seen: list, pool: dict) -> dict:
    """Keep the last pool read (for the failure message) and return it."""
    seen.append(
        {
            "phase": pool["phase"],
            "conditions": pool["conditions"],
            "nodes": [(n["name"], n["phase"], n["gpu_uuids"]) for n in pool["nodes"]],
        }
    )
    return pool


def host_warnings(world) -> list[str]:
    return world["operator"]("GET", f"/api/v1/fleet/hosts/{world['host'].id}", 200)["warnings"]


def test_a_mig_relayout_the_host_does_not_apply_rolls_back_then_passes_when_it_does(world):
    tenant = world["tenant"]
    pool_url, op_id = create_pool(world, "mig", {"mode": "mig", "mig_profile": "1g.10gb"})
    done = finished(world, op_id)
    assert done["status"] == "DONE", done  # the agent reports 7 x 1g.10gb
    (node,) = tenant("GET", pool_url, 200)["nodes"]
    assert [d["start"] for d in node["gpu_layout"][0]["mig_devices"]] == [0, 1, 2, 3, 4, 5, 6]

    fault(world["host"], "mig-manager-wedged")
    op = tenant(
        "PATCH", pool_url, 202, json={"isolation": {"mode": "mig", "mig_profile": "3g.40gb"}}
    )
    gpu = node["gpu_uuids"][0]
    difference = f"{gpu}: MIG instances expected {THREE_G}, reported {ONE_G}"
    waiting = wait_for(
        lambda: (
            difference
            in condition(p := tenant("GET", pool_url, 200), "NodesVerified").get("message", "")
            and p
        ),
        what="the NodesVerified condition naming the difference",
    )
    assert condition(waiting, "NodesVerified")["status"] == "False"
    assert any(node["name"] in w and difference in w for w in host_warnings(world))
    failed = finished(world, op["id"])
    assert failed["status"] == "FAILED"
    assert failed["error"]["code"] == "isolation_validation_failed"
    assert failed["error"]["message"] == f"node {node['name']} failed validation: {difference}"
    pool = tenant("GET", pool_url, 200)
    assert pool["isolation"] == {"mode": "mig", "mig_profile": "1g.10gb"}  # rolled back
    assert pool["phase"] == "RUNNING"
    assert {n["phase"] for n in pool["nodes"]} == {"READY"}

    fault(world["host"], "mig-manager-wedged", on=False)
    op = tenant(
        "PATCH", pool_url, 202, json={"isolation": {"mode": "mig", "mig_profile": "3g.40gb"}}
    )
    done = finished(world, op["id"])
    assert done["status"] == "DONE", done
    (node,) = tenant("GET", pool_url, 200)["nodes"]
    assert [(d["profile"], d["start"]) for d in node["gpu_layout"][0]["mig_devices"]] == [
        ("3g.40gb", 0),
        ("3g.40gb", 4),
    ]
    wait_for(lambda: not any("observed state" in w for w in host_warnings(world)), what="clear")


def test_a_driver_upgrade_the_host_does_not_take_rolls_back_then_passes(world):
    tenant = world["tenant"]
    pool_url, op_id = create_pool(world, "whole", {"mode": "exclusive"})
    done = finished(world, op_id)
    assert done["status"] == "DONE", done
    (node,) = tenant("GET", pool_url, 200)["nodes"]

    fault(world["host"], "driver-not-taken")
    op = tenant("POST", f"{pool_url}/upgrade", 202, json={"driver_version": "580.95.05"})
    difference = "driver expected 580.95.05, reported 570.172.08"
    wait_for(
        lambda: (
            difference in condition(tenant("GET", pool_url, 200), "Upgrading").get("message", "")
        ),
        what="the Upgrading condition naming the difference",
    )
    failed = finished(world, op["id"])
    assert failed["status"] == "FAILED"
    assert failed["error"]["code"] == "upgrade_verification_failed"
    assert failed["error"]["message"] == f"node {node['name']} after the upgrade: {difference}"
    pool = tenant("GET", pool_url, 200)
    assert pool["driver_version"] == ""  # no node took it: the spec is rolled back
    assert [n["phase"] for n in pool["nodes"]] == ["READY"]

    fault(world["host"], "driver-not-taken", on=False)
    op = tenant("POST", f"{pool_url}/upgrade", 202, json={"driver_version": "580.95.05"})
    done = finished(world, op["id"])
    assert done["status"] == "DONE", done
    host = world["operator"]("GET", f"/api/v1/fleet/hosts/{world['host'].id}", 200)
    assert host["driver_version"] == "580.95.05"  # as the agent reports it


def test_a_reboot_that_leaves_a_remap_pending_fences_the_gpu_and_replaces_the_node(world):
    from clusters.providers import simhosts
    from fleet.models import Gpu, GpuHealthInterval

    tenant, host = world["tenant"], world["host"]
    pool_url, op_id = create_pool(world, "whole", {"mode": "exclusive"})
    done = finished(world, op_id)
    assert done["status"] == "DONE", done
    (node,) = tenant("GET", pool_url, 200)["nodes"]
    (bad,) = node["gpu_uuids"]
    (good,) = set(host.gpus.values_list("uuid", flat=True)) - {bad}

    fault(host, "reboot-leaves-remap-pending")
    simhosts.change(host, lambda s: simhosts.add_xid(s, bad, 95, remap_pending=True))
    pending = "row remapping pending: a GPU reset is needed to apply it"
    wait_for(
        lambda: (
            pending in condition(tenant("GET", pool_url, 200), "NodesVerified").get("message", "")
        ),
        timeout=60,
        what="the rebooted node waiting with the pending remap named",
    )
    seen: list = []
    try:
        pool = wait_for(
            lambda: (
                (p := seen_pool(seen, tenant("GET", pool_url, 200)))["phase"] == "RUNNING"
                and [n["gpu_uuids"] for n in p["nodes"] if n["phase"] == "READY"] == [[good]]
                and p
            ),
            timeout=90,
            what="the node replaced on the healthy GPU",
        )
    except AssertionError as exc:
        gpus = list(
            Gpu.objects.filter(host=host).values_list(
                "uuid", "health", "health_reason", "scrub_state", "missing_since", "holder_id"
            )
        )
        state = host.__class__.objects.values_list("state", "state_reason").get(pk=host.pk)
        raise AssertionError(f"{exc}; last pool: {seen[-1:]}; GPUs {gpus}; host {state}") from exc
    assert node["id"] not in {n["id"] for n in pool["nodes"]}  # released
    fenced = Gpu.objects.get(uuid=bad)
    assert fenced.health == "UNHEALTHY"
    assert fenced.health_reason.startswith(f"not repaired by a reboot: node {node['name']}")
    assert pending in fenced.health_reason
    assert GpuHealthInterval.objects.get(gpu_uuid=bad).ended_at is None  # still fenced
    assert not any(node["name"] in w for w in host_warnings(world))  # gone with the node

    fault(host, "reboot-leaves-remap-pending", on=False)  # the same fault, a reboot that works
    (replacement,) = [n for n in pool["nodes"] if n["phase"] == "READY"]
    simhosts.change(host, lambda s: simhosts.add_xid(s, good, 95, remap_pending=True))
    wait_for(
        lambda: GpuHealthInterval.objects.filter(gpu_uuid=good, ended_at__isnull=False).exists(),
        timeout=60,
        what="the repaired GPU's interval closed",
    )
    interval = GpuHealthInterval.objects.get(gpu_uuid=good)
    assert (interval.xid, interval.ended_by) == (
        95,
        "auto-repair: rebooted, the agent's report is clean",
    )
    pool = wait_for(
        lambda: (p := tenant("GET", pool_url, 200))["phase"] == "RUNNING" and p,
        what="pool RUNNING",
    )
    assert [(n["id"], n["phase"]) for n in pool["nodes"] if n["phase"] != "DELETED"] == [
        (replacement["id"], "READY")  # rebooted in place, not replaced
    ]
    assert Gpu.objects.get(uuid=good).health == "HEALTHY"


def test_a_whole_gpu_pool_whose_gpu_reports_mig_on_fails_then_passes(world):
    from clusters.providers import simhosts

    tenant, host = world["tenant"], world["host"]

    def mig_on(state):  # the host came up with MIG enabled, as the A100 capture did
        for gpu in state["gpus"]:
            gpu["mig_mode"] = gpu["mig_mode_pending"] = "enabled"

    simhosts.change(host, mig_on)
    fault(host, "mig-stays-enabled")
    wait_for(
        lambda: set(host.gpus.values_list("mig_mode", flat=True)) == {"enabled"},
        what="the agent reporting MIG on",
    )
    pool_url, op_id = create_pool(world, "whole", {"mode": "exclusive"})
    wait_for(
        lambda: (
            "MIG mode expected disabled, reported enabled"
            in condition(tenant("GET", pool_url, 200), "NodesVerified").get("message", "")
        ),
        what="the node waiting with the MIG mode named",
    )
    (node,) = tenant("GET", pool_url, 200)["nodes"]
    assert node["phase"] == "PROVISIONING"
    assert node["observed_problem"] == (
        f"node {node['name']} to become READY: "
        f"{node['gpu_uuids'][0]}: MIG mode expected disabled, reported enabled"
    )
    failed = finished(world, op_id)
    assert failed["status"] == "FAILED"
    assert failed["error"]["code"] == "observed_state_mismatch"
    assert failed["error"]["message"] == node["observed_problem"]
    assert tenant("GET", pool_url, 200)["phase"] == "ERROR"

    fault(host, "mig-stays-enabled", on=False)
    pool_url, op_id = create_pool(world, "whole2", {"mode": "exclusive"})
    done = finished(world, op_id)
    assert done["status"] == "DONE", done
    (node,) = tenant("GET", pool_url, 200)["nodes"]
    assert host.gpus.get(uuid=node["gpu_uuids"][0]).mig_mode == "disabled"  # the agent says
