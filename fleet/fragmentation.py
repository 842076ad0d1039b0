"""Fragmentation report for operators: free GPUs that cannot serve the common shapes, and the
node moves that would free whole hosts again.

Per GPU model and zone, over the schedulable hosts (``AVAILABLE``/``ALLOCATED``):

* ``free_gpus`` (usable: healthy, scrubbed, reported), ``hosts``, ``whole_hosts_free``;
* ``dedicated_free_gpus``: free GPUs on hosts a tenant holds GPUs of — only that tenant can
  use them (DESIGN §4 dedicated hosts);
* for each shape of 8, 4, 2 and 1 GPUs (those no larger than the model's biggest host):
  ``nodes`` — how many nodes of that shape the free GPUs could hold at once, inside NVLink
  islands (whole hosts for full-host shapes), ignoring tenancy — and ``stranded_gpus``, the free
  GPUs left that cannot be part of one (``free_gpus - shape * nodes``);
* ``mig``: for MIG-capable models, per catalog MIG profile, how many instances the wholly free
  GPUs could hold (``free_gpus * max_instances`` of the profile: a free GPU can be partitioned
  any way; GPUs already partitioned are held by a node and not free).

``moves`` is a plan (nothing is executed): hosts partly used are emptied, smallest first, by
moving each of their nodes onto *another partly used* host of the same model and zone that
the placement rules allow (same tenant or both sharing, inside one NVLink island), never onto a
wholly free host. A host is listed as freed only when every node on it found a place.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from catalog.models import GpuModel

from .choices import SCHEDULABLE_HOST_STATES
from .models import Host
from .placement import FREE, GpuRequest, HostView, Planner, _views_for_hosts

SHAPES = (8, 4, 2, 1)


def _nodes_of_shape(view: HostView, k: int) -> int:
    if k == view.gpu_count:
        return 1 if view.free == view.gpu_count else 0
    return sum(len(free) // k for free in view.free_by_island.values())


def summarise(views: Iterable[HostView], mig: dict[str, list[tuple[str, int]]]) -> list[dict]:
    """The per model and zone summary (see module docstring)."""
    groups: dict[tuple[str, str], list[HostView]] = defaultdict(list)
    for view in views:
        groups[(view.gpu_model, view.zone)].append(view)
    out = []
    for (model, zone), hosts in sorted(groups.items()):
        free = sum(v.free for v in hosts)
        largest = max(v.gpu_count for v in hosts)
        shapes = []
        for k in SHAPES:
            if k > largest:
                continue
            nodes = sum(_nodes_of_shape(v, k) for v in hosts)
            shapes.append({"gpus": k, "nodes": nodes, "stranded_gpus": free - k * nodes})
        out.append(
            {
                "gpu_model": model,
                "zone": zone,
                "hosts": len(hosts),
                "whole_hosts_free": sum(1 for v in hosts if v.free == v.gpu_count),
                "free_gpus": free,
                "dedicated_free_gpus": sum(v.free for v in hosts if v.tenancy() != FREE),
                "shapes": shapes,
                "mig": [
                    {"profile": name, "instances": free * per_gpu}
                    for name, per_gpu in mig.get(model, [])
                ],
            }
        )
    return out


def plan_moves(views: list[HostView]) -> dict[str, Any]:
    """Moves that would free whole hosts (see module docstring); ``views`` are not changed."""
    by_group: dict[tuple[str, str], list[HostView]] = defaultdict(list)
    for view in views:
        by_group[(view.gpu_model, view.zone)].append(_copy(view))
    moves: list[dict[str, Any]] = []
    freed: list[str] = []
    for (_model, zone), hosts in sorted(by_group.items()):
        planner = Planner(hosts)
        partial = [h for h in hosts if 0 < h.free < h.gpu_count and _held(h) > 0]
        partial.sort(key=lambda h: (_held(h), h.hostname))
        for host in partial:
            if host.id not in planner.hosts:
                continue
            nodes = _nodes_on(host)
            planner.remove(host.id)
            placed = []
            for holder, (k, tenant, shares, group) in sorted(
                nodes.items(), key=lambda item: (-item[1][0], str(item[0]))
            ):
                request = GpuRequest(
                    holder_id=holder,
                    tenant_id=tenant,
                    gpu_model=host.gpu_model,
                    gpus=k,
                    region=zone,
                    zone=zone,
                    group_id=group,
                    shares_host=shares,
                )
                found = planner.find(request, allow_split=False, use_free_hosts=False)
                if found is None:
                    break
                target, indexes, _split = found
                placed.append(planner._apply(request, target, indexes, False))
            if len(placed) == len(nodes):
                for placement in placed:
                    moves.append(
                        {
                            "holder_id": str(placement.holder_id),
                            "tenant_id": str(nodes[placement.holder_id][1]),
                            "gpus": len(placement.gpu_uuids),
                            "from_host": host.hostname,
                            "to_host": placement.hostname,
                            "to_gpu_indexes": list(placement.gpu_indexes),
                        }
                    )
                freed.append(host.hostname)
            else:
                for placement in placed:
                    planner.unplace(placement)
                planner.add(host)
    return {
        "moves": moves,
        "hosts_freed": freed,
        "gpus_moved": sum(m["gpus"] for m in moves),
    }


def _held(view: HostView) -> int:
    return sum(1 for g in view.gpus if g.holder is not None)


def _nodes_on(view: HostView) -> dict[uuid.UUID, tuple[int, uuid.UUID, bool, uuid.UUID | None]]:
    nodes: dict[uuid.UUID, list] = {}
    for g in view.gpus:
        if g.holder is None:
            continue
        entry = nodes.setdefault(g.holder, [0, g.tenant, g.shares, g.group])
        entry[0] += 1
    return {k: tuple(v) for k, v in nodes.items()}  # type: ignore[misc]


def _copy(view: HostView) -> HostView:
    from dataclasses import replace

    return HostView(
        id=view.id,
        hostname=view.hostname,
        zone=view.zone,
        region=view.region,
        gpu_model=view.gpu_model,
        gpus=[replace(g) for g in view.gpus],
        schedulable=view.schedulable,
    )


def mig_capacity_table() -> dict[str, list[tuple[str, int]]]:
    """``{model slug: [(profile name, max instances per GPU)]}`` from the catalog."""
    out: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for model in GpuModel.objects.filter(mig_capable=True).prefetch_related("mig_profiles"):
        for profile in sorted(model.mig_profiles.all(), key=lambda p: (p.compute_slices, p.name)):
            out[model.slug].append((profile.name, profile.max_instances))
    return out


def fragmentation_report(*, gpu_model: str | None = None, zone: str | None = None) -> dict:
    """The whole report: ``{"groups": [...], "moves": [...], "hosts_freed": [...], …}``."""
    hosts = Host.objects.filter(state__in=SCHEDULABLE_HOST_STATES)
    if gpu_model:
        hosts = hosts.filter(gpu_model_id=gpu_model)
    if zone:
        hosts = hosts.filter(zone=zone)
    views = _views_for_hosts(hosts.values_list("pk", flat=True))
    return {"groups": summarise(views, mig_capacity_table()), **plan_moves(views)}
