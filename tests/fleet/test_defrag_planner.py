"""The defragmentation planner in memory (fleet/defrag.py): hand-made hosts, values by hand.

The fleet of tests/fleet/test_fragmentation.py, zone us-east-1a, 8-GPU hosts of one island::

    h1  T1: node 1 (4 GPUs, 0-3), node 2 (2 GPUs, 4-5)   free 6, 7
    h2  T1: node 3 (2 GPUs, 0-1)                         free 2-7
    h3  nothing held                                     free 8
    h4  T2: seven 1-GPU nodes (0-6)                      free 7

Before: free 17; whole hosts free 1 (h3); stranded (free - k * nodes of k):
8: 17 - 8 = 9; 4: h2 1 + h3 2 = 3 nodes -> 5; 2: h1 1 + h2 3 + h3 4 = 8 -> 1; 1: 0.
"""

from __future__ import annotations

import uuid

from fleet.defrag import HOST, ISLAND, Move, Totals, plan_defrag
from tests.fleet.test_placement_planner import PAIRS, T1, T2, host


def node(n: int) -> uuid.UUID:
    return uuid.UUID(int=100 + n)


def hid(name: str) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_DNS, name)


def fleet():
    return [
        host("h1", held={0: node(1), 1: node(1), 2: node(1), 3: node(1), 4: node(2), 5: node(2)}),
        host("h2", held={0: node(3), 1: node(3)}),
        host("h3"),
        host("h4", held={i: node(10 + i) for i in range(7)}, tenant=T2),
    ]


BEFORE = Totals(
    hosts=4, whole_hosts_free=1, islands_free=0, free_gpus=17,
    stranded_gpus={8: 9, 4: 5, 2: 1, 1: 0},
)  # fmt: skip
# After h2 is freed: h1 full, h2 + h3 free, h4 free 1. 8: 2 nodes -> 17 - 16 = 1;
# 4: 2 + 2 = 4 nodes -> 1; 2: 4 + 4 = 8 -> 1; 1: 0.
AFTER = Totals(
    hosts=4, whole_hosts_free=2, islands_free=0, free_gpus=17,
    stranded_gpus={8: 1, 4: 1, 2: 1, 1: 0},
)  # fmt: skip


def test_the_least_held_host_is_emptied_into_the_tenants_partly_used_host():
    views = fleet()
    plan = plan_defrag(views, move_hours=0.25)
    # h2 (2 held) first: node 3 fits h1's free 6, 7 (same tenant, one island) -> h2 freed.
    # h1 received a node, so it is not emptied; h4's tenant T2 has no other host.
    [step] = plan.steps
    assert (step.kind, step.hostname) == (HOST, "h2")
    assert step.moves == (
        Move(
            holder_id=node(3),
            tenant_id=T1,
            group_id=None,
            gpus=2,
            from_host_id=hid("h2"),
            from_host="h2",
            from_gpu_indexes=(0, 1),
            to_host_id=hid("h1"),
            to_host="h1",
            to_gpu_indexes=(6, 7),
            gpu_hours=0.5,  # 2 GPUs x 0.25 h
        ),
    )
    assert plan.hosts_freed == ["h2"]
    assert (plan.before, plan.after) == (BEFORE, AFTER)
    assert plan.disrupted() == {T1: {"nodes": 1, "gpus": 2, "gpu_hours": 0.5}}
    # the snapshots given are not changed
    assert [g.holder for g in views[0].gpus][6:] == [None, None]


def test_a_pinned_node_keeps_its_host_which_can_still_receive_the_largest_nodes_first():
    # node 3 may not move (say it is provisioning): h2 stays; h1 (6 held) is emptied instead:
    # node 1 (4 GPUs) first -> h2's free 2-7, tightest fit is h2 (free 6): indexes 2-5;
    # then node 2 (2 GPUs) -> h2's 6, 7. 6 GPUs x 0.25 h = 1.5 GPU-hours.
    plan = plan_defrag(fleet(), pinned={node(3)}, move_hours=0.25)
    [step] = plan.steps
    assert step.hostname == "h1"
    assert [(m.holder_id, m.to_host, m.to_gpu_indexes, m.gpu_hours) for m in step.moves] == [
        (node(1), "h2", (2, 3, 4, 5), 1.0),
        (node(2), "h2", (6, 7), 0.5),
    ]
    assert plan.gpu_hours == 1.5
    assert plan.after == AFTER  # h1 free instead of h2: the same figures


