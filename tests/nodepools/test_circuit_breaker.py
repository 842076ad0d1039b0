"""The circuit breaker (fleet/breaker.py) on auto-repair: in a 20-node pool at the default 5 %
(budget max(1, floor(0.05 x 20)) = 1 cordon an hour) the second automatic repair is refused,
the pool says why (RepairsPaused / CircuitBreakerOpen), and it goes on once an operator
resumes automation. The 40 one-GPU H100 hosts are SIMULATED rows (``make_host``): the H100
fleet's own budget is floor(0.05 x 40) = 2, so only the pool's breaker is under test."""

from __future__ import annotations

import pytest
from django.utils import timezone

from fleet import breaker
from fleet.models import BreakerTrip, CordonRecord
from nodepools.models import Node, NodePool
from tenants.models import AuditEvent, Tenant
from tenants.principal import Principal
from tests.helpers import announce_gpu_fault, drive_pool, running_exclusive_pool

pytestmark = pytest.mark.django_db


def fault(node: Node) -> None:
    """An Xid 95 (RESET_GPU) on the node's GPU, as fleet announces it: reboot the node."""
    announce_gpu_fault(
        node, xid=95, action="RESET_GPU", rule_action="gpu_reset", needs_operator=True
    )


def condition(pool_id, kind: str) -> dict:
    pool = NodePool.objects.get(pk=pool_id)
    return next(c for c in pool.conditions if c["type"] == kind)


def test_the_second_automatic_cordon_in_a_20_node_pool_waits_for_the_operator(make_host):
    for i in range(40):
        make_host("h100-sxm5-80gb", gpus=1, hostname=f"breaker-{i:02d}")
    owner = Principal(Tenant.objects.create(name="acme"), "owner", False, "user:alice")
    _, pool_id = running_exclusive_pool(owner, gpus_per_node=1, node_count=20)
    first, second = Node.objects.filter(nodepool_id=pool_id).order_by("name")[:2]
    assert breaker.budget(20) == 1 and breaker.budget(40) == 2

    fault(first)
    drive_pool(pool_id)  # rebooted, verified, READY: one cordon counted
    first.refresh_from_db()
    assert (first.phase, first.repair_state) == ("READY", "")
    assert CordonRecord.objects.filter(automatic=True).count() == 1

    fault(second)
    drive_pool(pool_id)
    second.refresh_from_db()
    assert (second.phase, second.repair_state) == ("READY", "requested")  # not cordoned
    paused = condition(pool_id, "RepairsPaused")
    assert (paused["status"], paused["reason"]) == ("True", "CircuitBreakerOpen")
    pool = NodePool.objects.select_related("cluster").get(pk=pool_id)
    assert paused["message"].startswith(
        f"circuit breaker open for the node pool {pool.cluster.name}/{pool.name} (20 nodes): "
        "1 cordon(s) by automation or operators in the last 3600 s, the budget is 1 "
        "(max(1, floor(0.05 x 20)))"
    )
    trip = BreakerTrip.objects.get()
    assert (trip.scope, trip.resumed_at) == (f"pool:{pool_id}", None)
    drive_pool(pool_id)  # still waiting: nothing changes by itself
    assert Node.objects.get(pk=second.pk).repair_state == "requested"

    # the operator resumes: the count starts afresh and the repair goes on
    breaker.resume(trip.scope, actor="user:ops", now=timezone.now())
    drive_pool(pool_id)
    second.refresh_from_db()
    assert (second.phase, second.repair_state) == ("READY", "")
    assert condition(pool_id, "RepairsPaused")["status"] == "False"
    assert CordonRecord.objects.filter(automatic=True).count() == 2
    assert AuditEvent.objects.get(action="breaker.resume").actor == "user:ops"


