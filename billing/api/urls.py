from django.urls import path

from .views import (
    ClusterUsageView,
    InvoiceCsvViewSet,
    InvoiceFinalizeView,
    InvoiceViewSet,
    LedgerCsvViewSet,
    LedgerViewSet,
    UsageCsvView,
    UsageView,
    UtilizationView,
)

app_name = "billing"

urlpatterns = [
    path("clusters/<uuid:cluster_pk>/usage", ClusterUsageView.as_view(), name="cluster-usage"),
    path("usage", UsageView.as_view(), name="usage"),
    path("usage.csv", UsageCsvView.as_view(), name="usage-csv"),
    path("ledger", LedgerViewSet.as_view({"get": "list"}), name="ledger-list"),
    path("ledger.csv", LedgerCsvViewSet.as_view({"get": "list"}), name="ledger-csv"),
    path("invoices", InvoiceViewSet.as_view({"get": "list"}), name="invoice-list"),
    path("invoices.csv", InvoiceCsvViewSet.as_view({"get": "list"}), name="invoice-list-csv"),
    path("invoices/<uuid:pk>", InvoiceViewSet.as_view({"get": "retrieve"}), name="invoice-detail"),
    path(
        "invoices/<uuid:pk>.csv",
        InvoiceCsvViewSet.as_view({"get": "retrieve"}),
        name="invoice-detail-csv",
    ),
    path("invoices/<uuid:pk>/finalize", InvoiceFinalizeView.as_view(), name="invoice-finalize"),
    path("utilization", UtilizationView.as_view(), name="utilization"),
]
