"""How much of a GPU-hour one allocation bills (DESIGN §6).

* A node pool that owns whole GPUs bills 1.0 per GPU per hour, whatever it does inside them
  (exclusive, MIG for itself, time-slicing, MPS: one tenant holds the whole GPU).
* A MIG instance of a GPU shared across tenants bills the share its price sheet gives its profile
  (``Price.billable_fraction`` of the list price in force), by default the catalog's compute
  slices of the profile / compute slices of the GPU (7 on A100/H100/H200, 4 on A30), rounded
  half-even to 6 places: 1g -> 0.142857, 2g -> 0.285714, 3g -> 0.428571, 4g -> 0.571429,
  7g -> 1. Never derived from the GiB figure in the profile's name.

For every physical GPU and every hour the rows' fractions plus idle add up to exactly 1.0
GPU-hour: idle is the complement, and the ledger's exclusion constraint keeps instances from
overlapping whole-GPU rows or each other (:func:`billing.reports.gpu_hour_accounting`).
"""

from __future__ import annotations

from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from catalog.models import GpuModel
from catalog.services import resolve_mig_profile

WHOLE_GPU = Decimal("1")
FRACTION_PLACES = Decimal("0.000001")

#: How a node pool says its GPUs are shared across tenants (hardware-isolated MIG/vGPU only):
#: ``isolation["tenancy"] == "shared"`` (nodepools.isolation; the default is "dedicated").
#: ``isolation["sharing"] == "cross-tenant"`` is accepted as the same thing.
CROSS_TENANT = "cross-tenant"


def pool_shares_gpus_across_tenants(isolation: dict[str, Any]) -> bool:
    """True when the pool's isolation puts several tenants on one physical GPU."""
    shared = isolation.get("tenancy") == "shared" or isolation.get("sharing") == CROSS_TENANT
    return shared and isolation.get("mode") in ("mig", "vgpu")


def catalog_fraction(gpu_model: GpuModel, mig_profile: str) -> Decimal:
    """Compute slices of the profile / compute slices of the GPU (catalog), 6 places."""
    profile = resolve_mig_profile(gpu_model, mig_profile)
    total = gpu_model.mig_compute_slices or max(
        gpu_model.mig_profiles.values_list("compute_slices", flat=True)
    )
    return (Decimal(profile.compute_slices) / Decimal(total)).quantize(
        FRACTION_PLACES, rounding=ROUND_HALF_EVEN
    )


def mig_billable_fraction(gpu_model: str, mig_profile: str, at: datetime) -> Decimal:
    """The share of a GPU-hour one hour of a shared ``mig_profile`` GPU instance bills at ``at``.

    The list price row of (model, profile) in force at ``at`` decides when it sets
    ``billable_fraction``; otherwise the catalog (:func:`catalog_fraction`). Raises the
    catalog's errors for an unknown model or profile.
    """
    from .models import Price

    row = (
        Price.objects.filter(
            tenant__isnull=True,
            gpu_model_id=gpu_model,
            mig_profile=mig_profile,
            effective__contains=at,
            billable_fraction__isnull=False,
        )
        .order_by("currency")
        .first()
    )
    if row is not None:
        return row.billable_fraction
    return catalog_fraction(GpuModel.objects.get(slug=gpu_model), mig_profile)
