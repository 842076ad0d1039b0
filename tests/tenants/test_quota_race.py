"""Quotas under concurrency: 20 scale requests race through separate PostgreSQL connections.

Every request holds its transaction open behind a barrier, so all 20 are in flight at once.
With the quota row lock exactly the right number succeed; with the lock removed (and the
requests lined up between reading and writing the reservation) the limit is overrun, which
shows the test really tests the lock.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from tests.helpers import race_outcome, run_at_once

pytestmark = pytest.mark.django_db(transaction=True)

POOLS = 20
LIMIT = 30  # 20 nodes reserved already: room for exactly 10 more


@pytest.fixture
def pools(catalog, tenant_a, make_host):
    from clusters.models import Cluster
    from nodepools.models import NodePool
    from tenants import quotas
    from tenants.principal import Principal

    make_host("a10g", gpus=1)
    # one pool per cluster: a cluster runs one mutating operation at a time
    rows = [
        NodePool.objects.create(
            tenant=tenant_a,
            cluster=Cluster.objects.create(
                tenant=tenant_a,
                name=f"c{i}",
                kubernetes_version="1.36",
                region="us-east-1",
                phase="RUNNING",
            ),
            name=f"p{i}",
            gpu_model_id="a10g",
            gpus_per_node=1,
            node_count=1,
            isolation={"mode": "exclusive"},
        )
        for i in range(POOLS)
    ]
    with transaction.atomic():
        quotas.reserve(tenant_a.pk, nodes=POOLS, gpus={"a10g": POOLS})
    quotas.set_limits(tenant_a, max_nodes=LIMIT, max_gpus={"a10g": 1000})
    principal = Principal(tenant_a, "owner", False, "apikey:test")
    return principal, rows


def race(principal, rows, *, barrier_inside: bool):
    """Scale every pool from 1 to 2 nodes at once; returns each request's outcome (``ok`` or
    the refusal's code)."""
    from nodepools.scaling import set_node_pool_size
    from tenants import quotas

    def scale(i, wait):
        with transaction.atomic():
            wait()  # every transaction is open before anyone proceeds
            set_node_pool_size(principal=principal, pool=rows[i], node_count=2)
        return "ok"

    hook = (quotas, "_after_read") if barrier_inside else None
    outcomes = run_at_once(len(rows), scale, hook=hook, barrier_timeout_s=30, join_s=60)
    return [race_outcome(o) for o in outcomes]


def test_exactly_the_free_quota_is_granted_under_a_20_way_race(pools):
    from nodepools.models import NodePool
    from tenants.models import Quota

    principal, rows = pools
    outcomes = race(principal, rows, barrier_inside=False)
    assert sorted(set(outcomes)) == ["ok", "quota_exceeded"], outcomes
    assert outcomes.count("ok") == LIMIT - POOLS == 10
    assert outcomes.count("quota_exceeded") == 10
    assert sum(NodePool.objects.values_list("node_count", flat=True)) == LIMIT
    assert Quota.objects.get().reserved_nodes == LIMIT


def test_without_the_row_lock_the_same_race_overruns_the_quota(pools, monkeypatch):
    from nodepools.models import NodePool
    from tenants import quotas

    monkeypatch.setattr(quotas, "LOCK_QUOTA_ROW", False)
    principal, rows = pools
    outcomes = race(principal, rows, barrier_inside=True)
    # every request read "20 reserved" before any wrote: all 20 pass, the limit is overrun
    assert outcomes.count("ok") == POOLS
    assert sum(NodePool.objects.values_list("node_count", flat=True)) == 2 * POOLS > LIMIT
