from django.urls import path

from .views import (
    ClusterUsageView,
    InvoiceFinalizeView,
    InvoiceViewSet,
    LedgerViewSet,
    UsageView,
    UtilizationView,
)

app_name = "billing"

urlpatterns = [
    path("clusters/<uuid:cluster_pk>/usage", ClusterUsageView.as_view(), name="cluster-usage"),
    path("usage", UsageView.as_view(), name="usage"),
    path("usage.csv", UsageView.as_view(csv=True), name="usage-csv"),
    path("ledger", LedgerViewSet.as_view({"get": "list"}), name="ledger-list"),
    path("ledger.csv", LedgerViewSet.as_view({"get": "list"}, csv=True), name="ledger-csv"),
    path("invoices", InvoiceViewSet.as_view({"get": "list"}), name="invoice-list"),
    path(
        "invoices.csv", InvoiceViewSet.as_view({"get": "list"}, csv=True), name="invoice-list-csv"
    ),
    path("invoices/<uuid:pk>", InvoiceViewSet.as_view({"get": "retrieve"}), name="invoice-detail"),
    path(
        "invoices/<uuid:pk>.csv",
        InvoiceViewSet.as_view({"get": "retrieve"}, csv=True),
        name="invoice-detail-csv",
    ),
    path("invoices/<uuid:pk>/finalize", InvoiceFinalizeView.as_view(), name="invoice-finalize"),
    path("utilization", UtilizationView.as_view(), name="utilization"),
]
