"""Defragmentation runs end to end in the reconciler (nodepools/defrag.py): the dry run's
promise, the run through the host-drain machinery, the billing ledger, and the first blocked
move stopping the run.

Hosts are SIMULATED rows (``make_host``, 8 x H100 SXM, one NVSwitch island). Placement is
steered by cordoning hosts while pools are created, so the fleet starts fragmented::

    a-1  tenant A, cluster a1: one 4-GPU node   (4 free)
    a-2  tenant A, cluster a2: one 4-GPU node   (4 free)
    b-1  tenant B, cluster b1: one 4-GPU node   (4 free)
    b-2  tenant B, cluster b2: one 4-GPU node   (4 free)
    spare                nothing held           (8 free)

Plan by hand (hosts by GPUs held, then hostname: a-1, a-2, b-1, b-2, all 4): a-1's node fits
a-2's free GPUs 4-7 (same tenant) -> a-1 freed, a-2 received (not emptied); b-1's node ->
b-2's 4-7 -> b-1 freed. Two steps, two moves of 4 GPUs; 15 min each -> 4 x 0.25 = 1.0
GPU-hour per tenant. Before: whole hosts free 1 (spare), free GPUs 4 x 4 + 8 = 24, stranded
for 8-GPU nodes 24 - 8 x 1 = 16. After: whole hosts free 3 (a-1, b-1, spare), stranded 24 - 24
= 0.
"""

from __future__ import annotations

import itertools
import uuid

import pytest

from tests.nodepools.test_host_drain import BLOCKER, drive_all, make_pool

pytestmark = pytest.mark.django_db


@pytest.fixture
def fragmented(owner, outsider, make_host):
    """The fleet of the module docstring: ``{name: (cluster id, pool id)}`` and the hosts."""
    from fleet.services import cordon_host, uncordon_host

    hosts, pools = {}, {}
    for client, names in ((owner, ("a-1", "a-2")), (outsider, ("b-1", "b-2"))):
        for name in names:
            for other in hosts.values():
                cordon_host(other, actor="test")
            hosts[name] = make_host("h100-sxm5-80gb", gpus=8, hostname=name)
            pools[name] = make_pool(client, name.replace("-", ""))
            drive_all([pools[name][1]])
            for other in list(hosts.values())[:-1]:
                uncordon_host(other, actor="test")
    hosts["spare"] = make_host("h100-sxm5-80gb", gpus=8, hostname="spare")
    from nodepools.models import Node

    on = {n.host.hostname for n in Node.objects.filter(phase="READY").select_related("host")}
    assert on == {"a-1", "a-2", "b-1", "b-2"}
    return hosts, pools


def drive_run(run_id, pool_ids, rounds: int = 60) -> None:
    """The run's task and the pools' reconcilers in turn until the run ends."""
    from nodepools.defrag import advance_run
    from nodepools.reconcile import reconcile_nodepool

    for _ in range(rounds):
        delay = advance_run(run_id)
        for pool_id in pool_ids:
            reconcile_nodepool(pool_id)
        if delay is None:
            return
    raise AssertionError("the run did not end")


