"""Circuit breaker rows: each cordon counted against a disruption budget, and each time the
breaker opened (see :mod:`fleet.breaker`)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class CordonRecord(models.Model):
    """A node or host taken out of service at ``at``: ``automatic`` (auto-repair, a drain
    automation starts) or not (an operator's drain, planned maintenance). ``pool_id``: the
    node pool (a plain UUID: fleet does not know node pools), ``gpu_model``: the catalog
    slug; ``target``: what was cordoned, in words."""

    at = models.DateTimeField(db_index=True)
    automatic = models.BooleanField()
    gpu_model = models.CharField(max_length=64, blank=True)
    pool_id = models.UUIDField(null=True, blank=True)
    target = models.CharField(max_length=200)
    actor = models.CharField(max_length=100)

    class Meta:
        ordering = ["at"]

    def __str__(self) -> str:
        return f"{self.target} at {self.at}"


class BreakerTrip(models.Model):
    """The breaker of ``scope`` (``pool:<uuid>`` or ``model:<slug>``) opened at
    ``tripped_at`` for ``reason``; automation there waits until an operator resumes it
    (``resumed_at``/``resumed_by``). One open trip per scope."""

    scope = models.CharField(max_length=80)
    tripped_at = models.DateTimeField()
    reason = models.CharField(max_length=500)
    resumed_at = models.DateTimeField(null=True, blank=True)
    resumed_by = models.CharField(max_length=100, blank=True)

    class Meta:
        ordering = ["-tripped_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["scope"], condition=Q(resumed_at__isnull=True), name="breaker_one_open"
            )
        ]

    def __str__(self) -> str:
        return f"{self.scope} tripped at {self.tripped_at}"
