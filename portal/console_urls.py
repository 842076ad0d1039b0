"""Operator console URLs, mounted at ``/console/``."""

from django.urls import path

from .views import console, console_defrag, console_health_rules

app_name = "console"

urlpatterns = [
    path("", console.overview, name="overview"),
    path("hosts", console.host_list, name="hosts"),
    path("hosts/<uuid:host_id>", console.host_detail, name="host"),
    path("hosts/<uuid:host_id>/confirm/<str:action>", console.host_confirm, name="host-confirm"),
    path("hosts/<uuid:host_id>/<str:action>", console.host_action, name="host-action"),
    path("defrag", console_defrag.defrag_page, name="defrag"),
    path("defrag/runs", console_defrag.defrag_start, name="defrag-start"),
    path("defrag/runs/<uuid:run_id>", console_defrag.defrag_run, name="defrag-run"),
    path("xids", console.xid_list, name="xids"),
    path("health-rules", console_health_rules.health_rules_page, name="health-rules"),
    path("health-rules/save", console_health_rules.health_rule_save, name="health-rule-save"),
    path(
        "health-rules/<str:key>/restore",
        console_health_rules.health_rule_restore,
        name="health-rule-restore",
    ),
    path("breakers/<str:scope>/resume", console_health_rules.breaker_resume, name="breaker-resume"),
    path("control-planes", console.control_plane_list, name="control-planes"),
    path("tenants", console.tenant_list, name="tenants"),
    path("tenants/<uuid:tenant_id>", console.tenant_detail, name="tenant"),
    path("prices", console.price_list, name="prices"),
    path("invoices", console.invoice_list, name="invoices"),
    path("invoices/build", console.invoices_build, name="invoices-build"),
    path("invoices/<uuid:invoice_id>/finalize", console.invoice_finalize, name="invoice-finalize"),
]
