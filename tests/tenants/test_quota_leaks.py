"""Quota reservations are released on every path that ends a node pool, and the invariant
"reserved == what the live specs ask" (nodepools.quota_check) holds after randomised
create / scale / delete races between API-side services and reconcile steps.

Races are real: threads on separate PostgreSQL connections, row locks as in production.
"""

from __future__ import annotations

import os
import random
import threading
import traceback

import pytest
from django.db import connections, transaction

from nodepools.quota_check import expected_reservations, quota_drift

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "a10g"


@pytest.fixture
def principal(tenant_a, make_host):
    from tenants import quotas
    from tenants.principal import Principal

    for _ in range(12):
        make_host(MODEL, gpus=4, zone="us-east-1a")
    quotas.set_limits(tenant_a, max_clusters=50, max_nodes=40, max_gpus={MODEL: 80})
    return Principal(tenant_a, "owner", False, "apikey:test")


def new_cluster(principal, name):
    from clusters.models import Cluster
    from clusters.services import create_cluster
    from tests.helpers import drive_cluster

    op = create_cluster(
        principal=principal, name=name, kubernetes_version="1.36", region="us-east-1"
    )
    drive_cluster(op.target_id)
    return Cluster.objects.get(pk=op.target_id)


def new_pool(principal, cluster, name, nodes=2):
    from nodepools.models import NodePool
    from nodepools.services import create_nodepool

    op = create_nodepool(
        principal=principal,
        cluster=cluster,
        name=name,
        gpu_model=MODEL,
        gpus_per_node=1,
        node_count=nodes,
        isolation={"mode": "exclusive"},
    )
    return NodePool.objects.get(pk=op.target_id)


def converge(max_rounds: int = 60) -> None:
    """Step every cluster and pool until no reconciler asks to run again."""
    from clusters.models import Cluster
    from clusters.reconcile import reconcile_cluster
    from nodepools.models import NodePool
    from nodepools.reconcile import reconcile_nodepool

    for _ in range(max_rounds):
        pending = [reconcile_cluster(c) for c in Cluster.objects.values_list("id", flat=True)]
        pending += [reconcile_nodepool(p) for p in NodePool.objects.values_list("id", flat=True)]
        if all(d is None for d in pending):
            return
    raise AssertionError("did not converge")


def test_a_pool_deleted_through_its_cluster_while_its_reconciler_holds_it_releases_quota(
    principal, tenant_a
):
    from clusters.models import Cluster
    from clusters.reconcile import reconcile_cluster
    from clusters.services import delete_cluster
    from nodepools.models import NodePool
    from nodepools.reconcile import reconcile_nodepool
    from tenants.models import Quota

    cluster = new_cluster(principal, "c1")
    pool = new_pool(principal, cluster, "p1", nodes=3)
    converge()
    assert Quota.objects.get(tenant=tenant_a).reserved_nodes == 3
    holding, done = threading.Event(), threading.Event()

    def pool_reconciler_step():  # holds the pool row as reconcile_nodepool does
        try:
            with transaction.atomic():
                NodePool.objects.select_for_update().get(pk=pool.pk)
                holding.set()
                done.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=pool_reconciler_step)
    thread.start()
    assert holding.wait(10)
    try:
        delete_cluster(principal=principal, cluster=cluster)
        assert reconcile_cluster(cluster.id) is not None  # skipped the locked pool: waits
        assert NodePool.objects.get(pk=pool.pk).deletion_requested_at is None
    finally:
        done.set()
        thread.join(30)
    reconcile_nodepool(pool.id)  # the pool's own reconciler sees the cluster going
    converge()
    quota = Quota.objects.get(tenant=tenant_a)
    assert (quota.reserved_clusters, quota.reserved_nodes, quota.reserved_gpus) == (0, 0, {})
    assert Cluster.objects.get(pk=cluster.pk).phase == "DELETED"
    assert NodePool.objects.get(pk=pool.pk).phase == "DELETED"


def test_a_cancelled_scale_down_keeps_its_nodes_reserved(principal, tenant_a):
    from clusters.services import cancel_operation
    from nodepools.models import NodePool
    from nodepools.scaling import set_node_pool_size

    cluster = new_cluster(principal, "c1")
    pool = new_pool(principal, cluster, "p1", nodes=3)
    converge()
    op = set_node_pool_size(principal=principal, pool=pool, node_count=1)
    cancel_operation(principal=principal, operation=op)  # before any node was released
    converge()
    assert NodePool.objects.get(pk=pool.pk).node_count == 3
    assert expected_reservations(tenant_a.pk).nodes == 3
    assert quota_drift() == {}


KINDS = ["scale", "scale", "reconcile", "reconcile", "delete_pool", "delete_cluster",
         "create_pool", "reconcile_cluster"]  # fmt: skip
SEED = int(os.environ.get("NVKE_QUOTA_RACE_SEED", random.randrange(1 << 30)))


def test_randomised_create_scale_delete_races_leave_reserved_equal_to_live_specs(
    principal, tenant_a
):
    from clusters.models import Cluster
    from clusters.reconcile import reconcile_cluster
    from clusters.services import delete_cluster
    from nodepools.models import NodePool
    from nodepools.reconcile import reconcile_nodepool
    from nodepools.scaling import set_node_pool_size
    from nodepools.services import delete_nodepool
    from nvke.errors import ApiError

    print(f"seed {SEED} (NVKE_QUOTA_RACE_SEED={SEED} repeats it)")
    clusters = [new_cluster(principal, f"c{n}") for n in range(6)]
    for n, cluster in enumerate(clusters):
        new_pool(principal, cluster, "p0", nodes=1 + n % 2)
    errors: list[str] = []

    def actor(index: int) -> None:
        rng = random.Random(SEED + index)
        try:
            for step in range(25):
                kind = rng.choice(KINDS)
                cluster = rng.choice(clusters)
                pools = list(NodePool.objects.filter(cluster=cluster).exclude(phase="DELETED"))
                try:
                    if kind == "scale" and pools:
                        pool = rng.choice(pools)
                        set_node_pool_size(
                            principal=principal, pool=pool, node_count=rng.randint(0, 3)
                        )
                    elif kind == "reconcile" and pools:
                        reconcile_nodepool(rng.choice(pools).id)
                    elif kind == "delete_pool" and pools:
                        delete_nodepool(principal=principal, pool=rng.choice(pools))
                    elif kind == "delete_cluster" and rng.random() < 0.4:
                        delete_cluster(principal=principal, cluster=cluster)
                    elif kind == "create_pool":
                        new_pool(principal, Cluster.objects.get(pk=cluster.pk), f"a{index}s{step}")
                    elif kind == "reconcile_cluster":
                        reconcile_cluster(cluster.id)
                except ApiError:
                    pass  # quota, busy cluster, deleted pool: refusals are part of the race
        except Exception as exc:  # reported below with the seed
            errors.append(f"actor {index}: {exc!r}\n{traceback.format_exc()}")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=actor, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for error in errors:  # whole, with its traceback (the assertion's repr is cut short)
        print(error)
    assert errors == [], (SEED, errors)
    converge()
    assert quota_drift() == {}, SEED
    want = expected_reservations(tenant_a.pk)
    live = NodePool.objects.filter(
        deletion_requested_at__isnull=True, cluster__deletion_requested_at__isnull=True
    )
    assert want.nodes == sum(p.node_count for p in live)
