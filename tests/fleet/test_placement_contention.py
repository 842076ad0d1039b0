"""Contention is not capacity: concurrent claims that meet on the same best-fit hosts spread
over the next ones, a claim fails ``insufficient_capacity`` only when the fleet could not hold
it with every lock released, and the node pool reconciler retries a contended claim with
backoff until its deadline (then ERROR saying why).

Claimants are real PostgreSQL transactions on separate connections (threads), each holding its
hosts' row locks open the way a provider call of a few seconds does.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connections, transaction

from fleet import placement
from fleet.models import Gpu
from fleet.placement import GpuRequest, InsufficientCapacity, PlacementContended

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "h100-sxm5-80gb"


def request(tenant, gpus, n):
    return GpuRequest(uuid.UUID(int=n + 1), tenant.id, MODEL, gpus, region="us-east-1")


class Claimant(threading.Thread):
    """Claims in its own transaction, then holds it open until told to commit or roll back."""

    def __init__(self, req: GpuRequest) -> None:
        super().__init__()
        self.req = req
        self.claimed = threading.Event()
        self.finish = threading.Event()
        self.commit = True
        self.outcome: object = None

    def run(self) -> None:
        try:
            with transaction.atomic():
                try:
                    [self.outcome] = placement.claim_gpus([self.req])
                except (InsufficientCapacity, PlacementContended) as exc:
                    self.outcome = exc
                self.claimed.set()
                self.finish.wait(60)
                if not self.commit:
                    transaction.set_rollback(True)
        finally:
            self.claimed.set()
            connections.close_all()


def test_twenty_concurrent_claims_on_twenty_hosts_all_succeed_on_distinct_hosts(
    make_host, tenant_a
):
    # Every claimant's best fit is the same first host; each holds its lock while the others
    # claim. The loaded candidates (2 x 1 + 16 = 18 per bucket) run out for the last ones, who
    # must load the next hosts rather than report missing capacity.
    for n in range(20):
        make_host(MODEL, gpus=8, hostname=f"h-{n:02d}")
    claimants = [Claimant(request(tenant_a, 8, n)) for n in range(20)]
    try:
        for c in claimants:  # one after another: each claims while all before it hold locks
            c.start()
            assert c.claimed.wait(30)
    finally:
        for c in claimants:
            c.finish.set()
        for c in claimants:
            c.join(30)
    outcomes = [c.outcome for c in claimants]
    assert all(isinstance(o, placement.Placement) for o in outcomes), outcomes
    assert sorted(o.hostname for o in outcomes) == [f"h-{n:02d}" for n in range(20)]
    assert Gpu.objects.filter(holder_id__isnull=False).count() == 160


def test_a_claim_on_a_locked_last_host_is_contended_then_capacity_once_it_is_taken(
    make_host, tenant_a
):
    make_host(MODEL, gpus=8, hostname="only")
    first = Claimant(request(tenant_a, 8, 0))
    first.start()
    assert first.claimed.wait(30)
    try:
        with pytest.raises(PlacementContended) as contended, transaction.atomic():
            placement.claim_gpus([request(tenant_a, 8, 1)])
        assert contended.value.locked_hosts == 1
        assert "being claimed by another request" in str(contended.value)
    finally:
        first.finish.set()
        first.join(30)
    assert isinstance(first.outcome, placement.Placement)
    # the other claim committed: now the fleet really is full
    with pytest.raises(InsufficientCapacity), transaction.atomic():
        placement.claim_gpus([request(tenant_a, 8, 1)])


def test_a_claim_that_met_a_rolled_back_claim_gets_the_host_on_retry(make_host, tenant_a):
    make_host(MODEL, gpus=8, hostname="only")
    first = Claimant(request(tenant_a, 8, 0))
    first.commit = False
    first.start()
    assert first.claimed.wait(30)
    try:
        with pytest.raises(PlacementContended), transaction.atomic():
            placement.claim_gpus([request(tenant_a, 8, 1)])
    finally:
        first.finish.set()
        first.join(30)
    with transaction.atomic():
        [placed] = placement.claim_gpus([request(tenant_a, 8, 1)])
    assert placed.hostname == "only"


@pytest.fixture
def pool(make_host, tenant_a):
    from clusters.models import Cluster, Operation
    from nodepools.models import NodePool

    make_host(MODEL, gpus=8, hostname="only")
    cluster = Cluster.objects.create(
        tenant=tenant_a,
        name="c1",
        kubernetes_version="1.36",
        control_plane_version="1.36",
        region="us-east-1",
        phase="RUNNING",
        generation=1,
        observed_generation=1,
    )
    pool = NodePool.objects.create(
        tenant=tenant_a,
        cluster=cluster,
        name="p1",
        gpu_model_id=MODEL,
        gpus_per_node=8,
        node_count=1,
        isolation={"mode": "exclusive"},
    )
    Operation.objects.create(
        tenant=tenant_a,
        cluster=cluster,
        type="CREATE_NODE_POOL",
        target_type="NODE_POOL",
        target_id=pool.id,
    )
    return pool


def test_the_reconciler_backs_off_on_contention_and_places_once_the_lock_is_gone(pool, tenant_a):
    from nodepools.models import Node, NodePool
    from nodepools.reconcile import reconcile_nodepool

    other = Claimant(request(tenant_a, 8, 99))
    other.commit = False
    other.start()
    assert other.claimed.wait(30)
    try:
        delay = reconcile_nodepool(pool.id)
    finally:
        other.finish.set()
        other.join(30)
    pool = NodePool.objects.get(pk=pool.pk)
    ready = next(c for c in pool.conditions if c["type"] == "Ready")
    assert 0.25 <= delay <= 0.5  # first retry: 0.5 s x jitter 0.5-1.0
    assert (pool.phase, pool.provision_failures) == ("PROVISIONING", 1)
    assert (ready["status"], ready["reason"]) == ("False", "PlacementContended")
    assert ready["message"].startswith("attempt 1 failed, retrying in")
    assert not Node.objects.filter(nodepool=pool).exists()  # the savepoint kept nothing
    assert reconcile_nodepool(pool.id) == 0.0
    pool = NodePool.objects.get(pk=pool.pk)
    assert (pool.provision_failures, pool.provision_retry_since) == (0, None)
    [node] = Node.objects.filter(nodepool=pool)
    assert Gpu.objects.filter(holder_id=node.id).count() == 8


def test_past_the_deadline_a_contended_pool_fails_saying_why(pool, tenant_a, settings):
    from clusters.models import Operation
    from nodepools.models import NodePool
    from nodepools.reconcile import reconcile_nodepool

    settings.NVKE_PROVIDER_RETRY_DEADLINE_S = 0
    other = Claimant(request(tenant_a, 8, 99))
    other.start()
    assert other.claimed.wait(30)
    try:
        assert reconcile_nodepool(pool.id) is None
    finally:
        other.finish.set()
        other.join(30)
    pool = NodePool.objects.get(pk=pool.pk)
    op = Operation.objects.get(target_id=pool.id)
    assert (pool.phase, op.status, op.error["code"]) == ("ERROR", "FAILED", "placement_contended")
    assert op.error["message"].startswith("gave up creating nodes after 1 attempt(s) over 0 s")
    assert "being claimed by another request" in op.error["message"]
