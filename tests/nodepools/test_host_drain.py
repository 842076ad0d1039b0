"""Host drains end to end in the reconciler: the nodes of a drained host move off it (a
replacement first when there is room, else the pool runs short), with the drain rules of
upgrades; the host enters its target only when empty; messages count nodes.

Hosts are SIMULATED rows (``make_host``). Placement keeps a host dedicated to one tenant, so
tenant B's node is seated beside tenant A's by hand (:func:`tests.helpers.seat_on_shared_host`).
"""

from __future__ import annotations

import pytest

from tests.helpers import drive_cluster, seat_on_shared_host

pytestmark = pytest.mark.django_db

MIG = {"mode": "mig", "mig_profile": "1g.10gb"}
BLOCKER = "default/trainer-0 (PodDisruptionBudget trainer allows 0 disruptions)"


def make_pool(client, name: str) -> tuple[str, str]:
    cluster = client.post(
        "/api/v1/clusters", {"name": name, "kubernetes_version": "1.36", "region": "us-east-1"}
    ).json()["target_id"]
    drive_cluster(cluster)
    op = client.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {
            "name": "h100",
            "gpu_model": "h100-sxm5-80gb",
            "gpus_per_node": 4,
            "node_count": 1,
            "isolation": MIG,
        },
        format="json",
    ).json()
    assert op["type"] == "CREATE_NODE_POOL", op
    return cluster, op["target_id"]


def step(pool_id, times: int = 1):
    from nodepools.reconcile import reconcile_nodepool

    out = None
    for _ in range(times):
        out = reconcile_nodepool(pool_id)
    return out


def drive_all(pool_ids, max_rounds: int = 30) -> None:
    """Step every pool in turn until all converge (a blocked or short pool counts as done)."""
    from nodepools.reconcile import reconcile_nodepool

    for _ in range(max_rounds):
        delays = [reconcile_nodepool(p) for p in pool_ids]
        if all(d is None or d >= 30 for d in delays):
            return
    raise AssertionError("pools did not converge")


@pytest.fixture
def two_tenants_on_one_host(owner, outsider, make_host):
    """Tenant A's and tenant B's 4-GPU nodes on one 8-GPU host ``busy`` (nothing else)."""
    from nodepools.models import Node

    busy = make_host("h100-sxm5-80gb", gpus=8, hostname="busy")
    pool_a = make_pool(owner, "a")
    drive_all([pool_a[1]])
    b_home = make_host("h100-sxm5-80gb", gpus=8, hostname="b-home")
    pool_b = make_pool(outsider, "b")
    step(pool_b[1])  # placed on b-home (busy is tenant A's), not READY yet
    seat_on_shared_host(Node.objects.get(nodepool_id=pool_b[1]), busy)
    b_home.delete()
    drive_all([pool_b[1]])
    assert list(Node.objects.filter(phase="READY").values_list("host__hostname", flat=True)) == [
        "busy",
        "busy",
    ]
    assert len(set(Node.objects.values_list("tenant", flat=True))) == 2
    return busy, [pool_a, pool_b]


def drain(operator, host, **body):
    resp = operator.post(f"/api/v1/fleet/hosts/{host.id}/drain", body, format="json")
    assert resp.status_code == 200, resp.content
    return resp.json()


