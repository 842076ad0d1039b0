"""A pool's ready count and conditions follow its nodes' observed state (nodepools/readiness.py):
a host whose agent falls silent makes its node NOT_READY through the host health sweep, the
pool reads "0 of 1 nodes ready" with ``NodesReady=False`` naming the node and why, and is
DEGRADED; the agent's next report brings all of it back.

The host is SIMULATED infrastructure (tests/conftest.py ``make_host``); its agent's reports are
the ones the agent's ``simulated`` source makes (clusters/providers/simhosts.py), stored by
:func:`fleet.ingest.ingest_report`, the function behind ``POST /api/v1/agent/reports``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.helpers import running_h100_pool

pytestmark = pytest.mark.django_db


def condition(conditions, type_):
    return next(c for c in conditions if c["type"] == type_)


@pytest.fixture
def world(owner, make_host, settings):
    """One 8-GPU H100 host (its agent registered, last report 10 minutes ago) and a RUNNING
    pool ``h100`` of one 8-GPU node on it."""
    from fleet.models import Host

    settings.NVKE_HOST_HEARTBEAT_TIMEOUT_S = 120
    settings.NVKE_NODE_REPAIR_TIMEOUT_S = 3600
    cluster, pool = running_h100_pool(owner, make_host, hosts=1, nodes=1)
    # TEST SET-UP (simulated infrastructure): the host's agent registered (a per-host
    # credential, as POST /api/v1/agent/register leaves it) and then stopped reporting
    Host.objects.update(
        credential_hash="c" * 64,
        registered_at=timezone.now() - timedelta(hours=1),
        last_seen_at=timezone.now() - timedelta(minutes=10),
    )
    return cluster, pool


def test_a_node_whose_host_goes_not_ready_makes_the_pool_degraded_until_it_reports_again(
    owner, world, django_capture_on_commit_callbacks
):
    from clusters.providers.simhosts import simulated_report
    from fleet.health import mark_silent_hosts_not_ready
    from fleet.ingest import ingest_report
    from fleet.models import Host
    from nodepools.models import Node
    from nodepools.reconcile import reconcile_nodepool

    cluster, pool = world
    node = Node.objects.get(nodepool_id=pool)
    before = owner.get(f"/api/v1/clusters/{cluster}/nodepools/{pool}").json()
    assert before["phase"] == "RUNNING"
    assert condition(before["conditions"], "Ready")["message"] == "1 of 1 nodes ready"

    now = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):  # host_state_changed, on commit
        assert mark_silent_hosts_not_ready(now) == 1
    host = Host.objects.get()
    assert (host.state, host.state_reason) == ("NOT_READY", "no agent report for 120 s")
    assert Node.objects.get(pk=node.pk).phase == "NOT_READY"
    # one step: nothing to repair yet (3600 s repair timeout), so it looks again then
    delay = reconcile_nodepool(pool, now=now + timedelta(seconds=1))
    assert delay == pytest.approx(3599, abs=2)

    body = owner.get(f"/api/v1/clusters/{cluster}/nodepools/{pool}").json()
    why = (
        f"{node.name} NOT_READY: host {host.hostname} NOT_READY since "
        f"{now.isoformat()} (no agent report for 120 s)"
    )
    assert body["phase"] == "DEGRADED"
    ready, nodes_ready = (
        condition(body["conditions"], "Ready"),
        condition(body["conditions"], "NodesReady"),
    )
    assert (ready["status"], ready["reason"]) == ("False", "NodesNotReady")
    assert ready["message"] == f"0 of 1 nodes ready; {why}"
    assert (nodes_ready["status"], nodes_ready["reason"]) == ("False", "NodesNotReady")
    assert nodes_ready["message"] == f"0 of 1 nodes ready; {why}"
    cluster_cond = condition(
        owner.get(f"/api/v1/clusters/{cluster}").json()["conditions"], "NodesReady"
    )
    # the cluster's NodesReady is the pool's, named (one truth: nodepools/readiness.py)
    assert (cluster_cond["status"], cluster_cond["reason"], cluster_cond["message"]) == (
        "False",
        "NodePoolsNotReady",
        f"1 of 1 node pool(s) have nodes not ready: h100 (0 of 1 nodes ready; {why})",
    )
    # a second step changes nothing (level-triggered)
    reconcile_nodepool(pool, now=now + timedelta(seconds=2))
    assert owner.get(f"/api/v1/clusters/{cluster}/nodepools/{pool}").json() == body

    # the agent reports again: host ALLOCATED (its GPUs are held), node READY, pool RUNNING
    with django_capture_on_commit_callbacks(execute=True):
        ingest_report(host, simulated_report(host, host.last_report_seq + 1))
    assert Host.objects.get().state == "ALLOCATED"
    assert Node.objects.get(pk=node.pk).phase == "READY"
    assert reconcile_nodepool(pool) is None
    body = owner.get(f"/api/v1/clusters/{cluster}/nodepools/{pool}").json()
    assert body["phase"] == "RUNNING"
    ready, nodes_ready = (
        condition(body["conditions"], "Ready"),
        condition(body["conditions"], "NodesReady"),
    )
    assert (ready["status"], ready["message"]) == ("True", "1 of 1 nodes ready")
    assert (nodes_ready["status"], nodes_ready["message"]) == ("True", "1 of 1 nodes ready")
    cluster_cond = condition(
        owner.get(f"/api/v1/clusters/{cluster}").json()["conditions"], "NodesReady"
    )
    assert (cluster_cond["status"], cluster_cond["reason"], cluster_cond["message"]) == (
        "True",
        "AllNodesReady",
        "all nodes ready in 1 node pool(s)",
    )


def test_the_host_state_change_wakes_the_pool_of_the_node_it_changed(
    world, django_capture_on_commit_callbacks
):
    """The receiver publishes the pool's reconcile itself (a direct send: a pending countdown,
    e.g. the repair timeout's, must not delay a node that is back); read from the real broker,
    where no worker consumes it in this test."""
    import json

    from fleet.health import mark_silent_hosts_not_ready
    from tests.helpers import broker_client

    client = broker_client()
    client.delete("reconcile")
    with django_capture_on_commit_callbacks(execute=True):
        mark_silent_hosts_not_ready(timezone.now())
    sent = [json.loads(m)["headers"] for m in client.lrange("reconcile", 0, -1)]
    assert [h["argsrepr"] for h in sent if h["task"] == "nodepools.tasks.reconcile_nodepool"] == [
        repr((str(world[1]),))
    ]


def test_a_resize_while_a_node_is_not_ready_is_done_and_leaves_the_pool_degraded(
    owner, world, make_host, django_capture_on_commit_callbacks
):
    """The resize is realised (2 nodes exist, the new one READY): its operation is DONE and
    the pool is DEGRADED ("1 of 2 nodes ready"), not left RECONCILING with the operation
    RUNNING (which would hold the cluster's one-operation-at-a-time slot)."""
    from clusters.models import Operation
    from fleet.health import mark_silent_hosts_not_ready
    from nodepools.models import Node
    from nodepools.reconcile import reconcile_nodepool

    cluster, pool = world
    (old,) = Node.objects.filter(nodepool_id=pool)
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")  # room for the second node
    with django_capture_on_commit_callbacks(execute=True):
        mark_silent_hosts_not_ready(timezone.now())
    op = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools/{pool}/set-size", {"node_count": 2}
    ).json()
    for _ in range(20):  # steps until it waits for the repair timeout (1 h) of the old node
        if (reconcile_nodepool(pool) or 0) > 3000:
            break
    else:
        raise AssertionError("the pool did not settle")
    body = owner.get(f"/api/v1/clusters/{cluster}/nodepools/{pool}").json()
    assert body["phase"] == "DEGRADED"
    ready = condition(body["conditions"], "Ready")
    assert ready["status"] == "False"
    assert ready["message"].startswith(f"1 of 2 nodes ready; {old.name} NOT_READY: host ")
    assert Operation.objects.get(pk=op["id"]).status == "DONE"
    assert sorted(Node.objects.filter(nodepool_id=pool).values_list("phase", flat=True)) == [
        "NOT_READY",
        "READY",
    ]