def test_the_dry_run_shows_what_it_frees_whom_it_disrupts_and_the_moves_in_order(
    fragmented, operator, tenant_a, tenant_b
):
    from nodepools.models import Node

    _hosts, pools = fragmented
    plan = operator.get("/api/v1/fleet/defrag/plan").json()
    assert plan["hosts_freed"] == ["a-1", "b-1"]
    assert plan["before"]["whole_hosts_free"] == 1
    assert plan["after"]["whole_hosts_free"] == 3
    assert (plan["before"]["free_gpus"], plan["after"]["free_gpus"]) == (24, 24)
    assert (plan["before"]["stranded_gpus"]["8"], plan["after"]["stranded_gpus"]["8"]) == (16, 0)
    node_a = Node.objects.get(nodepool_id=pools["a-1"][1], phase="READY")
    node_b = Node.objects.get(nodepool_id=pools["b-1"][1], phase="READY")
    moves = [m for s in plan["steps"] for m in s["moves"]]
    assert [
        (m["node"], m["tenant"]["name"], m["from_host"], m["to_host"], m["to_gpu_indexes"])
        for m in moves
    ] == [
        (node_a.name, tenant_a.name, "a-1", "a-2", [4, 5, 6, 7]),
        (node_b.name, tenant_b.name, "b-1", "b-2", [4, 5, 6, 7]),
    ]
    assert [m["window"] for m in moves] == ["now", "now"]  # no maintenance policy: any time
    assert plan["move_minutes"] == 15.0
    assert plan["gpu_hours"] == 2.0  # 2 moves x 4 GPUs x 0.25 h
    assert plan["tenants"] == {
        tenant_a.name: {"nodes": [node_a.name], "gpus": 4, "gpu_hours": 1.0},
        tenant_b.name: {"nodes": [node_b.name], "gpus": 4, "gpu_hours": 1.0},
    }
    # a dry run changes nothing
    assert Node.objects.filter(phase="READY").count() == 4
    assert operator.get("/api/v1/fleet/defrag/runs").json()["count"] == 0


def test_a_run_frees_exactly_the_promised_hosts_with_no_overlap_in_the_ledger(
    fragmented, operator, owner
):
    from billing.models import LedgerEntry
    from fleet.defrag import load_views, totals
    from fleet.models import Gpu, Host
    from nodepools.defrag_models import DefragRun
    from nodepools.models import Node

    _hosts, pools = fragmented
    promised = operator.get("/api/v1/fleet/defrag/plan").json()
    resp = operator.post("/api/v1/fleet/defrag/runs", {}, format="json")
    assert resp.status_code == 202, resp.content
    body = resp.json()
    assert resp["Location"] == f"http://testserver/api/v1/fleet/defrag/runs/{body['id']}"
    assert (body["status"], body["progress"]) == (
        "PENDING",
        {"done": 0, "total": 2, "stage": "0 of 2 step(s) done"},
    )
    # one run at a time
    again = operator.post("/api/v1/fleet/defrag/runs", {}, format="json")
    assert (again.status_code, again.json()["code"]) == (409, "defrag_run_active")

    drive_run(body["id"], [p for _, p in pools.values()])

    run = DefragRun.objects.get(pk=body["id"])
    assert (run.status, run.error, run.freed) == ("DONE", None, promised["hosts_freed"])
    assert run.progress == {"done": 2, "total": 2, "stage": "2 of 2 step(s) done; freed a-1, b-1"}
    for name in promised["hosts_freed"]:
        host = Host.objects.get(hostname=name)
        assert (host.state, host.drain_target) == ("AVAILABLE", "")
        assert not Gpu.objects.filter(host=host, holder_id__isnull=False).exists()
    after = totals(load_views())
    assert after.whole_hosts_free == promised["after"]["whole_hosts_free"] == 3
    assert after.stranded_gpus[8] == promised["after"]["stranded_gpus"]["8"] == 0
    # the moved nodes were replaced on the planned GPUs; the others did not move
    live = Node.objects.filter(phase="READY").select_related("host")
    placed = sorted(
        (
            n.host.hostname,
            sorted(Gpu.objects.filter(holder_id=n.id).values_list("index", flat=True)),
        )
        for n in live
    )
    assert placed == [
        ("a-2", [0, 1, 2, 3]),
        ("a-2", [4, 5, 6, 7]),
        ("b-2", [0, 1, 2, 3]),
        ("b-2", [4, 5, 6, 7]),
    ]
    for move in (m for s in promised["steps"] for m in s["moves"]):
        gone = Node.objects.get(pk=move["holder_id"])
        assert (gone.phase, gone.move_state) == ("DELETED", "moved")
        replacement = Node.objects.get(
            nodepool_id=move["pool"]["id"], phase="READY", host__hostname=move["to_host"]
        )
        old_rows = list(LedgerEntry.objects.filter(node_id=gone.id))
        new_rows = list(LedgerEntry.objects.filter(node_id=replacement.id))
        assert len(old_rows) == len(new_rows) == 4  # a row per GPU
        # replacement first: the replacement was READY no later than the old node's release
        # (here in the same reconcile step; the blocked test below has them apart), and the
        # tenant pays one node: the old rows end at the release and the new ones begin then
        assert replacement.ready_at <= gone.released_at
        assert {r.period.upper for r in old_rows} == {gone.released_at}
        assert {r.period.lower for r in new_rows} == {gone.released_at}
        assert {r.period.upper for r in new_rows} == {None}  # still running
        # different GPUs: on each GPU the rows never overlap (and the database forbids it)
        assert not {r.gpu_uuid for r in old_rows} & {r.gpu_uuid for r in new_rows}
    for gpu in set(LedgerEntry.objects.values_list("gpu_uuid", flat=True)):
        rows = sorted(LedgerEntry.objects.filter(gpu_uuid=gpu), key=lambda r: r.period.lower)
        for first, second in itertools.pairwise(rows):
            assert first.period.upper is not None and first.period.upper <= second.period.lower
    # each tenant saw its pool's HOST_MAINTENANCE operation finish
    ops = owner.get(f"/api/v1/operations?target_id={pools['a-1'][1]}").json()["results"]
    assert [(o["type"], o["status"]) for o in ops if o["type"] == "HOST_MAINTENANCE"] == [
        ("HOST_MAINTENANCE", "DONE")
    ]
    # the run is visible to operators only
    detail = operator.get(f"/api/v1/fleet/defrag/runs/{run.id}").json()
    assert (detail["status"], detail["freed"]) == ("DONE", ["a-1", "b-1"])


