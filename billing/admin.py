"""Admin: prices and accounts editable; ledger, usage and invoices read-only (raw data)."""

from __future__ import annotations

from django.contrib import admin

from .models import BillingAccount, Invoice, InvoiceLine, LedgerEntry, Price


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnly):
    list_display = [
        "id",
        "tenant",
        "gpu_uuid",
        "mig_gpu_instance_id",
        "billable_fraction",
        "period",
    ]
    list_filter = ["gpu_model"]
    search_fields = ["gpu_uuid"]


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    list_display = ["gpu_model", "mig_profile", "tenant", "currency", "hourly_rate", "effective"]
    list_filter = ["currency", "gpu_model"]


@admin.register(BillingAccount)
class BillingAccountAdmin(admin.ModelAdmin):
    list_display = ["tenant", "time_zone", "currency", "closed_through"]
    readonly_fields = ["closed_through"]


class LineInline(admin.TabularInline):
    model = InvoiceLine
    fk_name = "invoice"
    extra = 0
    can_delete = False
    readonly_fields = [f.name for f in InvoiceLine._meta.fields]


@admin.register(Invoice)
class InvoiceAdmin(ReadOnly):
    list_display = ["number", "tenant", "period_label", "status", "total", "currency"]
    list_filter = ["status", "period_label"]
    inlines = [LineInline]
