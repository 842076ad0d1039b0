"""Slice-scrub records on a shared (hypervisor) host: the evidence the control plane needs
before the memory slices of a released MIG GPU instance are handed to another tenant.

When a tenant's VM node releases a GPU instance, the host's clear tool destroys the instance,
clears the memory of its slices (a scratch GPU instance at the same placement, its memory
overwritten) and writes one record per clear as ``<dir>/<GPU UUID>/<scrub id>.json``::

    {"scrub_id": "<uuid the control plane issued>", "start": 4, "size": 1,
     "status": "ok" | "failed", "cleared_bytes": 10737418240, "finished_at": "…",
     "method": "…"}

The ``nvml`` source reports the newest records of each GPU as ``slice_scrubs`` when started
with ``--slice-scrub-dir`` (the simulated source reads the same records from the simulated
host's state). No Django import: the agent is a standalone package.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: records reported per GPU (the newest; the wire format allows 56)
MAX_RECORDS = 32
KEYS = ("scrub_id", "start", "size", "status", "cleared_bytes", "finished_at", "method")


def read_records(directory: str | Path | None, gpu_uuid: str) -> list[dict[str, Any]]:
    """The newest :data:`MAX_RECORDS` records of ``gpu_uuid`` under ``directory``, oldest
    first; [] without a directory. Unreadable or malformed files are skipped (a record being
    written is complete only once renamed into place)."""
    if not directory:
        return []
    folder = Path(directory) / gpu_uuid
    try:
        files = sorted(folder.glob("*.json"), key=lambda p: (p.stat().st_mtime, p.name))
    except OSError:
        return []
    out = []
    for path in files[-MAX_RECORDS:]:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("scrub_id"), str):
            continue
        out.append({k: data[k] for k in KEYS if k in data})
    return out
