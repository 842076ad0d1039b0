"""Fixtures for the catalog tests.

``loaded`` loads the vendored catalog into the test database. ``tables`` builds the MIG layout
engine's tables straight from the normalised data files (no database). ``capture_table`` parses
a real ``nvidia-smi mig -lgip`` / ``-lgipp`` capture (copied verbatim into ``captures/`` from
the project's shared data; the first line of each file names its source) into a table, so the
engine can be checked against what the hardware printed, independently of the YAML.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from catalog.loader import gpu_model_rows, load_catalog
from catalog.mig import MigTable, ProfileSpec

CAPTURES = Path(__file__).resolve().parent / "captures"

_LGIP_ROW = re.compile(r"^\|\s+\d+\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s")
_LGIPP_ROW = re.compile(r"Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,]+)\}:(\d+)")


@pytest.fixture
def loaded(db):
    """The vendored catalog in the test database; returns the LoadResult."""
    return load_catalog()


@pytest.fixture(scope="session")
def tables() -> dict[str, MigTable]:
    """slug -> MigTable for every MIG-capable model, built from the data files only."""
    return {
        row.slug: MigTable.build(
            row.slug,
            compute_slices=row.mig_compute_slices,
            memory_slices=row.mig_memory_slices,
            profiles=row.profiles,
            max_instances=row.max_mig_instances,
        )
        for row in gpu_model_rows()
        if row.mig_capable
    }


def parse_capture(path: Path, *, compute_slices: int, memory_slices: int) -> MigTable:
    """A MigTable from a capture with both ``-lgip`` (names, IDs, instance counts) and
    ``-lgipp`` (placements by profile ID). Compute slices come from the ``<n>g`` of a name."""
    text = path.read_text(encoding="utf-8")
    names = {}
    for line in text.splitlines():
        match = _LGIP_ROW.match(line)
        if match:
            names[int(match.group(2))] = (match.group(1), int(match.group(4)))
    specs = []
    for match in _LGIPP_ROW.finditer(text):
        name, total = names[int(match.group(1))]
        starts = tuple(int(s) for s in match.group(2).split(","))
        size = int(match.group(3))
        compute = int(name.split("g.")[0])
        specs.append(ProfileSpec(name, compute, size, total, starts, size))
    return MigTable(path.stem, compute_slices, memory_slices, tuple(specs), max_instances=None)


@pytest.fixture(scope="session")
def capture_table():
    """``capture_table(filename, compute_slices=7, memory_slices=8)`` -> MigTable."""

    def build(filename: str, compute_slices: int = 7, memory_slices: int = 8) -> MigTable:
        return parse_capture(
            CAPTURES / filename, compute_slices=compute_slices, memory_slices=memory_slices
        )

    return build