def test_a_blocked_drain_stops_the_run_at_that_move_naming_node_tenant_and_pods(
    fragmented, operator, tenant_a, settings
):
    from datetime import timedelta

    from django.utils import timezone

    from clusters.providers.simulated import simulate_drain_blockers
    from fleet.models import Host
    from nodepools.defrag import advance_run
    from nodepools.defrag_models import DefragRun
    from nodepools.models import Node
    from nodepools.reconcile import reconcile_nodepool

    _hosts, pools = fragmented
    node_a = Node.objects.get(nodepool_id=pools["a-1"][1], phase="READY")
    simulate_drain_blockers(node_a.id, [BLOCKER])
    try:
        run_id = operator.post("/api/v1/fleet/defrag/runs", {}, format="json").json()["id"]
        pool_ids = [p for _, p in pools.values()]
        later = timezone.now() + timedelta(seconds=settings.NVKE_HOST_DRAIN_TIMEOUT_S + 1)
        for _ in range(10):
            advance_run(run_id)
            for pool_id in pool_ids:
                reconcile_nodepool(pool_id)
        for pool_id in pool_ids:  # past the drain timeout the move pauses on the node
            reconcile_nodepool(pool_id, now=later)
        assert advance_run(run_id) is None
        run = DefragRun.objects.get(pk=run_id)
        assert (run.status, run.step, run.freed) == ("FAILED", 0, [])
        assert run.error == {
            "code": "move_blocked",
            "message": (
                f"node {node_a.name} of tenant {tenant_a.name} (cluster a1, pool h100): its "
                f"drain is blocked ({node_a.name}: {BLOCKER}; the operator drains the host "
                "again with force to evict them); a-1 stays cordoned with the replacement "
                "running: drain it again with force to go on, or uncordon it to cancel the move"
            ),
            "retryable": False,
        }
        assert run.progress["stage"].startswith("stopped at step 1 of 2: node ")
        # the replacement runs READY on a-2 beside the blocked node; the tenant pays one node
        from billing.models import LedgerEntry

        replacement = Node.objects.get(nodepool_id=pools["a-1"][1], phase="READY")
        assert replacement.host.hostname == "a-2"
        assert not LedgerEntry.objects.filter(node_id=replacement.id).exists()
        assert LedgerEntry.objects.filter(node_id=node_a.id, period__upper_inf=True).count() == 4
        # the second step never started: b-1 keeps its node, nothing cordoned there
        assert Host.objects.get(hostname="b-1").state == "ALLOCATED"
        assert Node.objects.filter(nodepool_id=pools["b-1"][1]).count() == 1
        assert advance_run(run_id) is None  # stays stopped
    finally:
        simulate_drain_blockers(node_a.id, [])


