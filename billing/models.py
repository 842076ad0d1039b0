"""Billing data: the allocation ledger, accounts, prices, hourly usage, invoices (DESIGN §6).

* :class:`LedgerEntry` — who held which physical GPU (or MIG instance), when. One row per GPU (or
  GPU instance) and allocation, from the node's READY time to its release; ``period`` is a
  PostgreSQL ``tstzrange`` ``[start, end)``, an open upper bound meaning "still held".
* :class:`BillingAccount` — a tenant's billing time zone (IANA name) and currency.
* :class:`Price` — versioned hourly rates per GPU model and MIG profile, list or per tenant.
* :class:`UsageRecord` — billable GPU-seconds per tenant / cluster / pool / model / profile and
  bucket (one hour or less), computed in SQL from the ledger by :mod:`billing.aggregation`.
* :class:`Invoice` / :class:`InvoiceLine` — a tenant's monthly invoice, ``DRAFT -> FINALIZED``.
* SLA credits have no table here: they are read from the fleet's GPU health intervals
  (:mod:`billing.health`).

Money is :class:`~decimal.Decimal`: rates per GPU-hour, amounts rounded per line (half-even) to
the currency's minor unit (:mod:`billing.money`).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import (
    DateTimeRangeField,
    IntegerRangeField,
    RangeOperators,
)
from django.db import models
from django.db.models import Case, F, Func, Q, Value, When
from django.db.models.functions import Coalesce

from nvke.public_ids import public_id_field

#: ``Price.tenant`` is null for list prices; the exclusion constraint compares this instead.
LIST_PRICE_TENANT = uuid.UUID(int=0)


class Int4Range(Func):
    """``int4range(lower, upper)`` (PostgreSQL), ``[lower, upper)``; a null upper is unbounded."""

    function = "int4range"
    output_field = IntegerRangeField()


class LedgerEntry(models.Model):
    """An allocation of one physical GPU, or one MIG GPU instance of it, to one node.

    ``billable_fraction`` (0 < f <= 1, 6 decimals) is 1 for a whole GPU; a MIG GPU instance shared
    across tenants carries its profile's share (:func:`billing.fractions.mig_billable_fraction`).
    GPU-seconds are exact: ``billable_fraction x length(period)``.

    ``gpu_slots`` is derived by PostgreSQL: ``[0, inf)`` for a whole GPU, ``[gi+1, gi+2)`` for
    MIG GPU instance ``gi``. The exclusion constraint forbids two rows of one GPU whose slots and
    periods overlap: a GPU (or a GPU instance) is never held twice at the same instant, and a
    whole-GPU row never coexists with an instance row of that GPU. A row covers its allocation as
    one range (no gaps inside an allocation); the time between allocations is idle.
    """

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
    #: what tenants see as the row's ``id`` (:mod:`nvke.public_ids`)
    public_id = public_id_field()
    gpu_slots = models.GeneratedField(
        expression=Case(
            When(mig_gpu_instance_id__isnull=True, then=Int4Range(Value(0), Value(None))),
            default=Int4Range(F("mig_gpu_instance_id") + 1, F("mig_gpu_instance_id") + 2),
        ),
        output_field=IntegerRangeField(),
        db_persist=True,
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "ledger entries"
        constraints = [
            ExclusionConstraint(
                name="ledger_no_overlap_per_gpu_slot",
                expressions=[
                    ("gpu_uuid", RangeOperators.EQUAL),
                    ("gpu_slots", RangeOperators.OVERLAPS),
                    ("period", RangeOperators.OVERLAPS),
                ],
            ),
            models.CheckConstraint(
                condition=Q(billable_fraction__gt=0, billable_fraction__lte=1),
                name="ledger_fraction_in_0_1",
            ),
            models.CheckConstraint(
                condition=Q(period__isempty=False), name="ledger_period_not_empty"
            ),
        ]
        indexes = [
            models.Index(fields=["cluster"]),
            models.Index(fields=["tenant"]),
            models.Index(fields=["node"]),
            models.Index(fields=["host"]),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_uuid} x{self.billable_fraction} {self.period}"


class BillingAccount(models.Model):
    """A tenant's billing settings: ``time_zone`` (IANA, e.g. ``Europe/Berlin``) in which its
    days and months are counted, and ``currency`` (ISO 4217) of its prices and invoices.

    ``closed_through`` is the end (UTC) of the last FINALIZED invoice period: usage records
    before it are frozen, and later corrections to that time become adjustments on the next
    invoice. Created with defaults (UTC, USD) the first time billing needs it.
    """

    tenant_path = "tenant"

    tenant = models.OneToOneField(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="billing_account"
    )
    time_zone = models.CharField(max_length=64, default="UTC")
    currency = models.CharField(max_length=3, default="USD")
    closed_through = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.tenant_id} ({self.time_zone}, {self.currency})"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from .money import minor_unit
        from .periods import zone

        try:
            zone(self.time_zone)
            minor_unit(self.currency)
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc


class Price(models.Model):
    """An hourly rate per billable GPU-hour of one GPU model (and MIG profile), versioned.

    * ``tenant`` null: a list price; set: that tenant's override (a committed-use rate in
      ``hourly_rate``, or ``discount_pct`` off the list price in force at the same time).
    * ``mig_profile`` blank: whole GPUs (and the fallback for any profile of the model).
    * ``billable_fraction`` (MIG profile rows): the share of a GPU-hour one instance-hour of a
      slice shared across tenants bills; default by the catalog (compute slices / 7, or / 4 on
      A30).
    * ``effective`` ``[from, to)``: a change applies from its effective time only; versions of one
      (tenant, model, profile, currency) never overlap (exclusion constraint).
    """

    tenant_path = "tenant"

    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    gpu_model = models.ForeignKey("catalog.GpuModel", on_delete=models.PROTECT, related_name="+")
    mig_profile = models.CharField(max_length=32, blank=True)
    currency = models.CharField(max_length=3, default="USD")
    effective = DateTimeRangeField()
    hourly_rate = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    discount_pct = models.DecimalField(max_digits=5, decimal_places=2, null=True, blank=True)
    billable_fraction = models.DecimalField(max_digits=7, decimal_places=6, null=True, blank=True)
    #: per reserved GPU-hour of a capacity reservation of this model (whole GPUs; profile "");
    #: a tenant row without one takes the list's, less its ``discount_pct``
    reservation_hourly_rate = models.DecimalField(
        max_digits=14, decimal_places=6, null=True, blank=True
    )
    label = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["gpu_model", "mig_profile", "currency", "effective"]
        constraints = [
            ExclusionConstraint(
                name="price_versions_do_not_overlap",
                expressions=[
                    (
                        Coalesce(
                            F("tenant"), Value(LIST_PRICE_TENANT, output_field=models.UUIDField())
                        ),
                        RangeOperators.EQUAL,
                    ),
                    ("gpu_model", RangeOperators.EQUAL),
                    ("mig_profile", RangeOperators.EQUAL),
                    ("currency", RangeOperators.EQUAL),
                    ("effective", RangeOperators.OVERLAPS),
                ],
            ),
            models.CheckConstraint(
                condition=Q(hourly_rate__isnull=False, discount_pct__isnull=True)
                | Q(hourly_rate__isnull=True, discount_pct__isnull=False, tenant__isnull=False),
                name="price_rate_xor_tenant_discount",
            ),
            models.CheckConstraint(
                condition=Q(hourly_rate__isnull=True) | Q(hourly_rate__gte=0),
                name="price_rate_not_negative",
            ),
            models.CheckConstraint(
                condition=Q(discount_pct__isnull=True)
                | Q(discount_pct__gte=0, discount_pct__lte=100),
                name="price_discount_0_100",
            ),
            models.CheckConstraint(
                condition=Q(billable_fraction__isnull=True)
                | Q(billable_fraction__gt=0, billable_fraction__lte=1),
                name="price_fraction_in_0_1",
            ),
        ]

    def __str__(self) -> str:
        who = self.tenant_id or "list"
        what = self.hourly_rate if self.hourly_rate is not None else f"-{self.discount_pct}%"
        return f"{who} {self.gpu_model_id}/{self.mig_profile or '*'} {what} {self.currency}"


class UsageRecord(models.Model):
    """Billable usage of one (tenant, cluster, node pool, GPU model, MIG profile) in one bucket.

    A bucket ``[start, end)`` lies inside one UTC hour, one local day of the tenant's time zone
    and one price version (:func:`billing.periods.bucket_bounds`), so records never straddle a
    billing period or a price change. ``gpu_seconds`` = sum of ``billable_fraction x seconds``
    of the ledger rows in the bucket; ``allocated_seconds`` the same without the fraction
    (device-seconds: a GPU or MIG GPU instance held one second counts 1 whatever its
    fraction; the usage API's ``device_hours``, never called GPU-hours);
    ``sla_credit_gpu_seconds`` the part of ``gpu_seconds`` that falls into SLA-credited
    unhealthy time (:mod:`billing.health`). Written only by
    :func:`billing.aggregation.aggregate_usage` (delete + insert of a window: idempotent).
    """

    tenant_path = "tenant"

    # No single-column FK indexes: the unique key and (tenant, start) serve every query, and
    # each extra index slows the delete + insert of a re-aggregation.
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="+", db_index=False
    )
    cluster = models.ForeignKey(
        "clusters.Cluster", on_delete=models.PROTECT, related_name="+", db_index=False
    )
    nodepool = models.ForeignKey(
        "nodepools.NodePool", on_delete=models.PROTECT, related_name="+", db_index=False
    )
    gpu_model = models.CharField(max_length=64)
    mig_profile = models.CharField(max_length=32, blank=True)
    start = models.DateTimeField()
    end = models.DateTimeField()
    gpu_seconds = models.DecimalField(max_digits=30, decimal_places=12)
    allocated_seconds = models.DecimalField(max_digits=24, decimal_places=6)
    sla_credit_gpu_seconds = models.DecimalField(max_digits=30, decimal_places=12)
    computed_at = models.DateTimeField()

    class Meta:
        ordering = ["start", "cluster", "nodepool", "gpu_model", "mig_profile"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "cluster", "nodepool", "gpu_model", "mig_profile", "start"],
                name="usage_record_key_uniq",
            ),
            models.CheckConstraint(condition=Q(end__gt=F("start")), name="usage_bucket_not_empty"),
        ]
        indexes = [models.Index(fields=["tenant", "start"])]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.gpu_model}/{self.mig_profile or '-'} {self.start}"


class InvoiceStatus(models.TextChoices):
    DRAFT = "DRAFT"
    FINALIZED = "FINALIZED"


class Invoice(models.Model):
    """A tenant's invoice for one month of its time zone: ``[period_start, period_end)`` (UTC).

    ``DRAFT`` invoices are rebuilt from usage on every run; ``FINALIZED`` ones never change (a
    database trigger refuses updates of them and of their lines). ``total`` = sum of the lines'
    ``amount`` (each already rounded), in ``currency``.
    """

    tenant_path = "tenant"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    number = models.CharField(max_length=64, unique=True)
    period_label = models.CharField(max_length=7, help_text="YYYY-MM in the tenant's time zone")
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    time_zone = models.CharField(max_length=64)
    currency = models.CharField(max_length=3)
    status = models.CharField(
        max_length=16, choices=InvoiceStatus.choices, default=InvoiceStatus.DRAFT
    )
    usage_amount = models.DecimalField(max_digits=18, decimal_places=4, default=0)
    credit_amount = models.DecimalField(max_digits=18, decimal_places=4, default=0)
    adjustment_amount = models.DecimalField(max_digits=18, decimal_places=4, default=0)
    total = models.DecimalField(max_digits=18, decimal_places=4, default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    computed_at = models.DateTimeField(null=True, blank=True)
    finalized_at = models.DateTimeField(null=True, blank=True)
    #: why the latest rebuild of this DRAFT failed (its lines are stale; it cannot be
    #: finalized): ``{"code", "detail", "failed_at", "gpu_model", "currency", …}``; null once
    #: a rebuild succeeds (:func:`billing.invoices.build_invoice`)
    build_error = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-period_start", "tenant"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "period_start"], name="invoice_tenant_period")
        ]

    def __str__(self) -> str:
        return self.number

    @property
    def build_failed_at(self) -> datetime | None:
        """When the latest rebuild failed, or None (see ``build_error``)."""
        if not self.build_error or not self.build_error.get("failed_at"):
            return None
        return datetime.fromisoformat(self.build_error["failed_at"])

    @property
    def build_error_text(self) -> str:
        """What every tenant view of a stale draft says (the portal's invoice pages, the
        invoice CSVs; ``nvkectl invoices`` words the API's ``build_error`` alike), from
        ``build_error``: ``"Rebuild failed 2026-12-07 03:01 UTC: no EUR price for … (missing_price);
        the lines and total are stale (from the build of 2026-12-07 02:55 UTC)"``; "" when the
        latest build succeeded."""
        if not self.build_error:
            return ""
        failed = self.build_failed_at
        when = f" {failed.astimezone(UTC):%Y-%m-%d %H:%M} UTC" if failed else ""
        built = (
            f" (from the build of {self.computed_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC)"
            if self.computed_at
            else ""
        )
        return (
            f"Rebuild failed{when}: {self.build_error.get('detail', '')} "
            f"({self.build_error.get('code', '')}); the lines and total are stale{built}"
        )


class LineKind(models.TextChoices):
    USAGE = "USAGE"
    SLA_CREDIT = "SLA_CREDIT"
    RESERVATION = "RESERVATION"


class InvoiceLine(models.Model):
    """One line: GPU-hours of one cluster / pool / model / profile at one unit price.

    ``kind`` USAGE (positive) or SLA_CREDIT (negative: unhealthy time not billed, its own line).
    ``adjusts`` is set on adjustment lines: corrections to an earlier, FINALIZED invoice (late
    ledger changes or late Xids), with the difference in ``gpu_seconds`` and ``amount``.
    ``amount = round_half_even(gpu_seconds x unit_price / 3600, currency minor unit)``;
    ``gpu_hours`` is ``gpu_seconds / 3600`` rounded to 6 places, for display.
    ``details`` (credit lines): ``[{gpu_uuid, xid, scope, start, end, gpu_seconds}]``.
    RESERVATION lines (no cluster / pool): reserved GPU-seconds of one reservation at its
    reservation rate; ``details`` ``[{reservation_id, start, end, gpus,
    covered_gpu_seconds}]`` (its pools' usage inside it, not billed again on USAGE lines).
    """

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=LineKind.choices)
    adjusts = models.ForeignKey(
        Invoice, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    cluster = models.ForeignKey(
        "clusters.Cluster", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    nodepool = models.ForeignKey(
        "nodepools.NodePool", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    reservation = models.ForeignKey(
        "reservations.Reservation",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )
    gpu_model = models.CharField(max_length=64)
    mig_profile = models.CharField(max_length=32, blank=True)
    unit_price = models.DecimalField(max_digits=20, decimal_places=10)
    gpu_seconds = models.DecimalField(max_digits=30, decimal_places=12)
    gpu_hours = models.DecimalField(max_digits=20, decimal_places=6)
    amount = models.DecimalField(max_digits=18, decimal_places=4)
    description = models.CharField(max_length=300)
    details = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["invoice", "position"]
        constraints = [
            models.UniqueConstraint(fields=["invoice", "position"], name="invoiceline_position")
        ]

    def __str__(self) -> str:
        return f"{self.invoice_id}#{self.position} {self.amount}"
