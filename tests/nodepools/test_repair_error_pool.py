"""A pool ERROR for its current spec still heals and reports the nodes it has.

A scale-up 1 -> 2 failed: the pool is ERROR, its SET_NODE_POOL_SIZE operation FAILED
``insufficient_capacity``, and it keeps its one READY node. (A serving pool's scale-up without
capacity no longer fails — it waits for capacity, condition ``CapacityShort``,
tests/nodepools/test_capacity_short.py — so the failure is written by the reconciler's own
``nodepools.reconcile.fail._fail``, as a change that fails for good leaves a pool.) The failed
change is not retried, but that node is still read and repaired as in a RUNNING pool
(nodepools/reconcile.py ``_step_failed``): an Xid reboots or replaces it (one replacement,
never the node the failed resize asked for) under a REPAIR_NODES operation, a NOT_READY host
shows in ``NodesReady``, and the pool stays ERROR with ``Ready`` keeping its failure.

The hosts are SIMULATED infrastructure (tests/conftest.py ``make_host``); Xids reach the
control plane as their host's agent reports them (clusters/providers/simhosts.py).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.helpers import drive_pool, running_h100_pool, snapshot

pytestmark = pytest.mark.django_db

NO_ROOM = "no free host with 8 h100-sxm5-80gb GPU(s) in us-east-1 (1 of 1 node(s) unplaced)"


def condition(pool_id, type_):
    from nodepools.models import NodePool

    return next(c for c in NodePool.objects.get(pk=pool_id).conditions if c["type"] == type_)


def nodes(pool_id):
    from nodepools.models import Node

    return list(Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name"))


def live(pool_id):
    return [n for n in nodes(pool_id) if n.phase != "DELETED"]


@pytest.fixture
def failed(owner, make_host):
    """One 8-GPU H100 host, pool ``h100`` of one 8-GPU node on it, scaled to 2: ERROR.
    Returns (cluster id, pool id, the failed operation as the API shows it)."""
    from django.db import transaction

    from clusters.models import Operation
    from nodepools.models import NodePool
    from nodepools.reconcile.fail import _fail

    cluster, pool = running_h100_pool(owner, make_host, hosts=1, nodes=1)
    op = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools/{pool}/set-size", {"node_count": 2}
    ).json()
    with transaction.atomic():
        row = NodePool.objects.select_related("cluster").get(pk=pool)
        _fail(row, "insufficient_capacity", NO_ROOM, retryable=True, now=timezone.now())
    assert drive_pool(pool) == 1
    body = owner.get(f"/api/v1/operations/{op['id']}").json()
    assert (body["status"], body["error"]["code"]) == ("FAILED", "insufficient_capacity")
    row = NodePool.objects.get(pk=pool)
    assert (row.phase, row.node_count, row.observed_generation) == ("ERROR", 2, row.generation)
    assert Operation.objects.filter(target_id=pool, type="REPAIR_NODES").count() == 0
    return cluster, pool, body


def xid(node, code, django_capture_on_commit_callbacks):
    """The node's host's agent reports Xid ``code`` on the node's first GPU."""
    from clusters.providers import simhosts
    from fleet.models import Host

    host = Host.objects.get(pk=node.host_id)
    bad = node.gpu_uuids[0]
    simhosts.change(host, lambda s: simhosts.add_xid(s, bad, code))
    with django_capture_on_commit_callbacks(execute=True):  # gpu_health_changed, on commit
        assert simhosts.report_in_process(host, events_after=0)
    return bad


