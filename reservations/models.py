"""Reservations: N GPUs of one catalog model in a region (optionally one zone) for a window.

The model follows EKS Capacity Blocks for ML / GKE reservations: capacity is counted (GPUs),
not pinned to hosts; admission (:mod:`reservations.admission`) guarantees that at every
instant the fleet holds the reserved GPUs next to the on-demand ones already placed.

Scope: ``region`` + optional ``zone``, or a whole multi-node NVLink domain
(``nvlink_cluster_uuid`` + ``nvlink_clique_id``, :mod:`fleet.nvlink_domains`): then ``gpus`` is
every GPU of the domain's hosts, and those hosts are *fenced* for the window — only claims of
that reservation may use them (:mod:`reservations.fences`).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from .choices import EndAction, ReservationState


def default_notice_lead_s() -> int:
    return int(settings.NVKE_RESERVATION_NOTICE_LEAD_S)


class Reservation(models.Model):
    """``gpus`` whole GPUs of ``gpu_model`` in ``region`` (``zone``) for ``[start, end)``.

    ``end`` None is open-ended (until cancelled). ``end_action`` says what happens to the
    nodes of pools drawing from it at the end; the end is announced ``notice_lead_s`` seconds
    before (``announced_at``), and processed once (``ended_at``) by
    :func:`reservations.lifecycle.sweep`.
    """

    tenant_path = "tenant"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    name = models.CharField(max_length=63, blank=True)
    gpu_model = models.ForeignKey("catalog.GpuModel", on_delete=models.PROTECT, related_name="+")
    region = models.CharField(max_length=64)
    zone = models.CharField(max_length=64, blank=True)
    gpus = models.PositiveIntegerField()
    start = models.DateTimeField()
    end = models.DateTimeField(null=True, blank=True)
    end_action = models.CharField(max_length=8, choices=EndAction.choices, default=EndAction.KEEP)
    notice_lead_s = models.PositiveIntegerField(default=default_notice_lead_s)
    announced_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    #: when every pool drawing from it had done what ``end_action`` says (drain: scaled to 0)
    settled_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    #: a whole multi-node NVLink domain (fabric cluster UUID + clique id), or both None
    nvlink_cluster_uuid = models.UUIDField(null=True, blank=True)
    nvlink_clique_id = models.BigIntegerField(null=True, blank=True)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["start", "id"]
        indexes = [models.Index(fields=["gpu_model", "region"], name="reservation_model_region")]
        constraints = [
            models.CheckConstraint(
                condition=Q(end__isnull=True) | Q(end__gt=F("start")),
                name="reservation_end_after_start",
            ),
            models.CheckConstraint(condition=Q(gpus__gt=0), name="reservation_gpus_positive"),
            models.CheckConstraint(
                condition=Q(nvlink_cluster_uuid__isnull=True, nvlink_clique_id__isnull=True)
                | Q(nvlink_cluster_uuid__isnull=False, nvlink_clique_id__isnull=False),
                name="reservation_nvlink_domain_whole",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpus} x {self.gpu_model_id} in {self.zone or self.region}"

    @property
    def label(self) -> str:
        """How messages name it: ``"train-q4 (5f0c2a9e-…)"``, its name (every reservation has
        one: :func:`reservations.admission.default_name`) and id, as nvkectl and the portal
        list it (a trial read only the id in a 409 and a dry run)."""
        return f"{self.name} ({self.id})" if self.name else str(self.id)

    @property
    def nvlink_domain(self) -> tuple[uuid.UUID, int] | None:
        """``(cluster_uuid, clique_id)`` of the NVLink domain it reserves, or None."""
        if self.nvlink_cluster_uuid is None or self.nvlink_clique_id is None:
            return None
        return (self.nvlink_cluster_uuid, int(self.nvlink_clique_id))

    def effective_end(self) -> datetime | None:
        """When the reserved GPUs stop counting: ``end``, or the cancellation if earlier."""
        ends = [t for t in (self.end, self.cancelled_at) if t is not None]
        return min(ends) if ends else None

    def announce_at(self) -> datetime | None:
        """When the end is announced: ``notice_lead_s`` before ``end``, but never in the first
        half of the reservation — a notice longer than the reservation (24 h for a 2-hour
        one) announced its end, "drained", at its start (issue 33). None when open-ended."""
        if self.end is None:
            return None
        lead = timedelta(seconds=self.notice_lead_s)
        return max(self.end - lead, self.start + (self.end - self.start) / 2)

    def state_at(self, now: datetime) -> str:
        if self.cancelled_at is not None and self.cancelled_at <= now:
            return ReservationState.CANCELLED
        end = self.effective_end()
        if end is not None and end <= now:
            return ReservationState.ENDED
        return ReservationState.ACTIVE if self.start <= now else ReservationState.SCHEDULED

    def is_active(self, now: datetime) -> bool:
        return self.state_at(now) == ReservationState.ACTIVE


class ReservationClaim(models.Model):
    """A GPU holder (a node) placed on a reservation's capacity, written by the placement
    hook in the claim's transaction. The GPUs it holds are the fleet's ``Gpu.holder_id`` rows
    (one truth): a released node's claim row is harmless, it holds no GPU any more."""

    holder_id = models.UUIDField(primary_key=True)
    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="claims")
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.holder_id} on {self.reservation_id}"