def test_a_closed_maintenance_window_stops_the_run_before_anything_changes(
    fragmented, operator, owner, outsider, tenant_b
):
    from django.utils import timezone

    from fleet.models import Host
    from nodepools.defrag import advance_run
    from nodepools.defrag_models import DefragRun
    from nodepools.models import Node
    from tests.helpers import snapshot

    _hosts, pools = fragmented
    now = timezone.now()
    closed_day = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"][(now.weekday() + 3) % 7]
    policy = {"windows": [{"days": [closed_day], "start": "00:00", "end": "23:59"}]}
    resp = outsider.patch(
        f"/api/v1/clusters/{pools['b-1'][0]}", {"maintenance_policy": policy}, format="json"
    )
    assert resp.status_code in (200, 202), resp.content
    plan = operator.get("/api/v1/fleet/defrag/plan").json()
    assert [m["window"] == "now" for s in plan["steps"] for m in s["moves"]] == [True, False]
    run_id = operator.post("/api/v1/fleet/defrag/runs", {}, format="json").json()["id"]
    drive_run(run_id, [p for _, p in pools.values()])
    run = DefragRun.objects.get(pk=run_id)
    # step 1 (a-1) done; step 2 (b-1) refused before any change
    assert (run.status, run.step, run.freed) == ("FAILED", 1, ["a-1"])
    assert run.error["code"] == "outside_maintenance_window"
    node_b = Node.objects.get(nodepool_id=pools["b-1"][1])
    assert run.error["message"].startswith(
        f"node {node_b.name} of tenant {tenant_b.name} (cluster b1, pool h100) may only move "
        "inside its cluster's maintenance window: the next one opens at "
    )
    assert (node_b.phase, node_b.move_state, node_b.host.hostname) == ("READY", "", "b-1")
    assert Host.objects.get(hostname="b-1").state == "ALLOCATED"
    before = snapshot()
    assert advance_run(run_id) is None
    assert snapshot() == before


def test_tenants_cannot_see_or_start_defragmentation(owner, viewer, outsider, anonymous, operator):
    from nodepools.defrag_models import DefragRun

    run = DefragRun.objects.create(requested_by="op", status="DONE", active=None)
    for client in (owner, viewer, outsider):
        for method, url in (
            ("get", "/api/v1/fleet/defrag/plan"),
            ("get", "/api/v1/fleet/defrag/runs"),
            ("get", f"/api/v1/fleet/defrag/runs/{run.id}"),
            ("post", "/api/v1/fleet/defrag/runs"),
        ):
            resp = getattr(client, method)(url, {}, format="json")
            assert (resp.status_code, resp.json()["code"]) == (403, "permission_denied"), url
    assert anonymous.get(f"/api/v1/fleet/defrag/runs/{run.id}").status_code == 401
    assert DefragRun.objects.count() == 1  # no tenant started one
    assert operator.get(f"/api/v1/fleet/defrag/runs/{uuid.uuid4()}").status_code == 404


def test_bad_plan_parameters_are_400_naming_the_field(operator):
    resp = operator.get("/api/v1/fleet/defrag/plan?max_steps=100000")
    assert resp.status_code == 400
    assert "max_steps" in str(resp.json())
    resp = operator.post("/api/v1/fleet/defrag/runs", {"move_minutes": -1}, format="json")
    assert resp.status_code == 400
    assert "move_minutes" in str(resp.json())
    # found by a re-probe: an unknown model planned nothing and a run of it ended DONE
    from nodepools.defrag_models import DefragRun

    for resp in (
        operator.get("/api/v1/fleet/defrag/plan?gpu_model=nope"),
        operator.post("/api/v1/fleet/defrag/runs", {"gpu_model": "nope"}, format="json"),
    ):
        body = resp.json()
        assert (resp.status_code, body["code"], body["field"]) == (
            400,
            "unknown_gpu_model",
            "gpu_model",
        )
    assert not DefragRun.objects.exists()


