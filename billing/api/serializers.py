"""Serializers of ledger rows, invoices and invoice lines (Decimals as exact strings)."""

from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from billing.models import Invoice, InvoiceLine, LedgerEntry
from billing.money import format_rate, round_money


def money(value: Decimal, currency: str) -> str:
    """``value`` with exactly the currency's minor digits: ``60.00``, ``6000``, ``1.250``."""
    return f"{round_money(value, currency):f}"


class LedgerEntrySerializer(serializers.ModelSerializer):
    """A ledger row; ``start``/``end`` are the bounds of ``[start, end)`` (``end`` null = held).
    ``id`` is the row's public UUID, never the serial (:mod:`nvke.public_ids`)."""

    id = serializers.UUIDField(source="public_id", read_only=True)
    start = serializers.SerializerMethodField()
    end = serializers.SerializerMethodField()
    billable_fraction = serializers.DecimalField(
        max_digits=7, decimal_places=6, coerce_to_string=True
    )

    class Meta:
        model = LedgerEntry
        fields = [
            "id",
            "tenant",
            "cluster",
            "nodepool",
            "node",
            "host",
            "gpu_uuid",
            "gpu_model",
            "mig_profile",
            "mig_gpu_instance_id",
            "billable_fraction",
            "start",
            "end",
        ]

    def get_start(self, obj) -> str:
        return obj.period.lower.isoformat()

    def get_end(self, obj) -> str | None:
        return obj.period.upper.isoformat() if obj.period.upper else None


class InvoiceSerializer(serializers.ModelSerializer):
    usage_amount = serializers.SerializerMethodField()
    credit_amount = serializers.SerializerMethodField()
    adjustment_amount = serializers.SerializerMethodField()
    total = serializers.SerializerMethodField()

    class Meta:
        model = Invoice
        fields = [
            "id",
            "number",
            "tenant",
            "period_label",
            "period_start",
            "period_end",
            "time_zone",
            "currency",
            "status",
            "usage_amount",
            "credit_amount",
            "adjustment_amount",
            "total",
            "computed_at",
            "finalized_at",
            "build_error",
        ]
        extra_kwargs = {
            "build_error": {
                "help_text": "why the latest rebuild of this DRAFT failed (its lines are stale "
                "and it cannot be finalized): {code, detail, failed_at, gpu_model, currency, "
                "...}; null when the latest build succeeded"
            }
        }

    def get_usage_amount(self, obj) -> str:
        return money(obj.usage_amount, obj.currency)

    def get_credit_amount(self, obj) -> str:
        return money(obj.credit_amount, obj.currency)

    def get_adjustment_amount(self, obj) -> str:
        return money(obj.adjustment_amount, obj.currency)

    def get_total(self, obj) -> str:
        return money(obj.total, obj.currency)


class InvoiceLineSerializer(serializers.ModelSerializer):
    unit_price = serializers.SerializerMethodField()
    gpu_seconds = serializers.SerializerMethodField()
    gpu_hours = serializers.SerializerMethodField()
    amount = serializers.SerializerMethodField()
    adjusts = serializers.SerializerMethodField()

    class Meta:
        model = InvoiceLine
        fields = [
            "position",
            "kind",
            "adjusts",
            "cluster",
            "nodepool",
            "gpu_model",
            "mig_profile",
            "gpu_hours",
            "gpu_seconds",
            "unit_price",
            "amount",
            "description",
            "details",
        ]

    def get_unit_price(self, obj) -> str:
        return format_rate(obj.unit_price, obj.invoice.currency)

    def get_gpu_seconds(self, obj) -> str:
        return f"{obj.gpu_seconds.normalize():f}"

    def get_gpu_hours(self, obj) -> str:
        return f"{obj.gpu_hours:f}"

    def get_amount(self, obj) -> str:
        return money(obj.amount, obj.invoice.currency)

    def get_adjusts(self, obj) -> dict | None:
        if obj.adjusts_id is None:
            return None
        return {"id": str(obj.adjusts_id), "number": obj.adjusts.number}


class InvoiceDetailSerializer(InvoiceSerializer):
    lines = InvoiceLineSerializer(many=True, read_only=True)

    class Meta(InvoiceSerializer.Meta):
        fields = [*InvoiceSerializer.Meta.fields, "lines"]


LEDGER_CSV_FIELDS = [
    "id",
    "tenant_id",
    "cluster_id",
    "nodepool_id",
    "node_id",
    "host_id",
    "gpu_uuid",
    "gpu_model",
    "mig_profile",
    "mig_gpu_instance_id",
    "billable_fraction",
    "start",
    "end",
]


def ledger_csv_row(e: LedgerEntry) -> list:
    return [
        e.public_id,
        e.tenant_id,
        e.cluster_id,
        e.nodepool_id,
        e.node_id,
        e.host_id,
        e.gpu_uuid,
        e.gpu_model,
        e.mig_profile,
        e.mig_gpu_instance_id,
        e.billable_fraction,
        e.period.lower,
        e.period.upper,
    ]


INVOICE_CSV_FIELDS = [
    "number",
    "tenant_id",
    "period_label",
    "period_start",
    "period_end",
    "time_zone",
    "currency",
    "status",
    "usage_amount",
    "credit_amount",
    "adjustment_amount",
    "total",
    "build_error",
]


def invoice_csv_row(i: Invoice) -> list:
    """One invoice as a CSV row; ``build_error``: why its latest rebuild failed (its lines and
    total are stale, :attr:`Invoice.build_error_text`), "" when it did not."""
    return [
        i.number,
        i.tenant_id,
        i.period_label,
        i.period_start,
        i.period_end,
        i.time_zone,
        i.currency,
        i.status,
        money(i.usage_amount, i.currency),
        money(i.credit_amount, i.currency),
        money(i.adjustment_amount, i.currency),
        money(i.total, i.currency),
        i.build_error_text,
    ]


LINE_CSV_FIELDS = [
    "invoice",
    "position",
    "kind",
    "adjusts",
    "cluster_id",
    "nodepool_id",
    "gpu_model",
    "mig_profile",
    "gpu_hours",
    "gpu_seconds",
    "unit_price",
    "currency",
    "amount",
    "description",
    "invoice_build_error",
]


def line_csv_row(invoice: Invoice, ln: InvoiceLine) -> list:
    """One line as a CSV row; ``invoice_build_error``: the invoice's
    :attr:`Invoice.build_error_text` (the line is stale), "" when its latest build succeeded."""
    return [
        invoice.number,
        ln.position,
        ln.kind,
        ln.adjusts.number if ln.adjusts_id else "",
        ln.cluster_id,
        ln.nodepool_id,
        ln.gpu_model,
        ln.mig_profile,
        ln.gpu_hours,
        ln.gpu_seconds.normalize(),
        format_rate(ln.unit_price, invoice.currency),
        invoice.currency,
        money(ln.amount, invoice.currency),
        ln.description,
        invoice.build_error_text,
    ]