def assert_still_failed(owner, pool, failed_op):
    """The pool is ERROR for the failed resize, shown as before."""
    from nodepools.models import NodePool

    row = NodePool.objects.get(pk=pool)
    assert (row.phase, row.node_count, row.observed_generation) == ("ERROR", 2, row.generation)
    assert owner.get(f"/api/v1/operations/{failed_op['id']}").json() == failed_op
    ready = condition(pool, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InsufficientCapacity")
    assert ready["message"] == failed_op["error"]["message"]


def test_an_xid_79_on_an_error_pools_node_reboots_it_and_the_pool_stays_error(
    owner, failed, django_capture_on_commit_callbacks
):
    """Xid 79 (fallen off the bus): the catalog's immediate action is RESTART_BM, a reboot."""
    from catalog.services import get_xid_code
    from clusters.models import Operation
    from fleet.models import Gpu
    from nodepools.reconcile import nodepools_needing_reconcile, reconcile_nodepool
    from nodepools.repair import REBOOT_S, repair_action_for

    cluster, pool, failed_op = failed
    assert get_xid_code(79).nvidia_immediate_action == "RESTART_BM"
    assert repair_action_for("RESTART_BM") == "reboot"
    (node,) = nodes(pool)
    bad = xid(node, 79, django_capture_on_commit_callbacks)
    gpu = Gpu.objects.select_related("host").get(uuid=bad)
    assert (gpu.health, gpu.host.state) == ("UNHEALTHY", "CORDONED")
    marked = nodes(pool)[0]
    assert (marked.repair_state, marked.repair_action) == ("requested", "reboot")
    assert pool in {str(i) for i in nodepools_needing_reconcile()}  # beat wakes it too

    assert reconcile_nodepool(pool) == REBOOT_S
    (rebooting,) = nodes(pool)
    assert (rebooting.id, rebooting.phase, rebooting.repair_state) == (
        node.id,
        "REPAIRING",
        "rebooting",
    )
    nodes_ready = condition(pool, "NodesReady")
    assert (nodes_ready["status"], nodes_ready["reason"]) == ("False", "NodesNotReady")
    assert nodes_ready["message"] == (
        f"0 of 2 nodes ready; {node.name} REPAIRING: auto-repair (GPU {bad}: Xid 79 "
        "(RESTART_BM)); 1 node(s) not placed"
    )
    repair = Operation.objects.get(target_id=pool, type="REPAIR_NODES")
    assert (repair.status, repair.requested_by) == ("RUNNING", "system:auto-repair")
    assert repair.progress["stage"] == f"rebooting {node.name}"
    assert_still_failed(owner, pool, failed_op)

    drive_pool(pool)
    (after,) = nodes(pool)  # rebooted in place: no replacement, no second node
    assert (after.id, after.phase, after.repair_state, after.gpu_uuids) == (
        node.id,
        "READY",
        "",
        node.gpu_uuids,
    )
    repair.refresh_from_db()
    assert (repair.status, repair.error) == ("DONE", None)
    nodes_ready = condition(pool, "NodesReady")
    assert (nodes_ready["status"], nodes_ready["message"]) == (
        "False",
        "1 of 2 nodes ready; 1 node(s) not placed",
    )
    assert Gpu.objects.get(uuid=bad).health == "HEALTHY"
    assert_still_failed(owner, pool, failed_op)
    body = owner.get(f"/api/v1/clusters/{cluster}/nodepools/{pool}").json()
    assert (body["phase"], body["node_count"]) == ("ERROR", 2)
    assert reconcile_nodepool(pool) is None  # converged
    assert pool not in {str(i) for i in nodepools_needing_reconcile()}


def test_a_replaced_node_of_an_error_pool_gets_one_replacement_never_the_failed_resizes(
    owner, failed, make_host, django_capture_on_commit_callbacks
):
    """Xid 61 (CONTACT_SUPPORT: replace the node). Its host keeps 7 healthy GPUs, too few for
    the replacement: RepairPending says so and the placement is retried, the pool stays
    ERROR. Two spare hosts (room for the 2 nodes the resize asked for) then get exactly one
    node, the replacement."""
    from catalog.services import get_xid_code
    from clusters.models import Operation
    from nodepools.reconcile import nodepools_needing_reconcile, reconcile_nodepool
    from nodepools.repair import repair_action_for

    _, pool, failed_op = failed
    assert repair_action_for(get_xid_code(61).nvidia_immediate_action) == "replace"
    (node,) = nodes(pool)
    bad = xid(node, 61, django_capture_on_commit_callbacks)
    assert (nodes(pool)[0].repair_state, nodes(pool)[0].repair_action) == ("requested", "replace")
    why = f"GPU {bad}: Xid 61 (CONTACT_SUPPORT)"

    assert reconcile_nodepool(pool) == 0.0  # released; its replacement comes next
    assert (nodes(pool)[0].phase, nodes(pool)[0].repair_state) == ("DELETED", "replacing")
    assert reconcile_nodepool(pool) == 30.0  # no 8 healthy GPUs anywhere: retried
    pending = condition(pool, "RepairPending")
    assert (pending["status"], pending["reason"]) == ("True", "InsufficientCapacity")
    assert pending["message"].startswith(
        f"replacing {node.name} ({why}): no capacity for the replacement ("
    )
    assert pending["message"].endswith("); retried every 30 s")
    assert condition(pool, "NodesReady")["message"] == "0 of 2 nodes ready; 2 node(s) not placed"
    repair = Operation.objects.get(target_id=pool, type="REPAIR_NODES")
    assert (repair.status, repair.progress["stage"]) == ("RUNNING", pending["message"])
    assert live(pool) == []
    assert_still_failed(owner, pool, failed_op)
    before = snapshot()
    assert reconcile_nodepool(pool) == 30.0  # a retry, still no room: nothing changes
    assert snapshot() == before
    assert pool in {str(i) for i in nodepools_needing_reconcile()}  # beat retries it too

    spares = {make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a").pk for _ in range(2)}
    drive_pool(pool)
    (replacement,) = live(pool)  # one node: the replacement, not the resize's second
    assert (replacement.id != node.id, replacement.replaces_id) == (True, node.id)
    assert (replacement.phase, len(replacement.gpu_uuids)) == ("READY", 8)
    assert replacement.host_id in spares and bad not in replacement.gpu_uuids
    old = next(n for n in nodes(pool) if n.pk == node.pk)
    assert (old.phase, old.repair_state) == ("DELETED", "")
    pending = condition(pool, "RepairPending")
    assert (pending["status"], pending["message"]) == (
        "False",
        f"replaced {node.name}: the new node(s) are READY",
    )
    assert condition(pool, "NodesReady")["message"] == "1 of 2 nodes ready; 1 node(s) not placed"
    repair.refresh_from_db()
    assert (repair.status, repair.error) == ("DONE", None)
    assert_still_failed(owner, pool, failed_op)
    assert reconcile_nodepool(pool) is None
    assert len(live(pool)) == 1
    assert pool not in {str(i) for i in nodepools_needing_reconcile()}


def test_an_error_pools_node_on_a_not_ready_host_shows_in_nodes_ready(
    owner, failed, settings, django_capture_on_commit_callbacks
):
    from clusters.providers.simhosts import simulated_report
    from fleet.health import mark_silent_hosts_not_ready
    from fleet.ingest import ingest_report
    from fleet.models import Host
    from nodepools.reconcile import reconcile_nodepool

    cluster, pool, failed_op = failed
    settings.NVKE_HOST_HEARTBEAT_TIMEOUT_S = 120
    settings.NVKE_NODE_REPAIR_TIMEOUT_S = 3600
    # TEST SET-UP (simulated infrastructure): the host's agent registered, then fell silent
    Host.objects.update(
        credential_hash="c" * 64,
        registered_at=timezone.now() - timedelta(hours=1),
        last_seen_at=timezone.now() - timedelta(minutes=10),
    )
    (node,) = nodes(pool)
    now = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):  # host_state_changed, on commit
        assert mark_silent_hosts_not_ready(now) == 1
    host = Host.objects.get()
    assert nodes(pool)[0].phase == "NOT_READY"
    # nothing to repair yet (3600 s repair timeout): it looks again then
    assert reconcile_nodepool(pool, now=now + timedelta(seconds=1)) == pytest.approx(3599, abs=2)
    nodes_ready = condition(pool, "NodesReady")
    assert (nodes_ready["status"], nodes_ready["reason"]) == ("False", "NodesNotReady")
    assert nodes_ready["message"] == (
        f"0 of 2 nodes ready; {node.name} NOT_READY: host {host.hostname} NOT_READY since "
        f"{now.isoformat()} (no agent report for 120 s); 1 node(s) not placed"
    )
    assert_still_failed(owner, pool, failed_op)
    body = owner.get(f"/api/v1/clusters/{cluster}/nodepools/{pool}").json()
    reconcile_nodepool(pool, now=now + timedelta(seconds=2))  # level-triggered: no change
    assert owner.get(f"/api/v1/clusters/{cluster}/nodepools/{pool}").json() == body

    with django_capture_on_commit_callbacks(execute=True):  # the agent reports again
        ingest_report(host, simulated_report(host, host.last_report_seq + 1))
    assert nodes(pool)[0].phase == "READY"
    assert reconcile_nodepool(pool) is None
    assert condition(pool, "NodesReady")["message"] == "1 of 2 nodes ready; 1 node(s) not placed"
    assert_still_failed(owner, pool, failed_op)


def test_an_error_pool_with_nothing_to_do_converges_and_writes_nothing(owner, failed):
    """The step that failed the pool already read its nodes (NodesReady): the next steps
    find nothing to do and write nothing, the cluster's conditions included."""
    from nodepools.models import NodePool
    from nodepools.reconcile import nodepools_needing_reconcile, reconcile_nodepool

    _, pool, failed_op = failed
    nodes_ready = condition(pool, "NodesReady")
    assert (nodes_ready["status"], nodes_ready["message"]) == (
        "False",
        "1 of 2 nodes ready; 1 node(s) not placed",
    )
    before, updated_at = snapshot(), NodePool.objects.get(pk=pool).updated_at
    assert [reconcile_nodepool(pool) for _ in range(2)] == [None, None]
    assert snapshot() == before
    assert NodePool.objects.get(pk=pool).updated_at == updated_at
    assert pool not in {str(i) for i in nodepools_needing_reconcile()}
    assert_still_failed(owner, pool, failed_op)


def test_a_new_spec_change_on_an_error_pool_is_taken_as_before(owner, failed, make_host):
    """Capacity comes back and the owner asks for 2 nodes again: the pool grows, RUNNING."""
    from clusters.models import Operation
    from nodepools.models import NodePool

    cluster, pool, failed_op = failed
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    op = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools/{pool}/set-size", {"node_count": 2}
    ).json()
    drive_pool(pool)
    row = NodePool.objects.get(pk=pool)
    assert (row.phase, row.observed_generation) == ("RUNNING", row.generation)
    assert [n.phase for n in live(pool)] == ["READY", "READY"]
    assert Operation.objects.get(pk=op["id"]).status == "DONE"
    assert (condition(pool, "Ready")["status"], condition(pool, "Ready")["message"]) == (
        "True",
        "2 of 2 nodes ready",
    )
    assert condition(pool, "NodesReady")["message"] == "2 of 2 nodes ready"
    assert owner.get(f"/api/v1/operations/{failed_op['id']}").json() == failed_op


