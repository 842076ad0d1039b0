"""The placement planner in memory (fleet/placement.py): no database, hand-made hosts.

Every expected host and GPU index below is worked out from the rules in the module docstring.
"""

from __future__ import annotations

import uuid

import pytest

from fleet.placement import (
    GpuRequest,
    GpuSlot,
    HostView,
    InsufficientCapacity,
    Planner,
    naive_first_fit,
)

T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)
PAIRS = [[0, 1], [2, 3], [4, 5], [6, 7]]  # H100 NVL: NVLink bridges join GPU pairs


def host(
    name: str,
    *,
    zone: str = "us-east-1a",
    model: str = "h100-sxm5-80gb",
    gpus: int = 8,
    islands: list[list[int]] | None = None,
    held: dict[int, uuid.UUID] | None = None,
    tenant: uuid.UUID = T1,
    shares: bool = False,
    unusable: set[int] = frozenset(),  # type: ignore[assignment]
) -> HostView:
    island_of = {i: n for n, group in enumerate(islands or [list(range(gpus))]) for i in group}
    held = held or {}
    return HostView(
        id=uuid.uuid5(uuid.NAMESPACE_DNS, name),
        hostname=name,
        zone=zone,
        region=zone[:-1],
        gpu_model=model,
        gpus=[
            GpuSlot(
                index=i,
                uuid=f"GPU-{name}-{i}",
                island=island_of[i],
                usable=i not in unusable,
                holder=held.get(i),
                tenant=tenant if i in held else None,
                shares=shares if i in held else False,
            )
            for i in range(gpus)
        ],
    )


def req(gpus: int, *, tenant: uuid.UUID = T1, n: int = 0, **kw) -> GpuRequest:
    kw.setdefault("gpu_model", "h100-sxm5-80gb")
    kw.setdefault("region", "us-east-1")
    return GpuRequest(holder_id=uuid.UUID(int=1000 + n), tenant_id=tenant, gpus=gpus, **kw)


NODE = uuid.UUID(int=500)


def test_best_fit_fills_the_partly_used_host_and_keeps_the_whole_one_free():
    # h-a: 8 free; h-b: 6 held by T1, 2 free. A 2-GPU node of T1 fits both: h-b leaves 0.
    planner = Planner([host("h-a"), host("h-b", held={i: NODE for i in range(6)})])
    placed = planner.place(req(2))
    assert (placed.hostname, placed.gpu_indexes) == ("h-b", (6, 7))
    assert planner.hosts[uuid.uuid5(uuid.NAMESPACE_DNS, "h-a")].free == 8


def test_a_full_host_node_only_lands_on_a_wholly_free_host():
    planner = Planner([host("h-a", held={0: NODE}), host("h-b")])
    placed = planner.place(req(8))
    assert (placed.hostname, placed.gpu_indexes) == ("h-b", tuple(range(8)))
    with pytest.raises(InsufficientCapacity):
        planner.place_all([req(8, n=1)])


def test_a_two_gpu_node_gets_an_nvlink_pair_not_the_lowest_free_indexes():
    # GPUs 0 and 2 held: free pairs left are 4-5 and 6-7 (1 and 3 are alone in their pair).
    planner = Planner([host("nvl", islands=PAIRS, held={0: NODE, 2: NODE})])
    placed = planner.place(req(2))
    assert placed.gpu_indexes == (4, 5)
    assert placed.nvlink_split is False


def test_the_tightest_island_is_used_so_whole_islands_stay_free():
    # islands of 4: [0..3] has 2 free (0,1 held), [4..7] all free. A 2-GPU node takes 2-3.
    planner = Planner([host("h", islands=[[0, 1, 2, 3], [4, 5, 6, 7]], held={0: NODE, 1: NODE})])
    assert planner.place(req(2)).gpu_indexes == (2, 3)


def test_a_host_with_an_nvlink_pair_is_preferred_over_a_tighter_split():
    # h-a has 3 free GPUs in three different pairs (1, 3, 5), h-b 4 free as two pairs.
    # Best fit by free count alone would pick h-a; NVLink comes first, so h-b.
    holders = {0: NODE, 2: NODE, 4: NODE, 6: NODE, 7: NODE}
    a = host("h-a", islands=PAIRS, held=holders)
    b = host("h-b", islands=PAIRS, held={0: NODE, 1: NODE, 2: NODE, 3: NODE})
    placed = Planner([a, b]).place(req(2))
    assert (placed.hostname, placed.gpu_indexes, placed.nvlink_split) == ("h-b", (4, 5), False)


