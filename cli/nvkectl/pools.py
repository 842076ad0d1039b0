"""The body of ``nvkectl nodepools create``: every field the node pool API takes, from flags
or a file (``-f pool.yaml``, YAML or JSON, the API's own field names; flags given override
the file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def parse_layout(
    text: str, flag: str = "--mig-layout", example: str = "3g.40gb=1"
) -> dict[str, int]:
    """``"3g.40gb=1,1g.10gb=2"`` -> ``{"3g.40gb": 1, "1g.10gb": 2}``; ValueError naming
    ``flag`` otherwise."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        profile, sep, count = part.partition("=")
        if not sep or not count.strip().isdigit():
            raise ValueError(f"{flag}: {part!r} is not PROFILE=COUNT (e.g. {example})")
        out[profile.strip()] = int(count)
    return out


def pool_body(
    *,
    name: str,
    file: Path | None = None,
    gpu_model: str | None = None,
    gpus_per_node: int | None = None,
    nodes: int | None = None,
    mode: str | None = None,
    mig_profile: str | None = None,
    mig_layout: str | None = None,
    vgpu_profile: str | None = None,
    vgpu_layout: str | None = None,
    replicas: int | None = None,
    tenancy: str | None = None,
    driver_version: str | None = None,
    cuda_version: str | None = None,
    reservation: str | None = None,
    same_nvlink_domain: bool = False,
    gpu_publishing: str | None = None,
) -> dict[str, Any]:
    """The create body. ``mode`` defaults to ``mig`` with a MIG profile or layout, ``vgpu``
    with a vGPU profile or layout, else the file's, else ``exclusive``. ValueError on a bad
    file or layout."""
    body: dict[str, Any] = {}
    if file is not None:
        loaded = yaml.safe_load(file.read_text())
        if not isinstance(loaded, dict):
            raise ValueError(f"{file}: not a mapping of node pool fields")
        body.update(loaded)
    body["name"] = name
    for key, value in (
        ("gpu_model", gpu_model),
        ("gpus_per_node", gpus_per_node),
        ("node_count", nodes),
        ("driver_version", driver_version),
        ("cuda_version", cuda_version),
        ("reservation", reservation),
        ("gpu_publishing", gpu_publishing),
    ):
        if value is not None:
            body[key] = value
    isolation = dict(body.get("isolation") or {})
    for key, value in (
        ("mig_profile", mig_profile),
        ("mig_layout", parse_layout(mig_layout) if mig_layout else None),
        ("vgpu_profile", vgpu_profile),
        (
            "vgpu_layout",
            parse_layout(vgpu_layout, "--vgpu-layout", "A10-4Q=3") if vgpu_layout else None,
        ),
        ("replicas", replicas),
        ("tenancy", tenancy),
    ):
        if value is not None:
            isolation[key] = value
    if mode is None and "mode" not in isolation:
        if mig_profile or mig_layout:
            mode = "mig" if replicas is None else None
        elif vgpu_profile or vgpu_layout:
            mode = "vgpu"
    if mode is not None:
        isolation["mode"] = mode
    isolation.setdefault("mode", "exclusive")
    body["isolation"] = isolation
    if same_nvlink_domain:
        body["placement"] = {**(body.get("placement") or {}), "same_nvlink_domain": True}
    return body


def isolation_text(isolation: dict[str, Any] | None) -> str:
    """A pool's isolation in one word group, as the portal shows it: ``exclusive``,
    ``mig 1g.10gb``, ``mig 3g.40gb=1,1g.10gb=2``, ``vgpu A10-4Q``, ``time-slicing x4``,
    ``mps x2``; `` shared`` appended for ``tenancy: shared`` (other tenants' instances share
    the GPUs)."""
    iso = isolation or {}
    mode = iso.get("mode", "exclusive")
    if mode == "mig":
        what = iso.get("mig_profile") or ",".join(
            f"{k}={v}" for k, v in (iso.get("mig_layout") or {}).items()
        )
    elif mode == "vgpu":
        what = iso.get("vgpu_profile") or ",".join(
            f"{k}={v}" for k, v in (iso.get("vgpu_layout") or {}).items()
        )
    elif mode in ("time-slicing", "mps"):
        what = f"x{iso.get('replicas')}" + (
            f" on {iso['mig_profile']}" if iso.get("mig_profile") else ""
        )
    else:
        what = ""
    text = f"{mode} {what}".strip()
    return f"{text} shared" if iso.get("tenancy") == "shared" else text


def pool_row(pool: dict[str, Any]) -> dict[str, Any]:
    """A node pool of the API with the table's derived columns: ``isolation`` (text),
    ``resources_per_node`` (what each node gets, from the pool's rendered GPU config:
    ``nvidia.com/gpu=1`` for a shared 1g.10gb node, not the 7 of a whole GPU) and ``driver``:
    the pool's pin, or ``not pinned`` (each node runs its host's driver: the node rows say
    which, as the portal does)."""
    resources = (pool.get("gpu_config") or {}).get("resources") or {}
    return {
        **pool,
        "isolation": isolation_text(pool.get("isolation")),
        "resources_per_node": ",".join(f"{k}={v}" for k, v in sorted(resources.items())),
        "driver": pool.get("driver_version") or "not pinned",
    }


def resize_dry_run_lines(body: dict[str, Any]) -> list[str]:
    """What ``nvkectl nodepools scale --dry-run`` prints of the API's set-size dry run: the
    size change, then the nodes a scale-down removes (in the order it removes them) or how
    many a scale-up provisions."""
    size = body.get("node_count") or {}
    plan = body.get("disruption") or {}
    lines = [f"node count: {size.get('from')} -> {size.get('to')}"]
    for node in plan.get("nodes") or []:
        why = "unhealthy" if node.get("unhealthy") else "newest"
        held = node.get("gpu_instances")
        if held is not None:  # a shared pool's VM node holds GPU instances, not GPUs
            what = " + ".join(f"{n} x {p}" for p, n in held.items()) or "no"
            what += " GPU instance(s)"
        else:
            what = f"{node['gpus']} GPU(s)"
        lines.append(f"  would drain and remove {node['name']} ({what}, {why})")
    if plan.get("provision"):
        lines.append(f"  would provision {plan['provision']} node(s)")
        if body.get("capacity"):  # a fresh-user trial read the cost as the added nodes'
            # capacity counts the nodes to place (from the live ones), quota the nodes the
            # spec adds (the quota already holds the pool's spec, placed or not): they differ
            # for a pool short of capacity (a trial read 4 and 1 under one header)
            grown = max((size.get("to") or 0) - (size.get("from") or 0), 0)
            lines.append(
                f"  (capacity below: the {plan['provision']} node(s) to place; quota: the "
                f"{grown} node(s) the new size adds to the spec of {size.get('from')}; cost: "
                f"the whole pool at {size.get('to')} node(s))"
            )
    if len(lines) == 1:
        lines.append("  no node would change")
    return lines