def test_a_drain_to_maintenance_moves_both_tenants_nodes_and_ends_with_an_empty_host(
    two_tenants_on_one_host,
    operator,
    owner,
    outsider,
    make_host,
    django_capture_on_commit_callbacks,
):
    from billing.models import LedgerEntry
    from clusters.models import Operation
    from fleet.models import Gpu, Host
    from nodepools.models import Node

    busy, pools = two_tenants_on_one_host
    # hosts are dedicated to one tenant: each tenant's replacement needs a host of its own
    make_host("h100-sxm5-80gb", gpus=8, hostname="spare-1")
    make_host("h100-sxm5-80gb", gpus=8, hostname="spare-2")
    old = {str(n.nodepool_id): n for n in Node.objects.filter(phase="READY")}
    with django_capture_on_commit_callbacks(execute=True):
        body = drain(operator, busy, target="MAINTENANCE")
    assert (body["state"], body["drain_target"], body["drain_nodes"]) == (
        "CORDONED",
        "MAINTENANCE",
        2,
    )
    assert body["state_reason"] == "draining to MAINTENANCE: 0 of 2 node(s) moved, 2 pending"
    # the receiver gave each tenant's pool a HOST_MAINTENANCE operation the tenant can see
    for client, (_cluster, pool_id) in zip((owner, outsider), pools, strict=True):
        ops = client.get(f"/api/v1/operations?target_id={pool_id}").json()["results"]
        assert [(o["type"], o["status"]) for o in ops if o["type"] == "HOST_MAINTENANCE"] == [
            ("HOST_MAINTENANCE", "PENDING")
        ]

    # pool A moves first: its replacement is placed on a spare host while the old node serves
    pool_a, pool_b = (p for _, p in pools)
    step(pool_a)  # mark + place the replacement
    nodes_a = list(Node.objects.filter(nodepool_id=pool_a).order_by("created_at"))
    assert [(n.host.hostname, n.phase, n.move_state) for n in nodes_a] == [
        ("busy", "READY", "replacing"),
        ("spare-1", "PROVISIONING", ""),  # best fit, then hostname
    ]
    drive_all([pool_a])
    assert Host.objects.get(pk=busy.pk).state_reason == (
        "draining to MAINTENANCE: 1 of 2 node(s) moved, 1 pending"
    )
    assert Host.objects.get(pk=busy.pk).state == "CORDONED"
    drive_all([pool_b])

    busy.refresh_from_db()
    assert (busy.state, busy.drain_target, busy.state_reason) == (
        "MAINTENANCE",
        "",
        "drained to MAINTENANCE: 2 of 2 node(s) moved, none pending",
    )
    assert not Gpu.objects.filter(host=busy, holder_id__isnull=False).exists()
    clients = (owner, outsider)
    for client, (cluster, pool_id), spare in zip(
        clients, pools, ("spare-1", "spare-2"), strict=True
    ):
        pool = client.get(f"/api/v1/clusters/{cluster}/nodepools/{pool_id}").json()
        assert pool["phase"] == "RUNNING"
        assert [(n["host"], n["phase"]) for n in pool["nodes"]] == [(spare, "READY")]
        op = Operation.objects.get(target_id=pool_id, type="HOST_MAINTENANCE")
        assert (op.status, op.progress) == (
            "DONE",
            {
                "done": 1,
                "total": 1,
                "stage": "1 of 1 node(s) moved off drained hosts, none pending",
            },
        )
        # the ledger: the old node's rows closed when it was released, the new ones open
        old_node = Node.objects.get(pk=old[pool_id].pk)
        assert (old_node.phase, old_node.move_state) == ("DELETED", "moved")
        closed = LedgerEntry.objects.filter(node=old_node)
        assert closed.count() == 4
        assert {(e.period.lower, e.period.upper) for e in closed} == {
            (old_node.ready_at, old_node.released_at)
        }
        new_node = Node.objects.get(nodepool_id=pool_id, phase="READY")
        opened = LedgerEntry.objects.filter(node=new_node)
        assert sorted(e.gpu_uuid for e in opened) == sorted(new_node.gpu_uuids)
        assert {(e.period.lower, e.period.upper) for e in opened} == {(new_node.ready_at, None)}


def test_without_capacity_the_pool_runs_short_says_so_and_heals_when_capacity_returns(
    two_tenants_on_one_host, operator, owner, outsider, make_host
):
    from clusters.models import Operation
    from fleet.models import Host
    from nodepools.models import Node, NodePool

    busy, pools = two_tenants_on_one_host
    small = make_host("h100-sxm5-80gb", gpus=4, hostname="small")  # room for one node only
    pool_a, pool_b = (p for _, p in pools)
    # one what-if for both pools: ``small`` takes A's node (cluster a first), none is left for
    # B's, so the drain is refused naming B only (each pool alone would have fit)
    refused = operator.post(
        f"/api/v1/fleet/hosts/{busy.id}/drain", {"target": "MAINTENANCE"}, format="json"
    )
    assert refused.status_code == 409, refused.content
    assert [(c["cluster_name"], c["kind"]) for c in refused.json()["commitments"]] == [
        ("b", "no_replacement")
    ]
    drain(operator, busy, target="MAINTENANCE", force=True)
    drive_all([pool_a])  # A gets ``small``
    drive_all([pool_b])  # B finds no room: its node moves off anyway
    assert list(Node.objects.filter(phase="READY").values_list("nodepool_id", "host")) == [
        (uuid_of(pool_a), small.pk)
    ]
    b = NodePool.objects.get(pk=pool_b)
    short = next(c for c in b.conditions if c["type"] == "CapacityShort")
    assert b.phase == "DEGRADED"
    assert (short["status"], short["reason"]) == ("True", "InsufficientCapacity")
    assert short["message"].startswith("runs 0 of 1 node(s): no capacity for 1 missing node(s) (")
    assert short["message"].endswith(
        "; short since nodes moved off drained hosts; retried every 30 s"
    )
    assert Operation.objects.get(target_id=pool_b, type="HOST_MAINTENANCE").progress["stage"] == (
        "1 of 1 node(s) moved off drained hosts, none pending; the pool runs short: no "
        "capacity for a replacement (condition CapacityShort)"
    )
    busy.refresh_from_db()
    assert (busy.state, busy.state_reason) == (
        "MAINTENANCE",
        "drained to MAINTENANCE: 2 of 2 node(s) moved, none pending",
    )
    # a short pool is not failed: it keeps trying, and heals once a host is added
    assert step(pool_b) == 30.0
    make_host("h100-sxm5-80gb", gpus=8, hostname="new")
    drive_all([pool_b])
    b.refresh_from_db()
    assert b.phase == "RUNNING"
    assert next(c for c in b.conditions if c["type"] == "CapacityShort")["status"] == "False"
    # the finished move no longer says the pool runs short (a trial read it on RUNNING)
    moved = next(c for c in b.conditions if c["type"] == "HostMaintenance")
    assert (moved["status"], moved["message"]) == (
        "False",
        "1 of 1 node(s) moved off drained hosts, none pending; replaced once capacity returned",
    )
    assert list(
        Node.objects.filter(nodepool_id=pool_b, phase="READY").values_list(
            "host__hostname", flat=True
        )
    ) == ["new"]
    assert Host.objects.get(hostname="busy").state == "MAINTENANCE"


