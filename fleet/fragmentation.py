"""Fragmentation report for operators: free GPUs that cannot serve the common shapes, and the
node moves that would free whole hosts again.

Per GPU model and zone, over the schedulable hosts (``AVAILABLE``/``ALLOCATED``):

* ``free_gpus`` (placeable, :mod:`fleet.placeable`: free, healthy, scrubbed, reported, on a
  dedicated host), ``hosts``, ``whole_hosts_free``; ``shared_hosts``, ``shared_free_gpus``
  (placeable GPUs of shared hosts carrying no tenant's GPU instance) and
  ``shared_in_instances_gpus`` (those carrying one: their free slices serve more instances) —
  shared hosts serve only MIG instances of shared pools, so they count in no shape below; the
  console overview's Free and In instances columns count the same GPUs the same way;
* ``dedicated_free_gpus``: free GPUs on hosts a tenant holds GPUs of — only that tenant can
  use them (DESIGN §4 dedicated hosts);
* for each shape of 8, 4, 2 and 1 GPUs (those no larger than the model's biggest host):
  ``nodes`` — how many nodes of that shape the free GPUs could hold at once, inside NVLink
  islands (whole hosts for full-host shapes), ignoring tenancy — and ``stranded_gpus``, the free
  GPUs left that cannot be part of one (``free_gpus - shape * nodes``);
* ``mig``: for MIG-capable models, per catalog MIG profile, how many instances the wholly free
  GPUs could hold (``free_gpus * max_instances`` of the profile: a free GPU can be partitioned
  any way; GPUs already partitioned are held by a node and not free).

``moves`` is a plan (nothing is executed): the host steps of the defragmentation planner
(:mod:`fleet.defrag`, which an operator can dry-run and run): hosts partly used are emptied,
least held first, by moving each of their nodes onto *another partly used* host of the same
model and zone that the placement rules allow (same tenant or both sharing, inside one NVLink
island), never onto a wholly free host. A host is listed as freed only when every node on it
found a place.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from catalog.models import GpuModel

from .choices import SCHEDULABLE_HOST_STATES
from .models import Host
from .placement import FREE, HostView, _views_for_hosts

SHAPES = (8, 4, 2, 1)


def _nodes_of_shape(view: HostView, k: int) -> int:
    if k == view.gpu_count:
        return 1 if view.free == view.gpu_count else 0
    return sum(len(free) // k for free in view.free_by_island.values())


def gpus_in_instances(host_ids: Iterable) -> frozenset[str]:
    """The uuids of the GPUs of ``host_ids`` carrying a tenant's GPU instance (a shared
    host's GPU partitioned across tenants: not held whole, not free either)."""
    from .models import GpuInstance

    return frozenset(
        GpuInstance.objects.filter(host_id__in=list(host_ids), holder_id__isnull=False)
        .values_list("gpu__uuid", flat=True)
        .distinct()
    )


def summarise(
    views: Iterable[HostView],
    mig: dict[str, list[tuple[str, int]]],
    in_instances: frozenset[str] = frozenset(),
) -> list[dict]:
    """The per model and zone summary (see module docstring); ``in_instances``: the uuids of
    the GPUs carrying a tenant's GPU instance (:func:`gpus_in_instances`)."""
    groups: dict[tuple[str, str], list[HostView]] = defaultdict(list)
    for view in views:
        groups[(view.gpu_model, view.zone)].append(view)
    out = []
    for (model, zone), every in sorted(groups.items()):
        # dedicated shapes are placed on schedulable dedicated hosts only (fleet/placeable.py):
        # a shared host's free GPUs serve MIG instances of shared pools, counted apart
        hosts = [v for v in every if v.schedulable]
        shared = [v for v in every if not v.schedulable]
        free = sum(v.free for v in hosts)
        largest = max(v.gpu_count for v in every)
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
                "shared_hosts": len(shared),
                "shared_free_gpus": sum(
                    1 for v in shared for g in v.free_gpus() if g.uuid not in in_instances
                ),
                "shared_in_instances_gpus": sum(
                    1 for v in shared for g in v.free_gpus() if g.uuid in in_instances
                ),
                "shapes": shapes,
                "mig": [
                    {"profile": name, "instances": free * per_gpu}
                    for name, per_gpu in mig.get(model, [])
                ],
            }
        )
    return out


def plan_moves(views: list[HostView]) -> dict[str, Any]:
    """Moves that would free whole hosts: the host steps of the defragmentation planner
    (:func:`fleet.defrag.plan_defrag`, one planner for both), in this report's shape;
    ``views`` are not changed."""
    from .defrag import plan_defrag

    plan = plan_defrag(views, islands=False)
    moves = [
        {
            "holder_id": str(m.holder_id),
            "tenant_id": str(m.tenant_id),
            "gpus": m.gpus,
            "from_host": m.from_host,
            "to_host": m.to_host,
            "to_gpu_indexes": list(m.to_gpu_indexes),
        }
        for m in plan.moves
    ]
    return {
        "moves": moves,
        "hosts_freed": plan.hosts_freed,
        "gpus_moved": sum(m["gpus"] for m in moves),
    }


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
    carrying = gpus_in_instances(v.id for v in views if not v.schedulable)
    return {"groups": summarise(views, mig_capacity_table(), carrying), **plan_moves(views)}
