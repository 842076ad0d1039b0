from django.urls import path

import nvke.converters  # noqa: F401  (registers <username:…>)
from nvke.routers import OptionalSlashRouter

from .views import (
    ApiKeyRevokeView,
    AuditEventListView,
    MemberDetailView,
    MemberListView,
    OperatorKeyViewSet,
    QuotaDetailView,
    QuotaListView,
    TenantViewSet,
)

app_name = "tenants"

router = OptionalSlashRouter()
router.register("tenants", TenantViewSet, basename="tenant")
router.register("operator-keys", OperatorKeyViewSet, basename="operator-key")

urlpatterns = [
    path(
        "tenants/<uuid:tenant_pk>/api-keys/<slug:prefix>",
        ApiKeyRevokeView.as_view(),
        name="tenant-api-key-detail",
    ),
    path("tenants/<uuid:tenant_pk>/members", MemberListView.as_view(), name="member-list"),
    path(
        "tenants/<uuid:tenant_pk>/members/<username:username>",
        MemberDetailView.as_view(),
        name="member-detail",
    ),
    path("quotas", QuotaListView.as_view(), name="quota-list"),
    path("quotas/<uuid:tenant_pk>", QuotaDetailView.as_view(), name="quota-detail"),
    path("audit-events", AuditEventListView.as_view(), name="audit-event-list"),
    *router.urls,
]
