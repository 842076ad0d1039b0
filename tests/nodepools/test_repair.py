"""Auto-repair (MachineHealthCheck-style): GPU faults reboot or replace a node by the Xid's
catalog action, NOT_READY nodes are replaced after a timeout, and a fault storm pauses repairs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.helpers import announce_gpu_fault, drive_pool, running_h100_pool

pytestmark = pytest.mark.django_db


@pytest.fixture
def pool(owner, make_host):
    return running_h100_pool(owner, make_host, hosts=6, nodes=3)[1]


def fault(node, action, xid):
    """Xid ``xid`` on the node's GPU with the catalog's ``action``; all but RESET_GPU need an
    operator."""
    announce_gpu_fault(node, xid=xid, action=action, needs_operator=action != "RESET_GPU")


def nodes(pool_id):
    from nodepools.models import Node

    return list(Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name"))


def test_a_gpu_reset_xid_reboots_the_node_in_place(pool):
    from clusters.models import Operation
    from nodepools.reconcile import reconcile_nodepool

    node = nodes(pool)[0]
    fault(node, "WORKFLOW_XID_48", 48)  # double-bit ECC: the catalog's action
    assert reconcile_nodepool(pool) == 5.0  # REPAIRING: rebooting
    rebooting = nodes(pool)[0]
    assert (rebooting.phase, rebooting.repair_state) == ("REPAIRING", "rebooting")
    assert rebooting.repair_reason == f"GPU {node.gpu_uuids[0]}: Xid 48 (WORKFLOW_XID_48)"
    drive_pool(pool)
    after = nodes(pool)[0]
    assert (after.id, after.phase, after.repair_state, after.gpu_uuids) == (
        node.id,
        "READY",
        "",
        node.gpu_uuids,
    )
    op = Operation.objects.get(target_id=pool, type="REPAIR_NODES")
    assert (op.status, op.requested_by) == ("DONE", "system:auto-repair")
    assert op.created_at == op.started_at <= op.finished_at  # opened as the step started it


def test_a_hardware_xid_replaces_the_node_on_healthy_gpus(pool):
    from fleet.models import Gpu

    node = nodes(pool)[0]
    Gpu.objects.filter(uuid=node.gpu_uuids[0]).update(health="UNHEALTHY")
    fault(node, "CONTACT_SUPPORT", 79)
    drive_pool(pool)
    live = [n for n in nodes(pool) if n.phase != "DELETED"]
    assert len(live) == 3
    assert node.id not in {n.id for n in live}
    assert all(n.phase == "READY" for n in live)
    assert node.gpu_uuids[0] not in {u for n in live for u in n.gpu_uuids}


def test_a_fault_storm_pauses_repairs(pool):
    from nodepools.models import NodePool
    from nodepools.reconcile import reconcile_nodepool

    for node in nodes(pool)[:2]:  # 2 of 3 unhealthy > max_unhealthy = max(1, floor(0.4 * 3)) = 1
        fault(node, "RESET_GPU", 94)
    assert reconcile_nodepool(pool) is None
    paused = next(
        c for c in NodePool.objects.get(pk=pool).conditions if c["type"] == "RepairsPaused"
    )
    assert paused["status"] == "True"
    assert paused["message"].startswith("2 of 3 nodes unhealthy")
    assert {n.phase for n in nodes(pool)} == {"READY"}  # nothing was touched


def test_a_node_not_ready_beyond_the_timeout_is_replaced(pool, settings):
    from fleet.signals import host_state_changed
    from nodepools.reconcile import reconcile_nodepool

    settings.NVKE_NODE_REPAIR_TIMEOUT_S = 300
    node = nodes(pool)[0]
    host_state_changed.send(
        sender=None,
        host_id=node.host_id,
        old_state="ALLOCATED",
        new_state="NOT_READY",
        reason="silent",
        holder_ids=[node.id],
    )
    assert nodes(pool)[0].phase == "NOT_READY"
    reconcile_nodepool(pool, now=timezone.now() + timedelta(seconds=60))
    assert nodes(pool)[0].repair_state == ""  # not yet
    for _ in range(6):
        if reconcile_nodepool(pool, now=timezone.now() + timedelta(seconds=400)) is None:
            break
    live = [n for n in nodes(pool) if n.phase != "DELETED"]
    assert len(live) == 3 and node.id not in {n.id for n in live}


def test_a_deletion_that_keeps_failing_ends_delete_failed_naming_the_leftovers(
    owner, pool, settings, monkeypatch
):
    from clusters.providers.base import ProviderError
    from clusters.providers.simulated import SimulatedProvider
    from nodepools.models import NodePool
    from nodepools.reconcile import reconcile_nodepool

    settings.NVKE_MAX_DELETE_ATTEMPTS = 3

    def broken(self, pool_spec, node_specs):
        raise ProviderError("machine API timed out (simulated)", retryable=True)

    monkeypatch.setattr(SimulatedProvider, "delete_machines", broken)  # a failing infrastructure
    cluster = NodePool.objects.get(pk=pool).cluster_id
    op = owner.delete(f"/api/v1/clusters/{cluster}/nodepools/{pool}").json()
    assert [reconcile_nodepool(pool) for _ in range(3)] == [1.0, 2.0, None]
    failed = NodePool.objects.get(pk=pool)
    assert failed.phase == "DELETE_FAILED"
    names = sorted(n.name for n in nodes(pool))
    message = next(c for c in failed.conditions if c["type"] == "Ready")["message"]
    assert message.startswith(f"could not delete machines {', '.join(names)} after 3 attempt(s)")
    assert owner.get(f"/api/v1/operations/{op['id']}").json()["error"]["code"] == "delete_failed"
    assert {n.phase for n in nodes(pool)} == {"READY"}  # nothing half-released


def test_the_simulate_command_drives_a_real_repair(pool, django_capture_on_commit_callbacks):
    """``manage.py simulate xid`` stores the Xid as an agent report would; Xid 79 (fallen off
    the bus: the catalog's immediate action is RESTART_BM, critical) makes auto-repair reboot
    the node, and the host is cordoned."""
    from django.core.management import call_command

    from fleet.models import Gpu

    node = nodes(pool)[0]
    with django_capture_on_commit_callbacks(execute=True):  # fleet signals after commit
        call_command("simulate", "xid", node.gpu_uuids[0], "79")
    gpu = Gpu.objects.select_related("host").get(uuid=node.gpu_uuids[0])
    assert (gpu.health, gpu.host.state) == ("UNHEALTHY", "CORDONED")
    marked = nodes(pool)[0]
    assert (marked.repair_state, marked.repair_action) == ("requested", "reboot")
    assert marked.repair_reason == f"GPU {gpu.uuid}: Xid 79 (RESTART_BM)"


def test_a_replacement_without_capacity_runs_short_and_completes_when_capacity_returns(
    owner, make_host, django_capture_on_commit_callbacks
):
    """One 8-GPU host, one 8-GPU node; Xid 61 (CONTACT_SUPPORT: replace the node) on one of
    its GPUs leaves 7 healthy GPUs, too few for the replacement. The pool must not go ERROR:
    it runs short (DEGRADED, CapacityShort and RepairPending naming what is missing), the
    repair stays RUNNING and is retried every 30 s; a second host brings capacity back, the
    replacement is placed there and the repair is DONE. The Xid reaches the control plane as
    the host's agent reports it (SIMULATED host, its in-process agent report)."""
    from clusters.models import Operation
    from clusters.providers import simhosts
    from fleet.models import Gpu, Host
    from nodepools.models import NodePool
    from nodepools.reconcile import nodepools_needing_reconcile, reconcile_nodepool

    _, pool = running_h100_pool(owner, make_host, hosts=1, nodes=1)
    (node,) = nodes(pool)
    host = Host.objects.get(pk=node.host_id)
    bad = node.gpu_uuids[0]
    simhosts.change(host, lambda s: simhosts.add_xid(s, bad, 61))
    with django_capture_on_commit_callbacks(execute=True):  # gpu_health_changed, on commit
        assert simhosts.report_in_process(host, events_after=0)
    assert Gpu.objects.get(uuid=bad).health == "UNHEALTHY"
    marked = nodes(pool)[0]
    assert (marked.repair_state, marked.repair_action, marked.repair_reason) == (
        "requested",
        "replace",
        f"GPU {bad}: Xid 61 (CONTACT_SUPPORT)",
    )

    assert reconcile_nodepool(pool) == 0.0  # released; its replacement comes next
    assert reconcile_nodepool(pool) == 30.0  # no 8 healthy GPUs anywhere: runs short
    short = NodePool.objects.get(pk=pool)
    conds = {c["type"]: c for c in short.conditions}
    assert short.phase == "DEGRADED"
    assert (conds["CapacityShort"]["status"], conds["CapacityShort"]["reason"]) == (
        "True",
        "InsufficientCapacity",
    )
    assert conds["CapacityShort"]["message"].startswith(
        "runs 0 of 1 node(s): no capacity for 1 missing node(s) ("
    )
    assert conds["CapacityShort"]["message"].endswith(
        "); short since auto-repair replaced nodes; retried every 30 s"
    )
    assert (conds["RepairPending"]["status"], conds["RepairPending"]["reason"]) == (
        "True",
        "InsufficientCapacity",
    )
    assert conds["RepairPending"]["message"].startswith(
        f"replacing {node.name} (GPU {bad}: Xid 61 (CONTACT_SUPPORT)): no capacity for the "
        "replacement ("
    )
    repair = Operation.objects.get(target_id=pool, type="REPAIR_NODES")
    assert repair.status == "RUNNING"
    assert repair.progress["stage"] == conds["RepairPending"]["message"]
    assert reconcile_nodepool(pool) == 30.0  # a retry, still short: nothing changes
    assert NodePool.objects.get(pk=pool).conditions == short.conditions
    assert pool in {str(i) for i in nodepools_needing_reconcile()}  # beat retries it too

    spare = make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")  # capacity comes back
    drive_pool(pool)
    done = NodePool.objects.get(pk=pool)
    conds = {c["type"]: c for c in done.conditions}
    assert done.phase == "RUNNING"
    assert (conds["CapacityShort"]["status"], conds["CapacityShort"]["message"]) == (
        "False",
        "no node missing: the pool has the nodes its size asks for",
    )
    assert (conds["RepairPending"]["status"], conds["RepairPending"]["message"]) == (
        "False",
        f"replaced {node.name}: the new node(s) are READY",
    )
    assert (conds["Ready"]["status"], conds["Ready"]["message"]) == ("True", "1 of 1 nodes ready")
    (replacement,) = [n for n in nodes(pool) if n.phase != "DELETED"]
    assert (replacement.phase, replacement.host_id, len(replacement.gpu_uuids)) == (
        "READY",
        spare.pk,
        8,
    )
    old = next(n for n in nodes(pool) if n.pk == node.pk)
    assert (old.phase, old.repair_state) == ("DELETED", "")
    repair.refresh_from_db()
    assert repair.status == "DONE"
    # converged: the released node's DELETED row no longer makes beat re-enqueue the pool
    assert pool not in {str(i) for i in nodepools_needing_reconcile()}


def test_two_reboots_in_turn_count_two_repairs(owner, make_host, settings):
    """One REPAIR_NODES for two nodes rebooted one after the other read 2 while running and
    ended 1/1 (found by the second hostile trial): it counts 0/2, 1/2, then ends 2/2.
    The circuit breaker's budget is widened (at 5 % a 5-node pool may lose 1 node an hour:
    tests/nodepools/test_circuit_breaker.py): two repairs in a row are what is counted."""
    from clusters.models import Operation
    from nodepools.reconcile import reconcile_nodepool

    settings.NVKE_BREAKER_SHARE = 1.0

    pool = running_h100_pool(owner, make_host, hosts=6, nodes=5)[1]  # 2 of 5 within 40 %
    first, second = nodes(pool)[:2]
    fault(first, "WORKFLOW_XID_48", 48)
    fault(second, "WORKFLOW_XID_48", 48)
    seen = []
    for _ in range(40):
        delay = reconcile_nodepool(pool)
        op = Operation.objects.get(target_id=pool, type="REPAIR_NODES")
        step = (op.progress["done"], op.progress["total"])
        if not seen or seen[-1] != step:
            seen.append(step)
        if delay is None:
            break
    assert op.status == "DONE"
    assert seen == [(0, 2), (1, 2), (2, 2)]
    assert [n.phase for n in nodes(pool)] == ["READY"] * 5


def test_a_deletion_counts_the_live_nodes_not_the_replaced_ones(owner, pool):
    """DELETE_NODE_POOL began at total 4 for 3 live nodes (a replaced node's DELETED row
    counted) and ended 3/3 (found by the second hostile trial)."""
    from clusters.models import Operation
    from fleet.models import Gpu
    from nodepools.models import NodePool

    node = nodes(pool)[0]
    Gpu.objects.filter(uuid=node.gpu_uuids[0]).update(health="UNHEALTHY")
    fault(node, "CONTACT_SUPPORT", 79)
    drive_pool(pool)
    assert [n.phase for n in nodes(pool)].count("DELETED") == 1
    cluster = NodePool.objects.get(pk=pool).cluster_id
    op = owner.delete(f"/api/v1/clusters/{cluster}/nodepools/{pool}").json()
    assert (op["type"], op["progress"]["total"]) == ("DELETE_NODE_POOL", 3)
    drive_pool(pool)
    done = Operation.objects.get(pk=op["id"])
    assert (done.status, done.progress["done"], done.progress["total"]) == ("DONE", 3, 3)
