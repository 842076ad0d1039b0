"""nvke-agent: the NVKE node agent (DESIGN.md §5).

A standalone program (no Django, HTTP only) that runs on every GPU host, reads GPU inventory,
telemetry samples and Xid events from a *source* (``nvml``, ``nvidia-smi-xml`` or ``replay``)
and delivers them to the NVKE agent API through an on-disk spool that loses nothing.
"""

from __future__ import annotations

__version__ = "0.1.0"
