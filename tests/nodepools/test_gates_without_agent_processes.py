"""The observed-state gates without agent processes (tests/e2e/test_observed_gates.py runs
them with real ones): hosts are SIMULATED INFRASTRUCTURE (``make_host``); with no agent
registered their agent report runs in-process — the ``simulated`` source over the host's
state file, stored by ``fleet.ingest.ingest_report``. Switching that off shows that nothing
else makes a node READY: the provider's own answer is never taken for the host's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.helpers import drive_cluster

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(owner, make_host):
    make_host("h100-sxm5-80gb", gpus=2, hostname="sim-gate-1")
    cluster = owner.post(
        "/api/v1/clusters",
        {"name": "c1", "kubernetes_version": "1.36", "region": "us-east-1"},
        format="json",
    ).json()["target_id"]
    drive_cluster(cluster)
    return cluster


def create_pool(owner, cluster, isolation) -> str:
    return owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {
            "name": "p",
            "gpu_model": "h100-sxm5-80gb",
            "gpus_per_node": 1,
            "node_count": 1,
            "isolation": isolation,
        },
        format="json",
    ).json()["target_id"]


def test_without_an_agent_report_no_node_becomes_ready_and_the_operation_fails(
    owner, cluster, settings
):
    from clusters.models import Operation
    from nodepools.models import Node, NodePool
    from nodepools.reconcile import reconcile_nodepool

    settings.NVKE_SIMULATED_IN_PROCESS_AGENT = False  # the host's agent never reports
    pool_id = create_pool(owner, cluster, {"mode": "mig", "mig_profile": "3g.40gb"})
    t0 = timezone.now()
    for _ in range(4):
        reconcile_nodepool(pool_id, now=t0)
    (node,) = Node.objects.filter(nodepool_id=pool_id)
    expected = (
        f"node {node.name} to become READY: "
        "no agent report with a GPU inventory from sim-gate-1 yet"
    )
    assert (node.phase, node.observed_problem) == ("PROVISIONING", expected)
    pool = NodePool.objects.get(pk=pool_id)
    verified = next(c for c in pool.conditions if c["type"] == "NodesVerified")
    # the condition says how long the wait may last: observed_since + the 300 s deadline
    deadline = (node.observed_since + timedelta(seconds=300)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert node.observed_since == t0
    assert (verified["status"], verified["message"]) == (
        "False",
        f"{expected} (waiting until {deadline}: NVKE_OBSERVED_STATE_TIMEOUT_S 300 s)",
    )
    assert node.host.warnings == [
        f"observed state: node {node.name} to become READY: "
        "no agent report with a GPU inventory from sim-gate-1 yet"
    ]
    assert reconcile_nodepool(pool_id, now=t0 + timedelta(seconds=300)) is None  # deadline
    pool.refresh_from_db()
    assert pool.phase == "ERROR"
    op = Operation.objects.get(target_id=pool_id)
    assert (op.status, op.error["code"], op.error["message"]) == (
        "FAILED",
        "observed_state_mismatch",
        expected,
    )


def test_the_in_process_agent_report_lets_the_node_become_ready_with_the_reported_layout(
    owner, cluster
):
    from fleet.models import Host
    from nodepools.models import Node
    from tests.helpers import drive_pool

    pool_id = create_pool(owner, cluster, {"mode": "mig", "mig_profile": "3g.40gb"})
    drive_pool(pool_id)
    (node,) = Node.objects.filter(nodepool_id=pool_id)
    assert node.phase == "READY" and node.observed_problem == ""
    # the H100 table: 3g.40gb x2 at memory slices 0 and 4, 4 slices each
    assert node.gpu_layout[0]["mig_devices"] == [
        {"profile": "3g.40gb", "start": 0, "size": 4},
        {"profile": "3g.40gb", "start": 4, "size": 4},
    ]
    host = Host.objects.get(hostname="sim-gate-1")
    assert host.inventory_count >= 1 and host.agent_source_error == ""
    assert host.last_report_seq > 2**62  # in-process reports use their own seq range


def test_nvml_that_fails_on_the_host_keeps_the_node_out_and_is_shown(owner, cluster):
    from clusters.providers import simhosts
    from fleet.models import Host
    from nodepools.models import Node
    from nodepools.reconcile import reconcile_nodepool

    host = Host.objects.get(hostname="sim-gate-1")
    simhosts.change(host, lambda s: simhosts.set_fault(s, "nvml-init-fails"))
    pool_id = create_pool(owner, cluster, {"mode": "exclusive"})
    for _ in range(4):
        reconcile_nodepool(pool_id)
    (node,) = Node.objects.filter(nodepool_id=pool_id)
    error = f"NVML: {simhosts.NVML_FAILS}"
    assert node.observed_problem == (
        f"node {node.name} to become READY: NVML does not initialise on sim-gate-1 (agent: {error})"
    )
    host.refresh_from_db()
    assert host.agent_source_error == error
    assert any(w.startswith(f"agent source: {error}") for w in host.warnings)


@pytest.mark.parametrize(
    ("wanted", "reported", "ok"),
    [
        ("", "", True),
        ("R580", "580.95.05", True),
        ("580", "580.0.0", True),
        ("R580", "570.172.08", False),
        ("580.95.05", "580.95.05", True),
        ("580.95.05", "580.95.06", False),
        ("580.95.05", "", False),
    ],
)
def test_driver_matching_by_branch_or_release(wanted, reported, ok):
    from catalog.services import driver_matches

    assert driver_matches(wanted, reported) is ok
