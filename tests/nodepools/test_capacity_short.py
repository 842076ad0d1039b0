"""A scale-up without capacity leaves a serving pool serving: RUNNING with ``CapacityShort``
(counts and why), retried, never ERROR; its resize operation fails (retryable) so that it holds
no lock on the cluster; the conditions are computed from the same counts as the phase.

Fleet: one simulated 8-GPU H100 host; pool ``h100`` of one 8-GPU node on it, scaled to 2.
"""

from __future__ import annotations

import pytest

from tests.helpers import drive_pool, make_cluster, running_h100_pool

pytestmark = pytest.mark.django_db


def condition(pool_id, type_):
    from nodepools.models import NodePool

    return next(c for c in NodePool.objects.get(pk=pool_id).conditions if c["type"] == type_)


def cluster_nodes_ready(owner, cluster_id) -> tuple[str, str, str]:
    """The cluster's ``NodesReady`` (status, reason, message) as the API shows it."""
    body = owner.get(f"/api/v1/clusters/{cluster_id}").json()
    cond = next(c for c in body["conditions"] if c["type"] == "NodesReady")
    return cond["status"], cond["reason"], cond["message"]


def test_a_scale_up_without_capacity_keeps_the_pool_serving_and_retries_until_capacity_returns(
    owner, make_host
):
    from nodepools.models import Node, NodePool
    from nodepools.reconcile import nodepools_needing_reconcile, reconcile_nodepool

    cluster, pool = running_h100_pool(owner, make_host, hosts=1, nodes=1)
    (serving,) = Node.objects.filter(nodepool_id=pool)
    op = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools/{pool}/set-size", {"node_count": 2}
    ).json()
    assert reconcile_nodepool(pool) == 30.0  # no room: retried in 30 s, not failed

    row = NodePool.objects.get(pk=pool)
    assert (row.phase, row.node_count) == ("RUNNING", 2)
    assert row.observed_generation < row.generation  # the spec is not realised yet
    short = condition(pool, "CapacityShort")
    assert (short["status"], short["reason"]) == ("True", "WaitingForCapacity")
    assert short["message"].startswith("1 of 2 nodes placed: ")
    assert "h100-sxm5-80gb" in short["message"]
    assert short["message"].endswith("; retried every 30 s")
    # Ready and NodesReady say the same counts as the phase: serving, one node not placed;
    # Ready True says why it is True beside NodesReady False (issue 33: a trial read one
    # message under both statuses)
    ready, nodes_ready = condition(pool, "Ready"), condition(pool, "NodesReady")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "True",
        "CapacityShort",
        "serving: 1 of 2 nodes ready; 1 node(s) not placed; waiting for capacity "
        "(condition CapacityShort)",
    )
    assert (nodes_ready["status"], nodes_ready["message"]) == (
        "False",
        "1 of 2 nodes ready; 1 node(s) not placed",
    )
    # the cluster says what its pool says (issue 33: a trial read the cluster's NodesReady
    # True "6 node pool(s) running" beside this pool's False)
    assert cluster_nodes_ready(owner, cluster) == (
        "False",
        "NodePoolsNotReady",
        "1 of 1 node pool(s) have nodes not ready: h100 (1 of 2 nodes ready; 1 node(s) not placed)",
    )
    assert list(Node.objects.live().filter(nodepool_id=pool)) == [serving]
    # the resize ends (retryable) and holds no lock: the next change is taken at once
    body = owner.get(f"/api/v1/operations/{op['id']}").json()
    assert (body["status"], body["error"]["code"], body["error"]["retryable"]) == (
        "FAILED",
        "insufficient_capacity",
        True,
    )
    assert "the pool serves its 1 node(s) meanwhile" in body["error"]["message"]
    # its progress counts the node placed, as its error says (a trial saw done 0 / total 2)
    assert body["progress"] == {"done": 1, "total": 2, "stage": "failed"}
    assert pool in {str(i) for i in nodepools_needing_reconcile()}  # the beat retries too

    # a retry without room changes nothing; a new host heals it
    assert reconcile_nodepool(pool) == 30.0
    assert NodePool.objects.get(pk=pool).phase == "RUNNING"
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    for _ in range(10):
        if reconcile_nodepool(pool) is None:
            break
    row = NodePool.objects.get(pk=pool)
    assert (row.phase, row.observed_generation) == ("RUNNING", row.generation)
    assert Node.objects.live().filter(nodepool_id=pool, phase="READY").count() == 2
    assert cluster_nodes_ready(owner, cluster) == (
        "True",
        "AllNodesReady",
        "all nodes ready in 1 node pool(s)",
    )
    short = condition(pool, "CapacityShort")
    assert (short["status"], short["reason"]) == ("False", "CapacityRestored")
    assert condition(pool, "Ready")["message"] == "2 of 2 nodes ready"