def test_a_repair_waiting_for_capacity_does_not_lock_the_cluster(
    owner, failed, django_capture_on_commit_callbacks
):
    """The second hostile trial's cluster: a REPAIR_NODES waiting for capacity (not
    cancellable) made every other change 409 operation_in_progress. The tenant's own changes
    go on beside it; the pool-level rules still hold, and deleting the pool supersedes it."""
    from clusters.models import Operation
    from nodepools.reconcile import reconcile_nodepool

    cluster, pool, _ = failed
    (node,) = nodes(pool)
    xid(node, 61, django_capture_on_commit_callbacks)
    assert reconcile_nodepool(pool) == 0.0
    assert reconcile_nodepool(pool) == 30.0  # waiting for capacity
    repair = Operation.objects.get(target_id=pool, type="REPAIR_NODES")
    assert repair.status == "RUNNING"
    policy = {"windows": [{"days": ["sat"], "start": "02:00", "end": "06:00"}]}
    op = owner.patch(f"/api/v1/clusters/{cluster}", {"maintenance_policy": policy}, format="json")
    assert (op.status_code, op.json()["type"], op.json()["status"]) == (
        202,
        "UPDATE_CLUSTER",
        "DONE",
    )
    other = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {"name": "other", "gpu_model": "h100-sxm5-80gb", "gpus_per_node": 8, "node_count": 1},
        format="json",
    )
    assert (other.status_code, other.json()["type"]) == (202, "CREATE_NODE_POOL")
    # a second tenant change still waits for the first: the one-operation rule is the tenant's
    busy = owner.patch(f"/api/v1/clusters/{cluster}", {"maintenance_policy": {}}, format="json")
    assert (busy.status_code, busy.json()["code"]) == (409, "operation_in_progress")
    assert busy.json()["operation_type"] == "CREATE_NODE_POOL"
    repair.refresh_from_db()
    assert repair.status == "RUNNING"


