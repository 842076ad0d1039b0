"""The one disruption path (nodepools/disruption.py): the drain primitive under each policy,
on the simulated provider's kubelets, and the rule for which node leaves a pool first. Each
caller through its own entry point: tests/nodepools/test_disruption_callers.py; each caller's
gate (the tenant's checkpoint): tests/nodepools/test_checkpoints.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.helpers import drive_pool, running_h100_pool

pytestmark = pytest.mark.django_db

BLOCKER = "default/trainer-0 (PodDisruptionBudget trainer allows 0 disruptions)"


@pytest.fixture
def pool(owner, make_host):
    return running_h100_pool(owner, make_host, hosts=4, nodes=3)


@pytest.mark.parametrize(
    ("case", "blocked", "on_timeout", "force", "waited_s", "outcome", "blockers"),
    [
        ("drained", False, "pause", False, 0, "drained", []),
        ("blocked, within the timeout", True, "pause", False, 10, "waiting", [BLOCKER]),
        ("blocked -> pause", True, "pause", False, 61, "blocked", [BLOCKER]),
        ("blocked -> evict", True, "evict", False, 61, "drained", [BLOCKER]),
        ("blocked -> fail", True, "fail", False, 61, "failed", [BLOCKER]),
        ("force", True, "pause", True, 0, "drained", []),
    ],
)
def test_the_drain_primitive_follows_its_policy(
    pool, case, blocked, on_timeout, force, waited_s, outcome, blockers
):
    from clusters.providers import get_provider
    from clusters.providers.simulated import simulate_drain_blockers
    from nodepools import disruption
    from nodepools.models import Node, NodePool
    from nodepools.specs import nodepool_spec

    _, pool_id = pool
    row = NodePool.objects.select_related("cluster").get(pk=pool_id)
    node = Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name").first()
    backend = disruption.backend_for(get_provider(row.cluster.provider), nodepool_spec(row))
    policy = disruption.DrainPolicy(timeout_s=60, on_timeout=on_timeout, force=force)
    t0 = timezone.now()
    simulate_drain_blockers(node.id, [BLOCKER] if blocked else [])
    try:
        first = disruption.drain(node, policy, backend, t0)
        node.refresh_from_db()
        assert (node.phase, node.drain_started_at) == ("DRAINING", t0)  # cordoned at once
        result = disruption.drain(node, policy, backend, t0 + timedelta(seconds=waited_s))
    finally:
        simulate_drain_blockers(node.id, [])
    assert (result.outcome, result.blockers) == (outcome, blockers), case
    if waited_s == 0:
        assert first == result


def test_a_gate_holds_the_drain_before_any_eviction_even_when_forced(pool):
    from clusters.providers import get_provider
    from nodepools import disruption
    from nodepools.models import Node, NodePool
    from nodepools.specs import nodepool_spec

    _, pool_id = pool
    row = NodePool.objects.select_related("cluster").get(pk=pool_id)
    node = Node.objects.filter(nodepool_id=pool_id).first()
    backend = disruption.backend_for(get_provider(row.cluster.provider), nodepool_spec(row))

    def checkpoint_gate(n, policy, now):
        return f"{n.name}: waiting for a checkpoint" if n.pk == node.pk else None

    disruption.GATES.append(checkpoint_gate)
    try:
        result = disruption.drain(
            node, disruption.DrainPolicy(timeout_s=0, force=True), backend, timezone.now()
        )
    finally:
        disruption.GATES.remove(checkpoint_gate)
    assert (result.outcome, result.blockers) == (
        "waiting",
        [f"{node.name}: waiting for a checkpoint"],
    )


def test_removal_order_takes_unhealthy_nodes_first_then_the_newest(pool):
    from nodepools.disruption import removal_order
    from nodepools.models import Node

    _, pool_id = pool
    oldest, middle, newest = Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name")
    t0 = timezone.now()
    for i, node in enumerate((oldest, middle, newest)):
        node.created_at = t0 + timedelta(seconds=i)
    oldest.phase = "NOT_READY"
    assert [n.name for n in removal_order([oldest, middle, newest])] == [
        oldest.name,
        newest.name,
        middle.name,
    ]
    oldest.phase, middle.disruption, middle.disruption_step = "READY", "repair", "requested"
    assert removal_order([oldest, middle, newest])[0] is middle


def test_scale_down_removes_the_broken_node_and_keeps_the_healthy_ones(owner, pool):
    """The new user's sequence: a pool with a broken (NOT_READY) node scaled 3 -> 2 kept the
    broken node and removed a healthy one."""
    from nodepools.models import Node

    cluster, pool_id = pool
    nodes = list(Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name"))
    broken = nodes[0]  # the oldest: the newest-first rule alone would keep it
    Node.objects.filter(pk=broken.pk).update(phase="NOT_READY")
    resp = owner.post(f"/api/v1/clusters/{cluster}/nodepools/{pool_id}/set-size", {"node_count": 2})
    assert resp.status_code == 202
    drive_pool(pool_id)
    phases = dict(Node.objects.filter(nodepool_id=pool_id).values_list("name", "phase"))
    assert phases == {broken.name: "DELETED", nodes[1].name: "READY", nodes[2].name: "READY"}


def test_dry_runs_are_answered_while_an_operation_holds_the_cluster(owner, pool):
    """The new user's sequence: while a scale-down was PENDING every change on the cluster —
    dry runs included — answered 409 operation_in_progress."""
    from nodepools.models import Node

    cluster, pool_id = pool
    url = f"/api/v1/clusters/{cluster}/nodepools/{pool_id}"
    resize = owner.post(f"{url}/set-size", {"node_count": 2})
    assert resize.status_code == 202  # not driven: it holds the cluster's operation lock
    change = {"isolation": {"mode": "time-slicing", "replicas": 4}}
    real = owner.patch(url, change, format="json")
    assert (real.status_code, real.json()["code"]) == (409, "operation_in_progress")
    looked = owner.patch(f"{url}?dry_run=true", change, format="json")
    assert looked.status_code == 200
    body = looked.json()
    live = Node.objects.live().filter(nodepool_id=pool_id).count()
    assert (body["dry_run"], body["disruption"]["drain"], len(body["disruption"]["nodes"])) == (
        True,
        live,
        live,
    )
    created = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools?dry_run=true",
        {"name": "more", "gpu_model": "h100-sxm5-80gb", "gpus_per_node": 8, "node_count": 1},
        format="json",
    )
    assert (created.status_code, created.json()["dry_run"]) == (200, True)


def test_an_isolation_change_of_a_shared_mig_pool_is_409_before_anything_is_touched(
    owner, make_host, operator
):
    """The new user's sequence: a PATCH of a shared MIG pool's isolation (not built) answered
    202, then failed with isolation_rollback_failed and left a node NOT_READY for good."""
    from nodepools.models import Node, NodePool
    from tests.helpers import make_cluster
    from tests.nodepools.test_shared_hosts import make_pool, shared

    host = make_host("h100-sxm5-80gb", gpus=2, hostname="hv-shared-9")
    operator.post(f"/api/v1/fleet/hosts/{host.id}/tenancy", {"tenancy": "shared"}, format="json")
    cluster = make_cluster(owner, "sh")
    pool_id = make_pool(owner, cluster, "mig1g", shared("1g.10gb"))
    drive_pool(pool_id)
    before = NodePool.objects.get(pk=pool_id)
    url = f"/api/v1/clusters/{cluster}/nodepools/{pool_id}"
    for suffix in ("", "?dry_run=true"):
        resp = owner.patch(f"{url}{suffix}", {"isolation": shared("2g.20gb")}, format="json")
        assert (resp.status_code, resp.json()["code"]) == (409, "isolation_change_not_supported")
        assert "shared" in resp.json()["detail"]
    after = NodePool.objects.get(pk=pool_id)
    assert (after.isolation, after.generation, after.phase, after.rollout) == (
        before.isolation,
        before.generation,
        "RUNNING",
        {},
    )
    assert list(Node.objects.filter(nodepool_id=pool_id).values_list("phase", flat=True)) == [
        "READY"
    ]
    from clusters.models import Operation

    assert list(Operation.objects.filter(target_id=pool_id).values_list("type", flat=True)) == [
        "CREATE_NODE_POOL"
    ]


def test_the_new_users_sequence_on_a_shared_pool_with_a_broken_node(owner, make_host, operator):
    """Broken shared pool -> scale 4 -> 3 removes the broken node; a dry run is answered while
    the resize holds the cluster; once it is done the cluster takes the next change (no
    cluster-wide 409 left behind)."""
    from nodepools.models import Node, NodePool
    from tests.helpers import make_cluster
    from tests.nodepools.test_shared_hosts import MODEL, make_pool, shared

    host = make_host(MODEL, gpus=2, hostname="hv-shared-7")
    operator.post(f"/api/v1/fleet/hosts/{host.id}/tenancy", {"tenancy": "shared"}, format="json")
    cluster = make_cluster(owner, "newuser")
    pool_id = make_pool(owner, cluster, "mig1g", shared("1g.10gb"), nodes=4)
    drive_pool(pool_id)
    nodes = list(Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name"))
    assert [n.phase for n in nodes] == ["READY"] * 4
    broken = nodes[0]  # the oldest: newest-first alone would keep it
    Node.objects.filter(pk=broken.pk).update(phase="NOT_READY")

    url = f"/api/v1/clusters/{cluster}/nodepools/{pool_id}"
    resize = owner.post(f"{url}/set-size", {"node_count": 3})
    assert resize.status_code == 202
    # while the resize holds the cluster: a real change is 409, a dry run is answered
    other = {"name": "more", "gpu_model": MODEL, "gpus_per_node": 1, "node_count": 1}
    busy = owner.post(f"/api/v1/clusters/{cluster}/nodepools", other, format="json")
    assert (busy.status_code, busy.json()["code"]) == (409, "operation_in_progress")
    looked = owner.post(f"/api/v1/clusters/{cluster}/nodepools?dry_run=true", other, format="json")
    assert (looked.status_code, looked.json()["dry_run"]) == (200, True)

    drive_pool(pool_id)
    phases = dict(Node.objects.filter(nodepool_id=pool_id).values_list("name", "phase"))
    assert phases == {
        broken.name: "DELETED",
        **{n.name: "READY" for n in nodes[1:]},
    }
    op = owner.get(f"/api/v1/operations/{resize.json()['id']}").json()
    assert op["status"] == "DONE"
    assert NodePool.objects.get(pk=pool_id).phase == "RUNNING"
    taken = owner.post(f"/api/v1/clusters/{cluster}/nodepools", other, format="json")
    assert taken.status_code == 202, taken.content  # the cluster is free again