def test_a_short_pool_scaled_back_is_not_short_any_more(owner, make_host):
    from nodepools.models import NodePool
    from nodepools.reconcile import reconcile_nodepool

    cluster, pool = running_h100_pool(owner, make_host, hosts=1, nodes=1)
    url = f"/api/v1/clusters/{cluster}/nodepools/{pool}/set-size"
    assert owner.post(url, {"node_count": 2}).status_code == 202
    assert reconcile_nodepool(pool) == 30.0
    back = owner.post(url, {"node_count": 1})  # no operation_in_progress: the resize ended
    assert back.status_code == 202, back.content
    assert reconcile_nodepool(pool) is None
    row = NodePool.objects.get(pk=pool)
    assert (row.phase, row.observed_generation) == ("RUNNING", row.generation)
    assert condition(pool, "CapacityShort")["status"] == "False"
    assert condition(pool, "Ready")["message"] == "1 of 1 nodes ready"


def test_a_short_pool_places_the_nodes_that_fit(owner, make_host):
    """Trial 5 of issue 33: pool ``short`` (4-GPU nodes) scaled from 1 to 3 with room for one
    more node stayed at 1, its CapacityShort saying one could be placed. By hand: one 8-GPU
    host, one 4-GPU node on it, 4 GPUs free: 1 more node placed, 1 still missing."""
    from nodepools.models import Node
    from nodepools.reconcile import reconcile_nodepool

    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    cluster = make_cluster(owner, "c1")
    op = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {"name": "short", "gpu_model": "h100-sxm5-80gb", "gpus_per_node": 4, "node_count": 1},
    ).json()
    pool = op["target_id"]
    drive_pool(pool)
    owner.post(f"/api/v1/clusters/{cluster}/nodepools/{pool}/set-size", {"node_count": 3})
    for _ in range(10):
        if reconcile_nodepool(pool) == 30.0:  # waiting for capacity for the last one
            break
    assert Node.objects.live().filter(nodepool_id=pool).count() == 2
    short = condition(pool, "CapacityShort")
    assert (short["status"], short["reason"]) == ("True", "WaitingForCapacity")
    assert short["message"].startswith("2 of 3 nodes placed: ")


def test_a_new_pool_without_capacity_still_fails(owner, make_host):
    """All or none for a pool that serves nothing yet: ERROR ``insufficient_capacity``."""
    from nodepools.models import NodePool
    from nodepools.reconcile import reconcile_nodepool

    cluster, _pool = running_h100_pool(owner, make_host, hosts=1, nodes=1)
    op = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {"name": "more", "gpu_model": "h100-sxm5-80gb", "gpus_per_node": 8, "node_count": 1},
    ).json()
    assert reconcile_nodepool(op["target_id"]) is None
    assert NodePool.objects.get(pk=op["target_id"]).phase == "ERROR"


def test_a_scale_up_that_boots_its_node_says_so_on_the_pool_and_the_cluster(
    owner, make_host, settings
):
    """While the added node boots, the pool's NodesReady counts it (not the "1 of 1 nodes
    ready" of before the scale-up) and the cluster's NodesReady, derived from it, says the
    same (issue 33)."""
    from nodepools.models import Node
    from nodepools.reconcile import reconcile_nodepool

    cluster, pool = running_h100_pool(owner, make_host, hosts=2, nodes=1)
    settings.NVKE_SIMULATED_NODE_DELAY_S = 600  # the new machine boots for 10 minutes
    owner.post(f"/api/v1/clusters/{cluster}/nodepools/{pool}/set-size", {"node_count": 2})
    assert reconcile_nodepool(pool) == 0.0  # placed
    assert reconcile_nodepool(pool) > 590  # booting: looked at again when it is up
    (booting,) = Node.objects.filter(nodepool_id=pool, phase="PROVISIONING")
    nodes_ready = condition(pool, "NodesReady")
    assert (nodes_ready["status"], nodes_ready["message"]) == (
        "False",
        f"1 of 2 nodes ready; {booting.name} PROVISIONING",
    )
    assert condition(pool, "Ready")["message"] == "1 of 2 nodes ready"
    assert cluster_nodes_ready(owner, cluster) == (
        "False",
        "NodePoolsNotReady",
        f"1 of 1 node pool(s) have nodes not ready: h100 (1 of 2 nodes ready; {booting.name} "
        "PROVISIONING)",
    )
