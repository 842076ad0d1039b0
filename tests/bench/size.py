"""The size a benchmark runs at: ``NVKE_BENCH_SIZE=full`` (the default, ``make bench``: the
sizes and targets of DESIGN §9) or ``ci`` (``make bench-ci``, run by ``.ci/run``: every
benchmark end to end at a small size in a few minutes, so none can break unnoticed; its
figures are printed but targets are not judged — only correctness is)."""

from __future__ import annotations

from typing import TypeVar

from nvke.settings_registry import read

T = TypeVar("T")

SIZE = read("NVKE_BENCH_SIZE")
if SIZE not in ("full", "ci"):
    raise ValueError(f"NVKE_BENCH_SIZE must be 'full' or 'ci', not {SIZE!r}")
CI = SIZE == "ci"


def pick(full: T, ci: T) -> T:
    """``full`` at the full size, ``ci`` at the CI size."""
    return ci if CI else full


def judge(met: bool, what: str) -> None:
    """Assert a performance target at the full size; at the CI size only print it."""
    if CI:
        print(f"(CI size: target not judged: {what} -> {'met' if met else 'missed'})")
        return
    assert met, what
