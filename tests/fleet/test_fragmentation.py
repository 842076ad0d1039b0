"""Fragmentation report and defragmenting moves (fleet/fragmentation.py), by hand.

Zone us-east-1a, four 8-GPU hosts (one NVSwitch island each)::

    h1  T1 holds a 4-GPU and a 2-GPU node   free 2
    h2  T1 holds a 2-GPU node               free 6
    h3  nothing held                        free 8
    h4  T2 holds seven 1-GPU nodes          free 1

    free 17, whole hosts free 1 (h3), on hosts held by a tenant 2 + 6 + 1 = 9
    8-GPU nodes: 1 (h3)                         stranded 17 - 8  = 9
    4-GPU nodes: h2 1 + h3 2 = 3                stranded 17 - 12 = 5
    2-GPU nodes: h1 1 + h2 3 + h3 4 = 8         stranded 17 - 16 = 1
    1-GPU nodes: 17                             stranded 0

Moves, emptying the least-held hosts first: h2's 2-GPU node fits h1's two free GPUs (same
tenant) -> h2 freed. h1 (now full) and h4 (T2 has no other host) cannot be emptied.
"""

from __future__ import annotations

import uuid

import pytest

from fleet.fragmentation import plan_moves, summarise
from tests.fleet.test_placement_planner import T1, T2, host


def node(n: int) -> uuid.UUID:
    return uuid.UUID(int=100 + n)


def fleet():
    return [
        host("h1", held={0: node(1), 1: node(1), 2: node(1), 3: node(1), 4: node(2), 5: node(2)}),
        host("h2", held={0: node(3), 1: node(3)}),
        host("h3"),
        host("h4", held={i: node(10 + i) for i in range(7)}, tenant=T2),
    ]


def test_the_summary_by_hand():
    [group] = summarise(fleet(), {"h100-sxm5-80gb": [("1g.10gb", 7), ("7g.80gb", 1)]})
    assert group == {
        "gpu_model": "h100-sxm5-80gb",
        "zone": "us-east-1a",
        "hosts": 4,
        "whole_hosts_free": 1,
        "free_gpus": 17,
        "dedicated_free_gpus": 9,
        "shared_hosts": 0,
        "shared_free_gpus": 0,
        "shared_in_instances_gpus": 0,
        "shapes": [
            {"gpus": 8, "nodes": 1, "stranded_gpus": 9},
            {"gpus": 4, "nodes": 3, "stranded_gpus": 5},
            {"gpus": 2, "nodes": 8, "stranded_gpus": 1},
            {"gpus": 1, "nodes": 17, "stranded_gpus": 0},
        ],
        "mig": [{"profile": "1g.10gb", "instances": 119}, {"profile": "7g.80gb", "instances": 17}],
    }


def test_moves_that_free_whole_hosts():
    views = fleet()
    plan = plan_moves(views)
    assert plan == {
        "moves": [
            {
                "holder_id": str(node(3)),
                "tenant_id": str(T1),
                "gpus": 2,
                "from_host": "h2",
                "to_host": "h1",
                "to_gpu_indexes": [6, 7],
            }
        ],
        "hosts_freed": ["h2"],
        "gpus_moved": 2,
    }
    assert views[1].free == 6  # a plan: the views it was given are unchanged


def test_nvlink_islands_limit_the_shapes():
    # H100 NVL host, GPU pairs; 0, 2, 4 held: free 1, 3, 5 (alone in their pairs) and 6-7
    pairs = [[0, 1], [2, 3], [4, 5], [6, 7]]
    nvl = host("nvl", islands=pairs, held={0: node(1), 2: node(2), 4: node(3)})
    [group] = summarise([nvl], {})
    assert group["shapes"] == [
        {"gpus": 8, "nodes": 0, "stranded_gpus": 5},
        {"gpus": 4, "nodes": 0, "stranded_gpus": 5},
        {"gpus": 2, "nodes": 1, "stranded_gpus": 3},
        {"gpus": 1, "nodes": 5, "stranded_gpus": 0},
    ]


@pytest.mark.django_db
def test_the_operator_endpoint(operator, make_host, catalog):
    make_host("h100-sxm5-80gb", gpus=8, hostname="gpu-01")
    body = operator.get("/api/v1/fleet/fragmentation", {"gpu_model": "h100-sxm5-80gb"}).json()
    [group] = body["groups"]
    assert (group["free_gpus"], group["whole_hosts_free"]) == (8, 1)
    assert group["shapes"][0] == {"gpus": 8, "nodes": 1, "stranded_gpus": 0}
    # every H100 MIG profile of the catalog, with 8 free GPUs each holding max_instances
    from catalog.models import MigProfile

    expected = [
        {"profile": p.name, "instances": 8 * p.max_instances}
        for p in sorted(
            MigProfile.objects.filter(gpu_model_id="h100-sxm5-80gb"),
            key=lambda p: (p.compute_slices, p.name),
        )
    ]
    assert group["mig"] == expected and any(m["profile"] == "1g.10gb" for m in expected)
    assert body["moves"] == [] and body["hosts_freed"] == []
