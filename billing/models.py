"""The allocation ledger: who held which physical GPU, when (DESIGN §6).

One row per GPU (or, later, MIG slice / vGPU fraction) assigned to a tenant's node, from the
node's READY time to its release. ``period`` is a PostgreSQL ``tstzrange`` ``[start, end)``;
an open upper bound means "still held". An exclusion constraint forbids two overlapping rows
for the same GPU (and GPU instance), so a GPU is never billed twice for the same second.
GPU-seconds are exact: ``billable_fraction x length(period)``.
"""

from __future__ import annotations

from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import DateTimeRangeField, RangeOperators
from django.db import models
from django.db.models.functions import Coalesce


class LedgerEntry(models.Model):
    """An allocation of one GPU to one node. ``billable_fraction`` is 1 for a whole GPU."""

    tenant_path = "tenant"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="+")
    nodepool = models.ForeignKey("nodepools.NodePool", on_delete=models.PROTECT, related_name="+")
    node = models.ForeignKey("nodepools.Node", on_delete=models.PROTECT, related_name="+")
    host = models.ForeignKey("fleet.Host", on_delete=models.PROTECT, related_name="+")
    gpu_uuid = models.CharField(max_length=64)
    gpu_model = models.CharField(max_length=64, help_text="catalog slug")
    mig_profile = models.CharField(max_length=32, blank=True)
    mig_gpu_instance_id = models.IntegerField(null=True, blank=True)
    billable_fraction = models.DecimalField(max_digits=7, decimal_places=6)
    period = DateTimeRangeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            ExclusionConstraint(
                name="ledger_no_overlap_per_gpu",
                expressions=[
                    ("gpu_uuid", RangeOperators.EQUAL),
                    (Coalesce("mig_gpu_instance_id", models.Value(-1)), RangeOperators.EQUAL),
                    ("period", RangeOperators.OVERLAPS),
                ],
            ),
            models.CheckConstraint(
                condition=models.Q(billable_fraction__gt=0, billable_fraction__lte=1),
                name="ledger_fraction_in_0_1",
            ),
        ]
        indexes = [
            models.Index(fields=["cluster"]),
            models.Index(fields=["tenant"]),
            models.Index(fields=["node"]),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_uuid} x{self.billable_fraction} {self.period}"
