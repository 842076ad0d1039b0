"""GPU interconnect topology of a host: parse ``nvidia-smi topo -m`` or the agent's NVML view,
and derive NVLink islands (the GPU sets placement keeps a multi-GPU node inside).

Normalised shape stored in ``Host.topology``::

    {"source": "nvidia-smi topo -m" | "nvml",
     "gpus": 8,
     "links": [["X", "NV18", …], …],   # links[i][j] between GPU i and GPU j, as nvidia-smi
                                        # prints them: X (self), NV<n> (n bonded NVLinks),
                                        # PIX, PXB, PHB, NODE, SYS (PCIe paths, nearest first)
     "islands": [[0, 1, 2, 3, 4, 5, 6, 7]]}

The link names are nvidia-smi's legend (``NV#`` = "Connection traversing a bonded set of #
NVLinks"; ``PIX``/``PXB``/``PHB``/``NODE``/``SYS`` = PCIe paths through one switch, several
switches, the host bridge, the NUMA node's host bridges, the SMP interconnect). On NVSwitch
systems (HGX/DGX) every GPU pair shows ``NV#`` (e.g. ``NV18`` on H100 HGX), so the host is one
island; PCIe cards joined by NVLink bridges (H100 NVL, A100 PCIe) form islands of 2.

An island is a connected component of the ``NV#`` graph. A GPU set inside one island shares
NVLink (directly or through the island's switch); a set that spans islands is "NVLink-split".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

PCIE_LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU = re.compile(r"^GPU(\d+)$")
_LINK = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|N/A)$")


class InvalidTopology(ValueError):
    """Text that is not a ``nvidia-smi topo -m`` matrix (or does not match the host)."""


def is_nvlink(link: str | None) -> bool:
    """True for ``NV<n>`` cells."""
    return bool(link) and link.startswith("NV") and link[2:].isdigit()  # type: ignore[union-attr]


def parse_nvidia_smi_topo(text: str) -> dict[str, Any]:
    """Parse the GPU matrix of ``nvidia-smi topo -m`` into the normalised shape.

    NIC rows/columns (``NIC0``, ``mlx5_0``) and the affinity columns are ignored. Raises
    :class:`InvalidTopology` when there is no GPU matrix or it is not square.
    """
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header: list[str] | None = None
    rows: dict[int, list[str]] = {}
    for line in lines:
        if line.strip().startswith("Legend"):
            break
        tokens = line.split()
        if not tokens:
            continue
        if header is None:
            if _GPU.match(tokens[0]):
                header = []
                for token in tokens:
                    if token in ("CPU", "NUMA", "GPU") or token.startswith("Affinity"):
                        break
                    header.append(token)
            continue
        match = _GPU.match(tokens[0])
        if not match:
            continue
        cells = tokens[1 : 1 + len(header)]
        if len(cells) < len(header) or not all(_LINK.match(c) for c in cells):
            raise InvalidTopology(f"row {tokens[0]} does not have {len(header)} link cells")
        rows[int(match.group(1))] = cells
    if not header:
        raise InvalidTopology("no GPU matrix found (expected a header line of GPU0 GPU1 …)")
    gpu_columns = [i for i, name in enumerate(header) if _GPU.match(name)]
    indexes = [int(_GPU.match(header[i]).group(1)) for i in gpu_columns]  # type: ignore[union-attr]
    if sorted(indexes) != list(range(len(indexes))) or sorted(rows) != indexes:
        raise InvalidTopology(
            f"GPU columns {indexes} and rows {sorted(rows)} do not form a square matrix"
        )
    n = len(indexes)
    links = [["X"] * n for _ in range(n)]
    for i in range(n):
        for col, j in zip(gpu_columns, indexes, strict=True):
            links[i][j] = rows[i][col]
    for i in range(n):
        if links[i][i] != "X":
            raise InvalidTopology(f"GPU{i} is not 'X' to itself")
    return normalise("nvidia-smi topo -m", links)


def normalise(source: str, links: Sequence[Sequence[str]]) -> dict[str, Any]:
    """The stored shape for a link matrix (islands computed)."""
    matrix = [list(row) for row in links]
    return {
        "source": source,
        "gpus": len(matrix),
        "links": matrix,
        "islands": nvlink_islands(matrix),
    }


def nvlink_islands(links: Sequence[Sequence[str]]) -> list[list[int]]:
    """Connected components of the NVLink graph, each sorted, ordered by their first GPU.

    A GPU with no NVLink is an island of its own.
    """
    n = len(links)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        for j in range(i + 1, n):
            if is_nvlink(links[i][j]) or is_nvlink(links[j][i]):
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values(), key=lambda group: group[0])


def from_agent(topology: Any, gpu_count: int) -> dict[str, Any] | None:
    """The normalised shape from the agent's ``inventory.topology`` (``{"links": [[…]]}``).

    Returns None when it is absent or does not match ``gpu_count`` GPUs.
    """
    if not isinstance(topology, dict):
        return None
    links = topology.get("links")
    if (
        not isinstance(links, list)
        or len(links) != gpu_count
        or not all(isinstance(row, list) and len(row) == gpu_count for row in links)
        or not all(isinstance(cell, str) and _LINK.match(cell) for row in links for cell in row)
    ):
        return None
    return normalise("nvml", links)


def island_of(topology: dict[str, Any]) -> dict[int, int]:
    """GPU index -> island number (position in ``islands``); empty when topology is unknown."""
    out: dict[int, int] = {}
    for number, island in enumerate(topology.get("islands") or []):
        for index in island:
            out[int(index)] = number
    return out