def test_moves_respect_dedicated_hosts_zones_and_host_states():
    # a: T2's 1-GPU node. b: T1 (another tenant) with room. c: T2 in another zone.
    # d: T2, cordoned. None may take a's node: no step.
    views = [
        host("a", held={0: node(1)}, tenant=T2),
        host("b", held={0: node(2), 1: node(2)}, tenant=T1),
        host("c", held={0: node(3)}, tenant=T2, zone="us-east-1b"),
        host("d", held={0: node(4), 1: node(4)}, tenant=T2),
    ]
    views[3].schedulable = False
    assert plan_defrag(views).steps == []
    # d schedulable again: a (1 held) goes first, onto d's index 2 (lowest free of its island)
    views[3].schedulable = True
    plan = plan_defrag(views)
    assert [(s.hostname, [(m.to_host, m.to_gpu_indexes) for m in s.moves]) for s in plan.steps] == [
        ("a", [("d", (2,))])
    ]


def test_a_shared_node_may_go_to_a_shared_host_of_another_tenant_but_never_a_dedicated_one():
    views = [
        host("a", held={0: node(1)}, tenant=T2, shares=True),
        host("s", held={0: node(2)}, tenant=T1, shares=True),  # T1's node allows sharing
    ]
    # a (1 held, "a" < "s") empties onto s (index 1); then s received and is not emptied.
    plan = plan_defrag(views)
    assert [(s.hostname, [m.to_host for m in s.moves]) for s in plan.steps] == [("a", ["s"])]
    views[1].gpus[0].shares = False  # s is now dedicated to T1
    assert plan_defrag(views).steps == []


def test_an_nvlink_island_is_freed_into_a_partly_used_island():
    # H100 NVL host n1 (islands [0,1] [2,3] [4,5] [6,7]), T1: node a on 0, node b on 2,
    # node c on 4-5; free 1, 3, 6, 7. No other host: the host cannot be emptied.
    # Island 0 (a on 0, 1 free): a goes to the tightest partly used island: island 1 (free 3,
    # leftover 0) -> index 3. Island 1 then is full, island 2 full, island 3 wholly free.
    views = [host("n1", islands=PAIRS, held={0: node(1), 2: node(2), 4: node(3), 5: node(3)})]
    plan = plan_defrag(views, move_hours=0.5)
    [step] = plan.steps
    assert (step.kind, step.hostname, step.island, step.island_gpus) == (ISLAND, "n1", 0, (0, 1))
    assert [(m.holder_id, m.from_gpu_indexes, m.to_host, m.to_gpu_indexes) for m in step.moves] == [
        (node(1), (0,), "n1", (3,))
    ]
    assert plan.gpu_hours == 0.5  # 1 GPU x 0.5 h
    assert plan.islands_freed == [("n1", 0)]
    # before: free 1, 3, 6, 7; free islands: 3 -> 1; 2-GPU nodes inside islands: 1 (6-7),
    # stranded 4 - 2 = 2; 4- and 8-GPU: none -> 4 stranded. After: free 0, 1, 6, 7: islands
    # 0 and 3 free -> 2; 2-GPU nodes 2 -> stranded 0.
    assert plan.before == Totals(1, 0, 1, 4, {8: 4, 4: 4, 2: 2, 1: 0})
    assert plan.after == Totals(1, 0, 2, 4, {8: 4, 4: 4, 2: 0, 1: 0})


def test_an_island_is_never_moved_into_a_wholly_free_island():
    # n1: a on 0, free 1-7. Islands 1-3 are wholly free: moving a there frees nothing.
    views = [host("n1", islands=PAIRS, held={0: node(1)})]
    assert plan_defrag(views).steps == []


def test_the_plan_as_json_names_everything_as_strings():
    data = plan_defrag(fleet()).as_dict()
    assert data["hosts_freed"] == ["h2"]
    assert data["gpus_moved"] == 2
    assert data["disrupted"] == {str(T1): {"nodes": 1, "gpus": 2, "gpu_hours": 0.5}}
    assert data["steps"][0]["moves"][0]["to_gpu_indexes"] == [6, 7]
    assert data["after"]["stranded_gpus"] == {"8": 1, "4": 1, "2": 1, "1": 0}


def test_max_steps_keeps_the_first_steps_and_their_figures():
    # two tenants' hosts, each emptiable: T1's h2 into h1 (as above) and T2's g2 into g1
    views = [
        *fleet()[:3],
        host("g1", held={i: node(20 + i) for i in range(6)}, tenant=T2),
        host("g2", held={0: node(30)}, tenant=T2),
    ]
    # by GPUs held: g2 (1) then h2 (2): g2's node -> g1 index 6; h2's -> h1 6, 7
    assert plan_defrag(views).hosts_freed == ["g2", "h2"]
    plan = plan_defrag(views, max_steps=1)
    assert plan.hosts_freed == ["g2"]
    # before: whole hosts free 1 (h3); after the one kept step: 2 (h3, g2)
    assert (plan.before.whole_hosts_free, plan.after.whole_hosts_free) == (1, 2)