@pytest.fixture
def nvl_fleet(owner, make_host):
    """H100 NVL host n1 (SIMULATED; NVLink bridges join GPU pairs: islands [0,1] [2,3] [4,5]
    [6,7]). Tenant A: pool x's node on GPU 0 or 1, pool y's node on GPU 2 (x had a second node
    on the other GPU of island 0, scaled away; which one goes is the scale-down's choice
    between two nodes created at the same instant). n1 is the only host, so it cannot be
    emptied; island 0 (x's node, one GPU free) is freed by moving x's node into island 1's
    free GPU 3 (partly used, tightest)."""
    from fleet.models import Gpu
    from nodepools.models import Node
    from tests.helpers import drive_cluster

    n1 = make_host("h100-nvl-94gb", gpus=8, hostname="n1")
    for gpu in Gpu.objects.filter(host=n1):
        gpu.nvlink_island = gpu.index // 2
        gpu.save(update_fields=["nvlink_island"])
    cluster = owner.post(
        "/api/v1/clusters", {"name": "nvl", "kubernetes_version": "1.36", "region": "us-east-1"}
    ).json()["target_id"]
    drive_cluster(cluster)
    pools = {}
    for name, count in (("x", 2), ("y", 1)):
        op = owner.post(
            f"/api/v1/clusters/{cluster}/nodepools",
            {
                "name": name,
                "gpu_model": "h100-nvl-94gb",
                "gpus_per_node": 1,
                "node_count": count,
                "isolation": {"mode": "exclusive"},
            },
            format="json",
        ).json()
        pools[name] = op["target_id"]
        drive_all([pools[name]])
    owner.post(
        f"/api/v1/clusters/{cluster}/nodepools/{pools['x']}/set-size",
        {"node_count": 1},
        format="json",
    )
    drive_all(list(pools.values()))

    def held():
        return {
            g.index: name
            for name, pool in pools.items()
            for n in Node.objects.filter(nodepool_id=pool, phase="READY")
            for g in Gpu.objects.filter(holder_id=n.id)
        }

    [x_gpu] = [i for i, name in held().items() if name == "x"]
    assert x_gpu in (0, 1) and held() == {x_gpu: "x", 2: "y"}
    # TEST SET-UP: the released GPU's scrub, which the host's agent confirms in production
    Gpu.objects.filter(host=n1, index=1 - x_gpu).update(scrub_state="CLEAN")
    return n1, pools, x_gpu, held


def test_an_island_step_moves_one_node_and_frees_its_nvlink_island(owner, operator, nvl_fleet):
    """The fleet of :func:`nvl_fleet`."""
    from billing.models import LedgerEntry
    from fleet.models import Gpu
    from nodepools.defrag_models import DefragRun
    from nodepools.models import Node

    n1, pools, x_gpu, held = nvl_fleet
    old = Node.objects.get(nodepool_id=pools["x"], phase="READY")

    plan = operator.get("/api/v1/fleet/defrag/plan").json()
    assert plan["hosts_freed"] == []
    assert plan["islands_freed"] == [["n1", 0]]
    [step] = plan["steps"]
    assert (step["kind"], step["island_gpus"]) == ("island", [0, 1])
    assert [(m["node"], m["from_gpu_indexes"], m["to_gpu_indexes"]) for m in step["moves"]] == [
        (old.name, [x_gpu], [3])
    ]
    # free islands: before 2 (islands 2 and 3), after 3 (0, 2, 3)
    assert (plan["before"]["islands_free"], plan["after"]["islands_free"]) == (2, 3)
    assert plan["gpu_hours"] == 0.25  # 1 GPU x 15 min

    run_id = operator.post("/api/v1/fleet/defrag/runs", {}, format="json").json()["id"]
    drive_run(run_id, list(pools.values()))
    run = DefragRun.objects.get(pk=run_id)
    assert (run.status, run.error, run.freed) == ("DONE", None, ["n1 island 0"])
    assert held() == {2: "y", 3: "x"}
    old.refresh_from_db()
    assert (old.phase, old.move_state) == ("DELETED", "moved")
    assert not Gpu.objects.filter(host=n1, index__in=[0, 1], holder_id__isnull=False).exists()
    # the ledger: the old node's row (GPU 0 or 1) ends at its release, when the new one's
    # (GPU 3) begins
    new = Node.objects.get(nodepool_id=pools["x"], phase="READY")
    [old_row] = LedgerEntry.objects.filter(node_id=old.id)
    [new_row] = LedgerEntry.objects.filter(node_id=new.id)
    assert (old_row.period.upper, new_row.period.lower) == (old.released_at, old.released_at)
    assert old_row.gpu_uuid != new_row.gpu_uuid
    # the pool's HOST_MAINTENANCE operation (the drain machinery) moved it, and is DONE
    ops = owner.get(f"/api/v1/operations?target_id={pools['x']}").json()["results"]
    assert [o["status"] for o in ops if o["type"] == "HOST_MAINTENANCE"] == ["DONE"]


