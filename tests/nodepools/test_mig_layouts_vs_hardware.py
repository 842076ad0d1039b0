"""Every MIG layout a tenant can ask for, checked through the node pool API's validation
against what the hardware printed: real ``nvidia-smi mig -lgip`` / ``-lgipp`` output
(tests/catalog/captures, copied verbatim from the project's shared data; each file names its
source on its first line).

The reference here is written from the captures alone, without the layout engine: a layout
fits a GPU when every profile's count is within the ``-lgip`` "Total" column, at most one
``+me`` instance is asked for (MIG user guide; the +me "Total" is 1), the compute slices
(``<n>g``) add up to at most the GPU's, and the instances can be given pairwise disjoint
``-lgipp`` placements (found by a memoised search over occupied-slice bitmasks). Every
multiset of profiles up to the GPU's instance limit is tried: the validation must accept
exactly the layouts the reference accepts — no accepted layout the hardware would refuse, no
refused layout it would accept.
"""

from __future__ import annotations

import itertools
import re
from functools import cache
from pathlib import Path

import pytest

from nvke.errors import InvalidInput

CAPTURES = Path(__file__).resolve().parent.parent / "catalog" / "captures"
_LGIP = re.compile(r"^\|\s+\d+\s+MIG\s+(\S+)\s+(\d+)\s+\d+/(\d+)\s")
_LGIPP = re.compile(r"Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,]+)\}:(\d+)")

#: The A100-40GB capture has only ``-lgipp`` (profile IDs). Names and totals by ID from the MIG
#: user guide's A100-40GB profile table (the capture's own text names 9 = 3g.20gb and
#: 19 = 1g.5gb; the guide's "-cgi 9,19,14,19" example creates 3g.20gb, 1g.5gb, 2g.10gb).
A100_40GB_IDS = {
    19: ("1g.5gb", 7),
    20: ("1g.5gb+me", 1),
    15: ("1g.10gb", 4),
    14: ("2g.10gb", 3),
    9: ("3g.20gb", 2),
    5: ("4g.20gb", 1),
    0: ("7g.40gb", 1),
}


def read_capture(name: str, ids: dict[int, tuple[str, int]] | None = None):
    """``{profile: (total, starts, size)}`` from a capture."""
    text = (CAPTURES / name).read_text(encoding="utf-8")
    by_id = dict(ids or {})
    for line in text.splitlines():
        match = _LGIP.match(line)
        if match:
            by_id[int(match.group(2))] = (match.group(1), int(match.group(3)))
    table = {}
    for match in _LGIPP.finditer(text):
        name_, total = by_id[int(match.group(1))]
        starts = tuple(int(s) for s in match.group(2).split(","))
        table[name_] = (total, starts, int(match.group(3)))
    return table


def hardware_accepts(layout: dict[str, int], table, compute: int, memory: int) -> bool:
    if any(count > table[name][0] for name, count in layout.items()):
        return False
    if sum(count for name, count in layout.items() if name.endswith("+me")) > 1:
        return False
    if sum(int(name.split("g.")[0]) * count for name, count in layout.items()) > compute:
        return False
    instances = tuple(sorted(name for name, count in layout.items() for _ in range(count)))

    @cache
    def place(index: int, mask: int) -> bool:
        if index == len(instances):
            return True
        _, starts, size = table[instances[index]]
        for start in starts:
            bits = ((1 << size) - 1) << start
            if start + size <= memory and not mask & bits and place(index + 1, mask | bits):
                return True
        return False

    return place(0, 0)


def all_layouts(table, max_instances: int):
    names = sorted(table)
    ranges = [range(0, table[n][0] + 1) for n in names]
    for counts in itertools.product(*ranges):
        if 0 < sum(counts) <= max_instances:
            yield {n: c for n, c in zip(names, counts, strict=True) if c}


CASES = [
    ("h100-nvl-94gb", "h100-nvl-94gb-lgip-lgipp.txt", None, 7, 8),
    ("a30", "a30-lgip-lgipp.txt", None, 4, 4),
    ("a100-sxm4-40gb", "a100-sxm4-40gb-lgipp.txt", A100_40GB_IDS, 7, 8),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("slug", "capture", "ids", "compute", "memory"), CASES)
def test_validation_accepts_exactly_what_the_captured_hardware_accepts(
    catalog, slug, capture, ids, compute, memory
):
    from catalog.models import GpuModel
    from nodepools.isolation import isolation_plan, validate_isolation

    table = read_capture(capture, ids)
    model = GpuModel.objects.get(slug=slug)
    # the catalog knows the same profiles as the hardware printed
    assert set(table) <= set(model.mig_profiles.values_list("name", flat=True))
    accepted = refused = 0
    disagreements = []
    for layout in all_layouts(table, max_instances=compute):
        expected = hardware_accepts(layout, table, compute, memory)
        try:
            policy = validate_isolation(model, {"mode": "mig", "mig_layout": layout})
        except InvalidInput as exc:
            assert exc.code == "mig_layout_does_not_fit", (layout, exc.code)
            got = False
        else:
            got = True
            assert policy["mig_layout"] == {k: layout[k] for k in policy["mig_layout"]}
            # the per-GPU placement it returns is one the hardware offers
            placements = isolation_plan(model, policy).mig_placements
            used = 0
            for p in placements:
                _, starts, size = table[p.profile]
                bits = ((1 << size) - 1) << p.start
                assert p.start in starts and p.size == size and not used & bits, layout
                used |= bits
        if got != expected:
            disagreements.append((layout, expected, got))
        accepted += got
        refused += not got
    assert disagreements == []
    assert accepted > 0 and refused > 0
    if slug == "a30":  # 4 compute / 4 memory slices, worked out by hand:
        # 1g x0..4 alone (4), +me with 0..3 1g (4), 2g alone x1/x2 (2), 2g + 1g x1/x2 (2),
        # 2g + 1g+me (+ 1g) (2), 4g alone (1) = 15 layouts fit
        assert accepted == 15


@pytest.mark.django_db
def test_the_issues_two_h100_nvl_examples(catalog):
    from catalog.models import GpuModel
    from nodepools.isolation import isolation_plan, validate_isolation

    table = read_capture("h100-nvl-94gb-lgip-lgipp.txt")
    nvl = GpuModel.objects.get(slug="h100-nvl-94gb")
    refused = {"4g.47gb": 1, "2g.24gb": 2}
    assert not hardware_accepts(refused, table, 7, 8)
    with pytest.raises(InvalidInput) as err:
        validate_isolation(nvl, {"mode": "mig", "mig_layout": refused})
    assert (err.value.code, err.value.field) == ("mig_layout_does_not_fit", "isolation.mig_layout")
    assert "no free start is left for 2g.24gb (its starts {0,2,4}:2)" in str(err.value.detail)
    fits = {"3g.47gb": 1, "1g.24gb": 1, "1g.12gb": 1}
    assert hardware_accepts(fits, table, 7, 8)
    plan = isolation_plan(nvl, validate_isolation(nvl, {"mode": "mig", "mig_layout": fits}))
    # the capture's own `-cgi 9,15,19` produced the same three GPU instances
    assert [(p.profile, p.start, p.size) for p in plan.mig_placements] == [
        ("3g.47gb", 0, 4),
        ("1g.24gb", 4, 2),
        ("1g.12gb", 6, 1),
    ]