def uuid_of(value):
    import uuid

    return uuid.UUID(str(value))


def test_a_blocked_drain_waits_pauses_naming_the_pods_and_a_forced_drain_finishes(
    two_tenants_on_one_host, operator, make_host, settings
):
    from datetime import timedelta

    from django.utils import timezone

    from clusters.providers.simulated import simulate_drain_blockers
    from fleet.models import Host
    from nodepools.models import Node, NodePool
    from nodepools.reconcile import reconcile_nodepool

    busy, pools = two_tenants_on_one_host
    make_host("h100-sxm5-80gb", gpus=8, hostname="spare")
    make_host("h100-sxm5-80gb", gpus=8, hostname="spare-b")  # hosts are one tenant's each
    pool_a = pools[0][1]
    old = Node.objects.get(nodepool_id=pool_a)
    simulate_drain_blockers(old.id, [BLOCKER])
    try:
        drain(operator, busy, target="RETIRED")
        for _ in range(4):
            reconcile_nodepool(pool_a)
        old.refresh_from_db()
        assert (old.phase, old.move_state) == ("DRAINING", "draining")  # waiting for the pod
        # past the drain timeout the move pauses on the node, naming the pod
        later = timezone.now() + timedelta(seconds=settings.NVKE_HOST_DRAIN_TIMEOUT_S + 1)
        assert reconcile_nodepool(pool_a, now=later) is None
        old.refresh_from_db()
        assert old.move_state == "drain-blocked"
        pool = NodePool.objects.get(pk=pool_a)
        blocked = next(c for c in pool.conditions if c["type"] == "HostDrainBlocked")
        assert (blocked["status"], blocked["message"]) == (
            "True",
            f"{old.name}: {BLOCKER}; the operator drains the host again with force to evict them",
        )
        assert reconcile_nodepool(pool_a) is None  # stays paused without force
        assert Host.objects.get(pk=busy.pk).state == "CORDONED"
        # the operator drains again with force: the pod is evicted, the node released
        body = drain(operator, busy, target="RETIRED", force=True)
        assert body["state_reason"] == "draining to RETIRED: 0 of 2 node(s) moved, 2 pending"
        drive_all([pool_a])
        old.refresh_from_db()
        assert (old.phase, old.move_state) == ("DELETED", "moved")
        assert Host.objects.get(pk=busy.pk).state_reason == (
            "draining to RETIRED: 1 of 2 node(s) moved, 1 pending"
        )
    finally:
        simulate_drain_blockers(old.id, [])


def test_running_the_reconciler_again_changes_nothing_and_a_lost_signal_is_caught_up(
    two_tenants_on_one_host, operator, make_host
):
    """No ``host_drain_requested`` is delivered here (on_commit callbacks do not run): the
    reconciler reads the host row itself, and the resync lists the pools to wake."""
    from nodepools.models import Node
    from nodepools.reconcile import nodepools_needing_reconcile
    from tests.helpers import snapshot

    busy, pools = two_tenants_on_one_host
    make_host("h100-sxm5-80gb", gpus=8, hostname="spare")
    make_host("h100-sxm5-80gb", gpus=8, hostname="spare-b")  # hosts are one tenant's each
    drain(operator, busy, target="CORDONED")
    ids = {p for _, p in pools}
    assert ids <= {str(i) for i in nodepools_needing_reconcile()}
    drive_all(list(ids))
    before = snapshot()
    drive_all(list(ids))
    assert snapshot() == before
    busy.refresh_from_db()
    assert (busy.state, busy.drain_target) == ("CORDONED", "")
    assert not Node.objects.filter(host=busy).exclude(phase="DELETED").exists()


def test_an_uncordon_cancels_the_moves_and_the_replacement_is_scaled_down(
    two_tenants_on_one_host, operator, make_host
):
    from nodepools.models import Node

    busy, pools = two_tenants_on_one_host
    make_host("h100-sxm5-80gb", gpus=8, hostname="spare")
    make_host("h100-sxm5-80gb", gpus=8, hostname="spare-b")  # hosts are one tenant's each
    pool_a = pools[0][1]
    old = Node.objects.get(nodepool_id=pool_a)
    drain(operator, busy, target="MAINTENANCE")
    step(pool_a)  # replacement placed
    resp = operator.post(f"/api/v1/fleet/hosts/{busy.id}/uncordon")
    assert resp.status_code == 200
    drive_all([pool_a])
    assert list(
        Node.objects.filter(nodepool_id=pool_a).exclude(phase="DELETED").values_list("pk", "phase")
    ) == [(old.pk, "READY")]
