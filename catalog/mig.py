"""MIG layout engine: does a set of GPU instances fit one GPU, and at which placements?

Plain Python on a small view of a GPU model's MIG profiles (:class:`MigTable`); build one from
the database with :meth:`MigTable.from_gpu_model` or from any objects carrying the
``MigProfile`` attribute names with :meth:`MigTable.build`.

Rules (NVIDIA MIG user guide, "concepts" / "supported MIG profiles"; shared catalog
``planning_rules``):

* an instance of a profile occupies ``size`` consecutive memory slices starting at one of the
  profile's ``-lgipp`` starts (``{0,2,4}:2`` = start 0, 2 or 4, two slices); instances may not
  overlap;
* the compute slices of all instances add up to at most the GPU's (7; 4 on A30);
* at most ``max_instances`` instances of each profile, and of all profiles together the GPU's
  ``max_mig_instances``;
* only one ``+me`` (media extensions) instance per GPU.

Not modelled: creation order (the guide's A100 example fails ``-cgi 19,19,14,9`` but succeeds
with ``-cgi 9,19,14,19``: create the returned placements largest first, as they are ordered) and
the pre-R510 ban on 4g + 3g together.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class LayoutDoesNotFit(ValueError):
    """The requested instances cannot share one GPU.

    ``code`` is stable for programs: ``unknown_profile``, ``invalid_count``,
    ``max_instances``, ``media_extensions``, ``compute_slices``, ``memory_slices``,
    ``instances``, ``existing_overlap``, ``placement``; ``reason`` says why in words.
    """

    def __init__(self, reason: str, *, code: str = "placement") -> None:
        self.reason = reason
        self.code = code
        super().__init__(reason)


@dataclass(frozen=True)
class ProfileSpec:
    """One MIG profile of one GPU model, as the engine needs it."""

    name: str
    compute_slices: int
    memory_slices: int
    max_instances: int
    starts: tuple[int, ...]
    size: int
    aliases: tuple[str, ...] = ()

    @property
    def media_extensions(self) -> bool:
        """A ``+me`` profile (at most one such instance per GPU)."""
        return self.name.endswith("+me")


@dataclass(frozen=True, order=True)
class Placement:
    """One GPU instance: ``profile`` at memory slices ``start`` .. ``start + size - 1``."""

    profile: str
    start: int
    size: int

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)


@dataclass(frozen=True)
class MigTable:
    """The MIG facts of one GPU model: slices per GPU and its profiles."""

    gpu: str
    compute_slices: int
    memory_slices: int
    profiles: tuple[ProfileSpec, ...]
    max_instances: int | None = None

    @classmethod
    def build(
        cls,
        gpu: str,
        *,
        compute_slices: int,
        memory_slices: int,
        profiles: Iterable[Any],
        max_instances: int | None = None,
    ) -> MigTable:
        """From objects with ``MigProfile`` attribute names (model rows or loader rows).

        A profile without placements (``placement_size`` None) cannot be placed and is left out.
        """
        specs = tuple(
            ProfileSpec(
                name=p.name,
                compute_slices=p.compute_slices,
                memory_slices=p.memory_slices,
                max_instances=p.max_instances,
                starts=tuple(p.placement_starts),
                size=p.placement_size,
                aliases=tuple(getattr(p, "aliases", ()) or ()),
            )
            for p in profiles
            if p.placement_size is not None and p.placement_starts
        )
        return cls(gpu, compute_slices, memory_slices, specs, max_instances)

    @classmethod
    def from_gpu_model(cls, gpu_model: Any) -> MigTable:
        """From a ``catalog.models.GpuModel`` (one query for its profiles).

        Raises ValueError for a model without MIG.
        """
        if not gpu_model.mig_capable or not gpu_model.mig_compute_slices:
            raise ValueError(f"{gpu_model.slug} does not support MIG")
        return cls.build(
            gpu_model.slug,
            compute_slices=gpu_model.mig_compute_slices,
            memory_slices=gpu_model.mig_memory_slices,
            profiles=gpu_model.mig_profiles.all(),
            max_instances=gpu_model.max_mig_instances,
        )

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.profiles]

    def profile(self, name: str) -> ProfileSpec | None:
        """The profile called ``name`` or known under the alias ``name``."""
        for spec in self.profiles:
            if spec.name == name:
                return spec
        return next((spec for spec in self.profiles if name in spec.aliases), None)


def place_layout(
    profiles: Mapping[str, int], table: MigTable, *, existing: Iterable[Placement] = ()
) -> list[Placement]:
    """Placements for ``{profile name (or alias): count}`` on one GPU of ``table``.

    ``existing`` are instances already on the GPU; they count against every rule and keep
    their slices. Returns the new placements (canonical profile names), largest first, in the
    order they should be created. Deterministic: instances are placed largest first (memory
    slices, then compute slices, then name), each at the lowest free valid start (depth-first
    backtracking). Raises :class:`LayoutDoesNotFit`.
    """
    existing = list(existing)
    wanted = _resolve(profiles, table)
    old = [_spec(p.profile, table) for p in existing]
    have = Counter(old)
    for spec, count in wanted.items():
        _check_counts(spec, count + have[spec], table)
    everything = [*old, *(spec for spec, count in wanted.items() for _ in range(count))]
    occupied = _occupancy(existing, table)
    instances = sorted(
        (spec for spec, count in wanted.items() for _ in range(count)),
        key=lambda s: (-s.memory_slices, -s.compute_slices, s.name),
    )
    try:
        _check_totals(everything, table)
    except LayoutDoesNotFit as exc:
        # say also what the placement table says, when it refuses the layout too
        if _search(instances, occupied) is None:
            exc.reason += "; " + _explain(instances, occupied, table)
            exc.args = (exc.reason,)
        raise
    found = _search(instances, occupied)
    if found is None:
        layout = " + ".join(f"{s.name} x{n}" for s, n in wanted.items() if n)
        raise LayoutDoesNotFit(
            f"{layout} cannot be placed on {table.gpu} without overlapping memory slices: "
            + _explain(instances, occupied, table)
            + " (valid placements: "
            + ", ".join(f"{s.name} {_notation(s)}" for s in wanted if wanted[s])
            + (f"; already placed: {_describe(existing)}" if existing else "")
            + ")",
            code="placement",
        )
    return found


def max_instances_single(profile: str, table: MigTable) -> int:
    """How many instances of one profile one GPU holds (the GPU Operator "single" strategy).

    E.g. 7 for 1g.10gb on H100-80GB, 4 for 1g.20gb on A100-80GB, 3 for 2g.20gb, 2 for 3g.40gb.
    Raises :class:`LayoutDoesNotFit` (``unknown_profile``) for a profile the table lacks.
    """
    spec = _spec(profile, table)
    for count in range(spec.max_instances, 0, -1):
        try:
            place_layout({spec.name: count}, table)
        except LayoutDoesNotFit:
            continue
        return count
    return 0


def _spec(name: str, table: MigTable) -> ProfileSpec:
    spec = table.profile(name)
    if spec is None:
        raise LayoutDoesNotFit(
            f"{name!r} is not a MIG profile of {table.gpu} (valid: {', '.join(table.names)})",
            code="unknown_profile",
        )
    return spec


def _resolve(profiles: Mapping[str, int], table: MigTable) -> dict[ProfileSpec, int]:
    wanted: dict[ProfileSpec, int] = {}
    for name, count in profiles.items():
        spec = _spec(name, table)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise LayoutDoesNotFit(
                f"count of {name} must be a non-negative integer, got {count!r}",
                code="invalid_count",
            )
        wanted[spec] = wanted.get(spec, 0) + count
    return wanted


def _check_counts(spec: ProfileSpec, count: int, table: MigTable) -> None:
    if count > spec.max_instances:
        raise LayoutDoesNotFit(
            f"{count} x {spec.name} requested; one {table.gpu} holds at most "
            f"{spec.max_instances} instance(s) of it",
            code="max_instances",
        )


def _check_totals(specs: list[ProfileSpec], table: MigTable) -> None:
    media = sum(1 for s in specs if s.media_extensions)
    if media > 1:
        raise LayoutDoesNotFit(
            f"{media} +me instances requested; only one +me (media extensions) instance "
            "fits per GPU",
            code="media_extensions",
        )
    compute = sum(s.compute_slices for s in specs)
    if compute > table.compute_slices:
        raise LayoutDoesNotFit(
            f"the layout needs {compute} compute slices; {table.gpu} has {table.compute_slices}",
            code="compute_slices",
        )
    memory = sum(s.memory_slices for s in specs)
    if memory > table.memory_slices:
        raise LayoutDoesNotFit(
            f"the layout needs {memory} memory slices; {table.gpu} has {table.memory_slices}",
            code="memory_slices",
        )
    if table.max_instances is not None and len(specs) > table.max_instances:
        raise LayoutDoesNotFit(
            f"the layout has {len(specs)} instances; {table.gpu} holds at most "
            f"{table.max_instances}",
            code="instances",
        )


def _occupancy(existing: list[Placement], table: MigTable) -> int:
    mask = 0
    for placement in existing:
        bits = _bits(placement.start, placement.size)
        if mask & bits or placement.start + placement.size > table.memory_slices:
            raise LayoutDoesNotFit(
                f"existing instances overlap or exceed the GPU: {_describe(existing)}",
                code="existing_overlap",
            )
        mask |= bits
    return mask


def _search(instances: list[ProfileSpec], occupied: int) -> list[Placement] | None:
    """Depth-first: each instance at the lowest free start; identical instances in increasing
    start order (they are interchangeable, so other orders need not be tried)."""
    chosen: list[Placement] = []

    def step(index: int, mask: int) -> bool:
        if index == len(instances):
            return True
        spec = instances[index]
        floor = -1
        if index and instances[index - 1] is spec:
            floor = chosen[-1].start
        for start in spec.starts:
            bits = _bits(start, spec.size)
            if start <= floor or mask & bits:
                continue
            chosen.append(Placement(spec.name, start, spec.size))
            if step(index + 1, mask | bits):
                return True
            chosen.pop()
        return False

    return chosen if step(0, occupied) else None


def _explain(instances: list[ProfileSpec], occupied: int, table: MigTable) -> str:
    """Why the placement search fails, from its deepest partial placement: which instances
    it placed and the free starts left for the next one (``{0,2,4}:2`` semantics)."""
    best: list[Placement] = []
    chosen: list[Placement] = []
    budget = [20_000]  # the search space is tiny (8 slices); the budget only bounds the worst case

    def step(index: int, mask: int) -> None:
        nonlocal best
        if len(chosen) > len(best):
            best = list(chosen)
        if index == len(instances) or budget[0] <= 0:
            return
        budget[0] -= 1
        spec = instances[index]
        for start in spec.starts:
            bits = _bits(start, spec.size)
            if not mask & bits:
                chosen.append(Placement(spec.name, start, spec.size))
                step(index + 1, mask | bits)
                chosen.pop()

    step(0, occupied)
    if len(best) == len(instances):
        return "every instance has a free placement, but the totals above do not fit"
    mask = occupied
    for placement in best:
        mask |= _bits(placement.start, placement.size)
    nxt = instances[len(best)]
    free = [s for s in nxt.starts if not mask & _bits(s, nxt.size)]
    taken = ", ".join(
        f"{p.profile} at start {p.start} (slices {p.start}-{p.start + p.size - 1})" for p in best
    )
    prefix = f"with {taken}, " if best else ""
    return (
        f"{prefix}no free start is left for {nxt.name} (its starts {_notation(nxt)}"
        + (f"; still free: {', '.join(map(str, free))}" if free else "")
        + ")"
    )


def _bits(start: int, size: int) -> int:
    return ((1 << size) - 1) << start


def _notation(spec: ProfileSpec) -> str:
    return "{" + ",".join(map(str, spec.starts)) + "}:" + str(spec.size)


def _describe(placements: Iterable[Placement]) -> str:
    return ", ".join(f"{p.profile}@{p.start}:{p.size}" for p in placements)
