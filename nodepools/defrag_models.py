"""The DefragRun row: one operator-run defragmentation (nodepools/defrag.py executes it).

Imported by :mod:`nodepools.models` so Django registers it in the ``nodepools`` app.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

from clusters.choices import OperationStatus


class DefragRun(models.Model):
    """An operator's defragmentation run: the plan its dry run showed (``plan``, the shape of
    :meth:`fleet.defrag.Plan.as_dict` with node names added), executed one step at a time.

    Operation-shaped (DESIGN §3): ``status`` (``PENDING | RUNNING | DONE | FAILED |
    CANCELLED``), ``progress`` ``{done, total, stage}`` in steps, ``error`` ``{code, message,
    retryable}`` naming the move that stopped it. ``step`` is the index of the step under way,
    ``step_state`` ``""`` (not started) or ``moving`` (replacements placed, the source host
    draining); ``freed`` the hostnames its finished steps freed. Fleet-wide and operator-only:
    no tenant owns it (each moved node's pool gets its own HOST_MAINTENANCE operation, which
    its tenant sees). At most one run is active at a time.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    status = models.CharField(
        max_length=16, choices=OperationStatus.choices, default=OperationStatus.PENDING
    )
    #: True while PENDING or RUNNING, NULL once ended: unique, so one run is active at a time
    active = models.BooleanField(null=True, default=True, unique=True)
    requested_by = models.CharField(max_length=100, blank=True)
    #: the filter the plan was made with ("" = all)
    gpu_model = models.CharField(max_length=64, blank=True)
    zone = models.CharField(max_length=64, blank=True)
    plan = models.JSONField(default=dict)
    step = models.PositiveIntegerField(default=0)
    step_state = models.CharField(max_length=16, blank=True)
    step_started_at = models.DateTimeField(null=True, blank=True)
    freed = models.JSONField(default=list, blank=True)
    progress = models.JSONField(default=dict, blank=True)
    error = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"defrag {self.id} ({self.status})"