def test_an_operator_drain_counts_against_the_budget_and_is_never_blocked(make_host):
    from fleet.models import Host
    from fleet.services import drain_host

    host = make_host("a10g", gpus=1, hostname="breaker-a10g")
    other = make_host("a10g", gpus=1, hostname="breaker-a10g-2")
    now = timezone.now()
    BreakerTrip.objects.create(scope="model:a10g", tripped_at=now, reason="open for a test")
    drain_host(host, actor="user:ops", target="MAINTENANCE")  # an open breaker: not blocked
    assert Host.objects.get(pk=host.pk).state == "MAINTENANCE"
    record = CordonRecord.objects.get()
    assert (record.automatic, record.gpu_model, record.actor) == (False, "a10g", "user:ops")
    # resumed, the operator's drain still fills the a10g fleet's budget (2 hosts: 1 an hour)
    breaker.resume("model:a10g", actor="user:ops", now=now)
    later = timezone.now()
    drain_host(other, actor="user:ops", target="MAINTENANCE")
    allowed, why = breaker.allow_automatic_cordon(
        target="node n1", gpu_model="a10g", pool_id=None, pool_size=100, actor="auto", now=later
    )
    assert not allowed
    assert why.startswith("circuit breaker open for the a10g fleet (2 hosts): 1 cordon(s)")


def test_a_cordon_over_both_budgets_opens_both_breakers_at_once(make_host):
    """A pool of 2 nodes on a 2-host model fleet: each budget is max(1, floor(0.05 x 2)) = 1,
    so the second automatic cordon exceeds both. Both breakers open with that one refusal,
    which names both (a fresh-user trial resumed the pool's breaker and then found the model's
    opened 20 s later)."""
    now = timezone.now()
    pool_id = "7a55e4a0-0000-4000-8000-000000000001"
    make_host("a10g", gpus=1, hostname="both-1")
    make_host("a10g", gpus=1, hostname="both-2")
    args = dict(gpu_model="a10g", pool_id=pool_id, pool_size=2, actor="auto", now=now)
    assert breaker.allow_automatic_cordon(target="node n1", **args) == (True, "")
    allowed, why = breaker.allow_automatic_cordon(target="node n2", pool_label="c/p", **args)
    assert not allowed
    assert sorted(BreakerTrip.objects.values_list("scope", flat=True)) == [
        "model:a10g",
        f"pool:{pool_id}",
    ]
    first, second = why.split("; circuit breaker open for the ")
    assert first.startswith("circuit breaker open for the node pool c/p (2 nodes): 1 cordon(s)")
    assert second.startswith("a10g fleet (2 hosts): 1 cordon(s)")
    # resuming both lets the next cordon through (the counts start afresh)
    for scope in ("model:a10g", f"pool:{pool_id}"):
        breaker.resume(scope, actor="user:ops", now=now)
    later = timezone.now()
    assert breaker.allow_automatic_cordon(target="node n2", **{**args, "now": later}) == (True, "")


def test_a_pause_whose_node_is_scaled_away_is_lifted(make_host):
    """The node waiting on the open breaker leaves first on a scale-down (unhealthy first):
    with nothing left to repair, RepairsPaused goes False (a trial read it True for an hour,
    naming a node the pool no longer had)."""
    from nodepools.scaling import set_node_pool_size

    for i in range(40):
        make_host("h100-sxm5-80gb", gpus=1, hostname=f"breaker-{i:02d}")
    owner = Principal(Tenant.objects.create(name="acme"), "owner", False, "user:alice")
    _, pool_id = running_exclusive_pool(owner, gpus_per_node=1, node_count=20)
    first, second = Node.objects.filter(nodepool_id=pool_id).order_by("name")[:2]
    fault(first)
    drive_pool(pool_id)
    fault(second)
    drive_pool(pool_id)
    assert condition(pool_id, "RepairsPaused")["status"] == "True"

    pool = NodePool.objects.get(pk=pool_id)
    set_node_pool_size(principal=owner, pool=pool, node_count=19)
    drive_pool(pool_id)
    second.refresh_from_db()
    assert second.phase == "DELETED"  # the node waiting for repair left, not the newest
    paused = condition(pool_id, "RepairsPaused")
    assert (paused["status"], paused["reason"], paused["message"]) == (
        "False",
        "NothingToRepair",
        "",
    )
    assert Node.objects.live().filter(nodepool_id=pool_id).count() == 19