def test_when_no_island_fits_the_node_is_split_and_says_so():
    holders = {0: NODE, 2: NODE, 4: NODE, 6: NODE}
    placed = Planner([host("nvl", islands=PAIRS, held=holders)]).place(req(2))
    assert (placed.gpu_indexes, placed.nvlink_split) == ((1, 3), True)


def test_a_host_held_by_another_tenant_is_not_used():
    planner = Planner([host("b-host", held={0: NODE}, tenant=T2)])
    assert planner.place(req(1, tenant=T1)) is None
    assert planner.place(req(1, tenant=T2)).hostname == "b-host"


def test_tenants_share_a_host_only_when_both_allow_hardware_isolated_sharing():
    shared = host("mig-host", held={0: NODE}, tenant=T2, shares=True)
    assert Planner([shared]).place(req(1, tenant=T1)) is None  # T1's pool does not share
    placed = Planner([shared]).place(req(1, tenant=T1, shares_host=True))
    assert (placed.hostname, placed.gpu_indexes) == ("mig-host", (1,))
    exclusive = host("excl", held={0: NODE}, tenant=T2, shares=False)
    assert Planner([exclusive]).place(req(1, tenant=T1, shares_host=True)) is None


def test_unhealthy_unscrubbed_or_missing_gpus_are_never_handed_out():
    planner = Planner([host("h", gpus=2, unusable={0})])
    assert planner.place(req(1)).gpu_indexes == (1,)
    assert planner.place(req(1, n=1)) is None


def test_zone_spreading_puts_each_node_of_a_group_in_the_least_used_zone():
    pool = uuid.UUID(int=77)
    hosts = [host(f"h-{z}-{i}", zone=f"us-east-1{z}") for z in "abc" for i in range(2)]
    planner = Planner(hosts)
    zones = [planner.place(req(8, n=i, group_id=pool, spread_zones=True)).zone for i in range(6)]
    assert zones == ["us-east-1a", "us-east-1b", "us-east-1c"] * 2
    # without spreading, best fit / hostname order packs one zone first
    planner = Planner([host(f"h-{z}-{i}", zone=f"us-east-1{z}") for z in "abc" for i in range(2)])
    zones = [planner.place(req(8, n=i, group_id=pool)).zone for i in range(2)]
    assert zones == ["us-east-1a", "us-east-1a"]


def test_a_pinned_zone_and_the_region_are_respected():
    planner = Planner([host("h-east", zone="us-east-1a"), host("h-west", zone="us-west-2a")])
    assert planner.place(req(1, region="us-west-2")).hostname == "h-west"
    assert planner.place(req(1, n=1, zone="us-east-1a")).hostname == "h-east"
    assert planner.place(req(1, n=2, zone="eu-west-1a")) is None


def test_a_batch_is_all_or_nothing_and_leaves_the_views_as_they_were():
    planner = Planner([host("h", gpus=8)])
    with pytest.raises(InsufficientCapacity) as exc:
        planner.place_all([req(4, n=1), req(4, n=2), req(4, n=3)])
    assert (exc.value.placed, exc.value.total) == (2, 3)
    view = next(iter(planner.hosts.values()))
    assert view.free == 8 and all(g.holder is None for g in view.gpus)
    assert planner.holders == {}


def test_placing_the_same_holder_twice_returns_the_first_placement():
    planner = Planner([host("h")])
    first = planner.place(req(2))
    assert planner.place(req(2)) is first
    assert planner.hosts[first.host_id].free == 6


def test_naive_first_fit_takes_the_first_host_and_the_lowest_indexes():
    a = host("h-a", islands=PAIRS, held={0: NODE})
    b = host("h-b", islands=PAIRS)
    placed = naive_first_fit([a, b], req(2))
    # first fit ignores NVLink: GPUs 1 and 2 sit in two different pairs
    assert (placed.hostname, placed.gpu_indexes, placed.nvlink_split) == ("h-a", (1, 2), True)
