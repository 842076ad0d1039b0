"""Telemetry sources: ``nvml`` (live), ``nvidia-smi-xml`` (a report file), ``replay`` (a recording),
``simulated`` (the state file of a SIMULATED host, written by NVKE's simulated provider).

All implement :class:`nvke_agent.sources.base.Source`; :func:`open_source` builds one by name.
"""

from __future__ import annotations

from datetime import datetime

from nvke_agent.sources.base import (
    SOURCE_NAMES,
    Event,
    GpuInventory,
    Inventory,
    MigDeviceInventory,
    Sample,
    Source,
    SourceError,
    SourceUnavailable,
)

__all__ = [
    "SOURCE_NAMES",
    "Event",
    "GpuInventory",
    "Inventory",
    "MigDeviceInventory",
    "Sample",
    "Source",
    "SourceError",
    "SourceUnavailable",
    "open_source",
]


def open_source(
    name: str,
    *,
    start: datetime | None = None,
    xml: str | None = None,
    replay: str | None = None,
    rebase: bool = True,
    loop: bool = False,
    sim_state: str | None = None,
    slice_scrub_dir: str | None = None,
) -> Source:
    """Open the source called ``name`` (one of :data:`SOURCE_NAMES`).

    ``xml`` is required for ``nvidia-smi-xml``, ``replay`` for ``replay`` and ``sim_state`` for
    ``simulated``; ``slice_scrub_dir`` (nvml, shared hosts) where slice clears are recorded;
    ``start`` (aware
    UTC) is the instant the replay's first record is rebased to (default: the first collect). Raises
    :class:`SourceUnavailable` when the source cannot start, :class:`ValueError` for bad
    arguments.
    """
    if name == "nvml":
        from nvke_agent.sources.nvml import NvmlSource

        return NvmlSource(slice_scrub_dir=slice_scrub_dir)
    if name == "nvidia-smi-xml":
        if not xml:
            raise ValueError("--xml FILE is required with --source nvidia-smi-xml")
        from nvke_agent.sources.smi_xml import SmiXmlSource

        return SmiXmlSource(xml)
    if name == "replay":
        if not replay:
            raise ValueError("--replay FILE is required with --source replay")
        from nvke_agent.sources.replay import ReplaySource

        return ReplaySource(replay, start=start, rebase=rebase, loop=loop)
    if name == "simulated":
        if not sim_state:
            raise ValueError("--sim-state FILE is required with --source simulated")
        from nvke_agent.sources.simulated import SimulatedSource

        return SimulatedSource(sim_state)
    raise ValueError(f"unknown source {name!r}; expected one of {', '.join(SOURCE_NAMES)}")