def test_deleting_a_pool_mid_repair_leaves_no_condition_about_its_nodes(
    owner, failed, django_capture_on_commit_callbacks
):
    """The DELETED pool still said "0 of 2 nodes ready; … REPAIRING" and RepairPending True
    (found by the second hostile trial)."""
    from clusters.models import Operation
    from nodepools.reconcile import reconcile_nodepool

    cluster, pool, _ = failed
    (node,) = nodes(pool)
    xid(node, 79, django_capture_on_commit_callbacks)
    reconcile_nodepool(pool)
    assert nodes(pool)[0].phase == "REPAIRING"
    assert owner.delete(f"/api/v1/clusters/{cluster}/nodepools/{pool}").status_code == 202
    drive_pool(pool)
    body = owner.get(f"/api/v1/clusters/{cluster}/nodepools/{pool}").json()
    shown = {c["type"]: (c["status"], c["reason"], c["message"]) for c in body["conditions"]}
    assert body["phase"] == "DELETED"
    assert shown["Ready"] == ("False", "Deleted", "node pool deleted")
    assert shown["NodesReady"] == ("False", "Deleted", "0 nodes: the node pool is deleted")
    repair = Operation.objects.get(target_id=pool, type="REPAIR_NODES")
    assert (repair.status, repair.error["message"]) == (
        "CANCELLED",
        "superseded by the node pool's deletion",
    )
