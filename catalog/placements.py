"""MIG placements as ``nvidia-smi mig -lgipp`` prints them, and the fallback class table.

``{0,2,4}:2`` means: an instance may start at memory slice 0, 2 or 4 and takes 2 slices
(NVIDIA MIG user guide, "getting started": ``-lgipp`` output). The shared catalog writes
``"unverified {…}:n"`` for placements not seen in a capture of that SKU and ``"unknown (…)"``
or nothing when none is known; then ``placement_classes`` (observed on A100-40GB, H100-80GB
and H100 NVL; ``a30_layout`` for the A30's 4-slice layout) gives them by
(compute slices, memory slices, ``+me``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .datafiles import CatalogDataError, is_unknown, optional_int

_PLACEMENTS_RE = re.compile(
    r"^(?P<unverified>unverified\s+)?\{(?P<starts>\s*\d+(?:\s*,\s*\d+)*\s*)\}\s*:\s*(?P<size>\d+)$"
)
_CLASS_COMPUTE_RE = re.compile(r"^(\d+)g\b")

#: (compute slices, memory slices, +me) of a profile class
ClassKey = tuple[int, int, bool]


@dataclass(frozen=True)
class Placements:
    """``-lgipp`` placements: valid start memory slices and the slices one instance takes."""

    starts: tuple[int, ...]
    size: int
    verified: bool = True


@dataclass(frozen=True)
class PlacementClass:
    """One row of the YAML ``placement_classes`` table (the fallback for unknown placements)."""

    label: str
    placements: Placements
    max_instances: int | None
    source: Any


def parse_placements(text: Any, where: str = "placements") -> Placements | None:
    """``"{0,2,4}:2"`` -> starts (0, 2, 4), size 2, verified; ``"unverified {…}:n"`` -> unverified.

    Missing values and ``"unknown (…)"`` give None (the caller falls back to the class table).
    """
    if is_unknown(text):
        return None
    if not isinstance(text, str):
        raise CatalogDataError(where, f"placements must be a string, got {text!r}")
    match = _PLACEMENTS_RE.match(text.strip())
    if match is None:
        raise CatalogDataError(where, f"cannot parse placements {text!r}")
    starts = tuple(int(s) for s in match.group("starts").split(","))
    if list(starts) != sorted(set(starts)):
        raise CatalogDataError(where, f"placement starts must be increasing: {text!r}")
    return Placements(starts, int(match.group("size")), verified=not match.group("unverified"))


def placement_classes(doc: Mapping[str, Any]) -> dict[int, dict[ClassKey, PlacementClass]]:
    """The fallback table, keyed by memory slices per GPU (8, or 4 for the A30 layout).

    A class's compute slices come from its label (``"2g"``), its memory slices from the size
    in its ``-lgipp`` text, ``+me`` from the label.
    """
    table = doc.get("placement_classes") or {}
    observed_on = [entry.get("source") for entry in table.get("observed_on", [])]
    eight: dict[ClassKey, PlacementClass] = {}
    four: dict[ClassKey, PlacementClass] = {}
    for label, value in table.items():
        if label in ("observed_on", "note", "a30_layout"):
            continue
        where = f"placement_classes[{label!r}]"
        klass = _placement_class(label, value.get("lgipp"), value.get("max_instances"), where)
        eight[_class_key(klass)] = replace(klass, source=observed_on)
    a30 = table.get("a30_layout") or {}
    for label, lgipp in a30.items():
        if label == "source":
            continue
        klass = _placement_class(label, lgipp, None, f"placement_classes.a30_layout[{label!r}]")
        four[_class_key(klass)] = replace(klass, source=a30.get("source"))
    return {8: eight, 4: four} if four else {8: eight}


def _placement_class(label: str, lgipp: Any, max_instances: Any, where: str) -> PlacementClass:
    placements = parse_placements(lgipp, where)
    match = _CLASS_COMPUTE_RE.match(label)
    if placements is None or match is None:
        raise CatalogDataError(where, "a class needs an '<n>g' label and -lgipp placements")
    return PlacementClass(label, placements, optional_int(max_instances, where), None)


def _class_key(klass: PlacementClass) -> ClassKey:
    compute = int(_CLASS_COMPUTE_RE.match(klass.label).group(1))  # type: ignore[union-attr]
    return (compute, klass.placements.size, "+me" in klass.label)


def fallback_placements(
    classes: Mapping[ClassKey, PlacementClass], compute: int, memory: int, media: bool
) -> PlacementClass | None:
    """The class for (compute, memory, +me); a ``+me`` profile without its own class uses
    the plain class of the same slices (A30 2g.12gb+me: the mock lists ``{0,2}:2``, as 2g)."""
    klass = classes.get((compute, memory, media))
    if klass is None and media:
        klass = classes.get((compute, memory, False))
    return klass


def notation(placements: Placements) -> str:
    """Back to the ``-lgipp`` text: ``{0,2,4}:2``."""
    return "{" + ",".join(map(str, placements.starts)) + "}:" + str(placements.size)


def check_placements(placements: Placements, memory: int, per_gpu: int, where: str) -> None:
    """An instance takes as many memory slices as its profile has and stays on the GPU."""
    if placements.size != memory:
        raise CatalogDataError(
            where, f"placement size {placements.size} differs from memory slices {memory}"
        )
    if placements.starts[-1] + placements.size > per_gpu:
        raise CatalogDataError(where, f"placements {notation(placements)} exceed {per_gpu} slices")