def test_a_blocked_island_move_stops_the_run_and_is_cancelled_unbilled(
    operator, nvl_fleet, settings
):
    """The fleet of :func:`nvl_fleet`; x's node has a pod whose budget allows no disruption."""
    from datetime import timedelta

    from django.utils import timezone

    from billing.models import LedgerEntry
    from clusters.providers.simulated import simulate_drain_blockers
    from nodepools.defrag import advance_run
    from nodepools.defrag_models import DefragRun
    from nodepools.models import Node
    from nodepools.reconcile import reconcile_nodepool

    _n1, pools, x_gpu, held = nvl_fleet
    old = Node.objects.get(nodepool_id=pools["x"], phase="READY")
    simulate_drain_blockers(old.id, [BLOCKER])
    try:
        run_id = operator.post("/api/v1/fleet/defrag/runs", {}, format="json").json()["id"]
        for _ in range(6):
            advance_run(run_id)
            reconcile_nodepool(pools["x"])
        [move] = DefragRun.objects.get(pk=run_id).plan["steps"][0]["moves"]
        replacement = Node.objects.get(pk=move["replacement_id"])  # the run's replacement
        assert (replacement.nodepool_id, replacement.phase) == (uuid.UUID(pools["x"]), "READY")
        assert not LedgerEntry.objects.filter(node_id=replacement.id).exists()  # one node paid
        later = timezone.now() + timedelta(seconds=settings.NVKE_HOST_DRAIN_TIMEOUT_S + 1)
        reconcile_nodepool(pools["x"], now=later)  # past the drain timeout: drain-blocked
        assert advance_run(run_id) is None
        run = DefragRun.objects.get(pk=run_id)
        assert (run.status, run.error["code"], run.freed) == ("FAILED", "move_blocked", [])
        assert run.error["message"].endswith(
            "the move is cancelled: the node stays and its replacement is scaled down"
        )
        # the run no longer asks for the move: the node stays, the surplus replacement goes
        drive_all(list(pools.values()))
        old.refresh_from_db()
        replacement.refresh_from_db()
        assert (old.phase, old.move_state) == ("READY", "")
        assert replacement.phase == "DELETED"
        assert held() == {x_gpu: "x", 2: "y"}
        assert not LedgerEntry.objects.filter(node_id=replacement.id).exists()  # never billed
    finally:
        simulate_drain_blockers(old.id, [])


def test_a_pool_kept_in_one_nvlink_domain_is_never_moved(fragmented, operator):
    """The planner knows islands, not multi-node NVLink domains: with cluster a1's pool set to
    keep its nodes in one domain, its node on a-1 is pinned, so a-1 is not emptied. By hand:
    a-1 skipped (pinned); a-2's node fits a-1's GPUs 4-7 (same tenant) -> a-2 freed; b-1's
    node -> b-2 -> b-1 freed."""
    from nodepools.models import NodePool

    _hosts, pools = fragmented
    NodePool.objects.filter(pk=pools["a-1"][1]).update(placement={"same_nvlink_domain": True})
    plan = operator.get("/api/v1/fleet/defrag/plan").json()
    moved = [m["cluster"]["name"] for step in plan["steps"] for m in step["moves"]]
    assert moved == ["a2", "b1"]
    assert plan["hosts_freed"] == ["a-2", "b-1"]
