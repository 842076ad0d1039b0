"""Placement: hand free GPUs of physical hosts to nodes, all-or-nothing.

Rules (DESIGN §4):

- only hosts of the requested GPU model, in the requested region, in a schedulable state
  (``AVAILABLE``/``ALLOCATED``), with healthy free GPUs;
- a host is dedicated to one tenant while that tenant holds any of its GPUs (no two tenants on
  one host unless hardware-isolated sharing is allowed, which whole-GPU requests never need);
- best fit: among hosts that can take the node, the one with the fewest free GPUs, so whole
  hosts stay free for large nodes; ties broken by hostname for determinism; on a host the
  lowest GPU indexes are taken;
- :func:`claim_gpus` places a batch of requests atomically: it must run inside the caller's
  transaction, and when any request cannot be placed it raises :class:`InsufficientCapacity`
  and the caller's rollback leaves nothing held.

Concurrency: each candidate host row is locked with ``SELECT … FOR UPDATE SKIP LOCKED`` before
its GPUs are read and claimed, so two workers never claim the same GPU and never put two
tenants on one host; a host locked by someone else is simply skipped.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from .choices import SCHEDULABLE_HOST_STATES, GpuHealth, HostState
from .models import Gpu, Host


@dataclass(frozen=True)
class GpuRequest:
    """``gpus`` whole GPUs of ``gpu_model`` (catalog slug) in ``region`` for one node."""

    holder_id: uuid.UUID
    tenant_id: uuid.UUID
    gpu_model: str
    gpus: int
    region: str


@dataclass(frozen=True)
class Placement:
    """Where a request landed: the host and the GPU UUIDs (by GPU index)."""

    holder_id: uuid.UUID
    host_id: uuid.UUID
    hostname: str
    zone: str
    gpu_uuids: tuple[str, ...]


class InsufficientCapacity(Exception):
    """No schedulable host can take a request (nothing was claimed by the caller's batch)."""

    def __init__(self, request: GpuRequest, placed: int, total: int) -> None:
        self.request = request
        self.placed = placed
        self.total = total
        super().__init__(
            f"no free host with {request.gpus} x {request.gpu_model} GPU(s) in region "
            f"{request.region!r} ({placed} of {total} node(s) could be placed)"
        )


def claim_gpus(requests: Sequence[GpuRequest]) -> list[Placement]:
    """Claim GPUs for every request or raise :class:`InsufficientCapacity`.

    Must be called inside ``transaction.atomic()``: on failure the caller's rollback releases
    whatever this batch had claimed. Requests already holding GPUs (same ``holder_id``) are
    returned as they are, which makes the call idempotent.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("claim_gpus must run inside transaction.atomic()")
    placements: list[Placement] = []
    for index, request in enumerate(requests):
        existing = _existing_placement(request.holder_id)
        if existing is not None:
            placements.append(existing)
            continue
        placement = _claim_one(request)
        if placement is None:
            raise InsufficientCapacity(request, placed=index, total=len(requests))
        placements.append(placement)
    return placements


def release_gpus(holder_id: uuid.UUID) -> list[str]:
    """Free every GPU held by ``holder_id``; returns their UUIDs. Idempotent."""
    with transaction.atomic():
        gpus = list(
            Gpu.objects.select_for_update().filter(holder_id=holder_id).order_by("host_id", "index")
        )
        host_ids = {g.host_id for g in gpus}
        Gpu.objects.filter(pk__in=[g.pk for g in gpus]).update(
            holder_id=None, holder_tenant=None, claimed_at=None
        )
        for host_id in host_ids:
            _refresh_host_state(host_id)
        return [g.uuid for g in gpus]


def _existing_placement(holder_id: uuid.UUID) -> Placement | None:
    gpus = list(Gpu.objects.filter(holder_id=holder_id).select_related("host").order_by("index"))
    if not gpus:
        return None
    host = gpus[0].host
    return Placement(holder_id, host.id, host.hostname, host.zone, tuple(g.uuid for g in gpus))


def _candidate_hosts(request: GpuRequest) -> list[Host]:
    free = Q(gpus__holder_id__isnull=True, gpus__health=GpuHealth.HEALTHY)
    foreign = Q(gpus__holder_tenant__isnull=False) & ~Q(gpus__holder_tenant_id=request.tenant_id)
    return list(
        Host.objects.filter(
            Host.in_region_q(request.region),
            gpu_model_id=request.gpu_model,
            state__in=SCHEDULABLE_HOST_STATES,
        )
        .annotate(free=Count("gpus", filter=free), foreign=Count("gpus", filter=foreign))
        .filter(free__gte=request.gpus, foreign=0)
        .order_by("free", "hostname")
    )


def _claim_one(request: GpuRequest) -> Placement | None:
    for candidate in _candidate_hosts(request):
        host = (
            Host.objects.select_for_update(skip_locked=True)
            .filter(pk=candidate.pk, state__in=SCHEDULABLE_HOST_STATES)
            .first()
        )
        if host is None:
            continue
        gpus = list(host.gpus.order_by("index"))
        if any(g.holder_tenant_id not in (None, request.tenant_id) for g in gpus):
            continue
        free = [g for g in gpus if g.holder_id is None and g.health == GpuHealth.HEALTHY]
        if len(free) < request.gpus:
            continue
        chosen = free[: request.gpus]
        Gpu.objects.filter(pk__in=[g.pk for g in chosen]).update(
            holder_id=request.holder_id,
            holder_tenant_id=request.tenant_id,
            claimed_at=timezone.now(),
        )
        if host.state != HostState.ALLOCATED:
            Host.objects.filter(pk=host.pk).update(state=HostState.ALLOCATED)
        return Placement(
            request.holder_id, host.id, host.hostname, host.zone, tuple(g.uuid for g in chosen)
        )
    return None


def _refresh_host_state(host_id: uuid.UUID) -> None:
    """ALLOCATED <-> AVAILABLE by whether any GPU is held (other states are left alone)."""
    held = Gpu.objects.filter(host_id=host_id, holder_id__isnull=False).exists()
    if held:
        Host.objects.filter(pk=host_id, state=HostState.AVAILABLE).update(state=HostState.ALLOCATED)
    else:
        Host.objects.filter(pk=host_id, state=HostState.ALLOCATED).update(state=HostState.AVAILABLE)


def max_host_gpus(gpu_model: str) -> int:
    """The most GPUs any non-retired host of ``gpu_model`` has (0 when there is none)."""
    counts = (
        Host.objects.filter(gpu_model_id=gpu_model)
        .exclude(state=HostState.RETIRED)
        .values_list("gpu_count", flat=True)
    )
    return max(counts, default=0)
