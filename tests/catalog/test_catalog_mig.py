"""The MIG layout engine (catalog.mig): hand-checked layouts from real captures, and
property tests (hypothesis) that every returned layout is valid by the table and that an
exhaustive search agrees on whether a layout exists.

No database: tables come from the data files (``tables``) or straight from a capture
(``capture_table``).
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.mig import (
    LayoutDoesNotFit,
    MigTable,
    Placement,
    ProfileSpec,
    max_instances_single,
    place_layout,
)

NVL = "h100-nvl-94gb-lgip-lgipp.txt"


# ---------------------------------------------------------------- an independent checker


def assert_valid(placements: list[Placement], layout: dict[str, int], table: MigTable) -> None:
    """Every rule of the MIG user guide, checked directly on the placements."""
    specs = {p.name: p for p in table.profiles}
    canonical = Counter()
    for name, count in layout.items():
        canonical[table.profile(name).name] += count
    assert Counter(p.profile for p in placements) == +canonical
    used: set[int] = set()
    for placement in placements:
        spec = specs[placement.profile]
        assert placement.start in spec.starts
        assert placement.size == spec.size == spec.memory_slices
        slices = set(range(placement.start, placement.start + placement.size))
        assert not slices & used, f"overlap at {placement}"
        assert max(slices) < table.memory_slices
        used |= slices
    assert sum(specs[p.profile].compute_slices for p in placements) <= table.compute_slices
    assert sum(1 for p in placements if p.profile.endswith("+me")) <= 1
    for name, count in Counter(p.profile for p in placements).items():
        assert count <= specs[name].max_instances
    if table.max_instances is not None:
        assert len(placements) <= table.max_instances


def exhaustive_fits(layout: dict[str, int], table: MigTable) -> bool:
    """Try every combination of starts (small layouts only)."""
    instances = [table.profile(n) for n, count in layout.items() for _ in range(count)]
    counts = Counter(s.name for s in instances)
    if any(counts[s.name] > s.max_instances for s in instances):
        return False
    if sum(1 for s in instances if s.media_extensions) > 1:
        return False
    if sum(s.compute_slices for s in instances) > table.compute_slices:
        return False
    if table.max_instances is not None and len(instances) > table.max_instances:
        return False
    for starts in itertools.product(*(s.starts for s in instances)):
        used: set[int] = set()
        for spec, start in zip(instances, starts, strict=True):
            slices = set(range(start, start + spec.size))
            if slices & used or start + spec.size > table.memory_slices:
                break
            used |= slices
        else:
            return True
    return False


def fits(layout: dict[str, int], table: MigTable) -> bool:
    try:
        placements = place_layout(layout, table)
    except LayoutDoesNotFit:
        return False
    assert_valid(placements, layout, table)
    return True


# ---------------------------------------------------------------- real captures, by hand


def test_the_capture_agrees_with_the_catalog_table(capture_table, tables):
    captured = capture_table(NVL)
    catalog = tables["h100-nvl-94gb"]
    assert {(p.name, p.starts, p.size, p.max_instances) for p in captured.profiles} == {
        (p.name, p.starts, p.size, p.max_instances) for p in catalog.profiles
    }
    assert captured.profile("2g.24gb").starts == (0, 2, 4)
    assert captured.profile("3g.47gb").starts == (0, 4)


def test_h100_nvl_4g_plus_two_2g_does_not_fit(capture_table):
    # 4g.47gb {0}:4 + 2g.24gb {0,2,4}:2 x2: 8 compute slices of 7, and only one 2g start (4)
    # is left beside the 4g.
    table = capture_table(NVL)
    with pytest.raises(LayoutDoesNotFit) as err:
        place_layout({"4g.47gb": 1, "2g.24gb": 2}, table)
    assert err.value.code == "compute_slices"
    assert "needs 8 compute slices" in err.value.reason
    # ... and the placement table refuses it too: after the 4g only start 4 is left for a 2g
    assert (
        "with 4g.47gb at start 0 (slices 0-3), 2g.24gb at start 4 (slices 4-5), "
        "no free start is left for 2g.24gb (its starts {0,2,4}:2)"
    ) in err.value.reason


def test_h100_nvl_3g_plus_1g24_plus_1g12_fits(capture_table):
    # the capture's own `nvidia-smi mig -cgi 9,15,19` created exactly these three (GI 1, 5, 13)
    table = capture_table(NVL)
    placements = place_layout({"3g.47gb": 1, "1g.24gb": 1, "1g.12gb": 1}, table)
    assert placements == [
        Placement("3g.47gb", 0, 4),
        Placement("1g.24gb", 4, 2),
        Placement("1g.12gb", 6, 1),
    ]


def test_h100_nvl_mig_parted_all_balanced_fits(tables):
    # mig-parted all-balanced for H100 NVL: 1g.12gb x2 + 2g.24gb x1 + 3g.47gb x1 (7 compute,
    # 8 memory slices): the 3g must move to start 4 so that two 1g fit at 2 and 3.
    placements = place_layout({"1g.12gb": 2, "2g.24gb": 1, "3g.47gb": 1}, tables["h100-nvl-94gb"])
    assert placements == [
        Placement("3g.47gb", 4, 4),
        Placement("2g.24gb", 0, 2),
        Placement("1g.12gb", 2, 1),
        Placement("1g.12gb", 3, 1),
    ]


def test_nvidia_guides_own_a100_layout_is_valid_by_our_rules(tables):
    # MIG user guide: `-cgi 9,19,14,19` then `-lgi` shows 1g.5gb 0:1, 1g.5gb 1:1,
    # 2g.10gb 2:2, 3g.20gb 4:4 on an A100-40GB.
    table = tables["a100-sxm4-40gb"]
    observed = [
        Placement("1g.5gb", 0, 1),
        Placement("1g.5gb", 1, 1),
        Placement("2g.10gb", 2, 2),
        Placement("3g.20gb", 4, 4),
    ]
    layout = {"3g.20gb": 1, "1g.5gb": 2, "2g.10gb": 1}
    assert_valid(observed, layout, table)
    assert fits(layout, table)


@pytest.mark.parametrize(
    ("slug", "profile", "expected"),
    [
        ("h100-sxm5-80gb", "1g.10gb", 7),
        ("h100-sxm5-80gb", "1g.10gb+me", 1),
        ("a100-sxm4-80gb", "1g.20gb", 4),
        ("a100-sxm4-80gb", "2g.20gb", 3),
        ("a100-sxm4-80gb", "3g.40gb", 2),
        ("a100-sxm4-80gb", "3g.39gb", 2),  # alias
        ("a100-sxm4-80gb", "4g.40gb", 1),
        ("a100-sxm4-80gb", "7g.80gb", 1),
        ("a30", "1g.6gb", 4),
        ("a30", "2g.12gb", 2),
        ("h200-sxm-141gb", "1g.35gb", 4),
    ],
)
def test_max_instances_with_the_single_strategy(tables, slug, profile, expected):
    assert max_instances_single(profile, tables[slug]) == expected


def test_only_one_media_extensions_instance_per_gpu(tables):
    a30 = tables["a30"]
    with pytest.raises(LayoutDoesNotFit) as err:
        place_layout({"1g.6gb+me": 1, "2g.12gb+me": 1}, a30)
    assert err.value.code == "media_extensions"
    assert fits({"1g.6gb+me": 1, "1g.6gb": 1, "2g.12gb": 1}, a30)


def test_per_profile_instance_limits(tables):
    with pytest.raises(LayoutDoesNotFit) as err:
        place_layout({"3g.40gb": 3}, tables["h100-sxm5-80gb"])
    assert err.value.code == "max_instances"
    assert "at most 2" in err.value.reason


def test_unknown_profiles_and_bad_counts_are_rejected(tables):
    with pytest.raises(LayoutDoesNotFit) as err:
        place_layout({"1g.18gb": 1}, tables["a100-sxm4-80gb"])
    assert err.value.code == "unknown_profile"
    assert "1g.10gb" in err.value.reason
    with pytest.raises(LayoutDoesNotFit) as err:
        place_layout({"1g.10gb": -1}, tables["a100-sxm4-80gb"])
    assert err.value.code == "invalid_count"


def test_memory_slices_decide_where_the_totals_allow_it(tables):
    # 4g.40gb {0}:4 holds slices 0-3, so two 1g.20gb ({0,2,4,6}:2) take starts 4 and 6.
    h100 = tables["h100-sxm5-80gb"]
    assert place_layout({"4g.40gb": 1, "1g.20gb": 2}, h100) == [
        Placement("4g.40gb", 0, 4),
        Placement("1g.20gb", 4, 2),
        Placement("1g.20gb", 6, 2),
    ]
    # 3g.40gb {0,4}:4 + 2g.20gb {0,2,4}:2 x2: with the 3g at 0 only start 4 is left for the
    # 2g; backtracking moves the 3g to 4 and puts the 2g at 0 and 2.
    assert place_layout({"3g.40gb": 1, "2g.20gb": 2}, h100) == [
        Placement("3g.40gb", 4, 4),
        Placement("2g.20gb", 0, 2),
        Placement("2g.20gb", 2, 2),
    ]
    with pytest.raises(LayoutDoesNotFit) as err:
        place_layout({"3g.40gb": 2, "1g.10gb": 1}, h100)  # 9 memory slices of 8
    assert err.value.code == "memory_slices"


def test_no_placement_even_though_every_total_fits():
    # a hand-made table: "a" may only start at 1 and then blocks both starts of "b"
    table = MigTable(
        "test-gpu",
        compute_slices=4,
        memory_slices=4,
        profiles=(
            ProfileSpec("1g.1gb", 1, 2, 1, (1,), 2),
            ProfileSpec("2g.2gb", 2, 2, 2, (0, 2), 2),
        ),
    )
    assert fits({"2g.2gb": 2}, table)
    with pytest.raises(LayoutDoesNotFit) as err:
        place_layout({"1g.1gb": 1, "2g.2gb": 1}, table)
    assert err.value.code == "placement"
    assert "without overlapping memory slices" in err.value.reason
    assert not exhaustive_fits({"1g.1gb": 1, "2g.2gb": 1}, table)


def test_existing_instances_keep_their_slices(tables):
    h100 = tables["h100-sxm5-80gb"]
    existing = [Placement("3g.40gb", 4, 4)]
    assert place_layout({"2g.20gb": 2}, h100, existing=existing) == [
        Placement("2g.20gb", 0, 2),
        Placement("2g.20gb", 2, 2),
    ]
    # 4g + 3g on one GPU (allowed since R510, MIG user guide "concepts")
    assert place_layout({"4g.40gb": 1}, h100, existing=existing) == [Placement("4g.40gb", 0, 4)]
    with pytest.raises(LayoutDoesNotFit) as err:
        place_layout({"1g.20gb": 3}, h100, existing=existing)  # 4 + 6 memory slices of 8
    assert err.value.code == "memory_slices"
    with pytest.raises(LayoutDoesNotFit) as err:
        place_layout({"3g.40gb": 2}, h100, existing=existing)
    assert err.value.code == "max_instances"


# ---------------------------------------------------------------- property tests


MIG_SLUGS = ["a100-sxm4-40gb", "a100-sxm4-80gb", "a30", "h100-nvl-94gb", "h200-sxm-141gb", "b200"]


@st.composite
def catalog_layouts(draw, tables, max_total=None):
    table = tables[draw(st.sampled_from(MIG_SLUGS))]
    chosen = draw(st.lists(st.sampled_from(table.profiles), min_size=1, max_size=3, unique=True))
    layout = {spec.name: draw(st.integers(1, min(spec.max_instances, 3))) for spec in chosen}
    if max_total is not None:
        while sum(layout.values()) > max_total:
            name = sorted(layout)[0]
            layout[name] -= 1
            if not layout[name]:
                del layout[name]
    return table, layout


@st.composite
def synthetic_tables(draw):
    """Random but well-formed tables: starts inside the memory axis, size = memory slices."""
    memory_slices = draw(st.integers(3, 8))
    compute_slices = draw(st.integers(4, 8))
    specs = []
    for index in range(draw(st.integers(1, 4))):
        size = draw(st.integers(1, min(4, memory_slices)))
        possible = list(range(0, memory_slices - size + 1))
        starts = tuple(sorted(draw(st.sets(st.sampled_from(possible), min_size=1))))
        name = f"{draw(st.integers(1, 2))}g.{index}gb"
        if index == 0 and draw(st.booleans()):
            name += "+me"
        compute = int(name.split("g.")[0])
        specs.append(ProfileSpec(name, compute, size, draw(st.integers(1, 4)), starts, size))
    max_instances = draw(st.one_of(st.none(), st.integers(1, 7)))
    table = MigTable("synthetic", compute_slices, memory_slices, tuple(specs), max_instances)
    layout = {spec.name: draw(st.integers(0, 2)) for spec in specs}
    while sum(layout.values()) > 4:  # keep the exhaustive search small
        layout[max(layout, key=layout.get)] -= 1
    return table, {name: count for name, count in layout.items() if count}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data())
def test_every_layout_returned_is_valid_by_the_table(data, tables):
    table, layout = data.draw(catalog_layouts(tables))
    try:
        placements = place_layout(layout, table)
    except LayoutDoesNotFit as err:
        assert err.code in {
            "max_instances",
            "media_extensions",
            "compute_slices",
            "memory_slices",
            "instances",
            "placement",
        }
        return
    assert_valid(placements, layout, table)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data())
def test_exhaustive_search_agrees_on_catalog_tables(data, tables):
    table, layout = data.draw(catalog_layouts(tables, max_total=4))
    assert fits(layout, table) == exhaustive_fits(layout, table)


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(case=synthetic_tables())
def test_exhaustive_search_agrees_on_synthetic_tables(case):
    table, layout = case
    assert fits(layout, table) == exhaustive_fits(layout, table)


# ---------------------------------------------------------------- from the database


@pytest.mark.django_db
def test_tables_built_from_database_rows_match_the_data_files(loaded, tables):
    from catalog.models import GpuModel

    for slug in ("h100-nvl-94gb", "a30", "a100-sxm4-80gb"):
        table = MigTable.from_gpu_model(GpuModel.objects.get(slug=slug))
        assert sorted(table.profiles, key=lambda p: p.name) == sorted(
            tables[slug].profiles, key=lambda p: p.name
        )
        assert (table.compute_slices, table.memory_slices, table.max_instances) == (
            tables[slug].compute_slices,
            tables[slug].memory_slices,
            tables[slug].max_instances,
        )
    with pytest.raises(ValueError, match="t4 does not support MIG"):
        MigTable.from_gpu_model(GpuModel.objects.get(slug="t4"))
