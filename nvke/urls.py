"""Root URLconf: probes, API v1 (+ OpenAPI schema and docs UI served locally), admin."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.permissions import AllowAny

from nvke.api_root import api_root
from nvke.health import healthz, readyz
from nvke.metrics import metrics_view

api_v1 = [
    path("", api_root, name="api-root"),
    path("", include("tenants.api.urls")),
    path("catalog/", include("catalog.api.urls")),
    path("", include("fleet.api.urls")),
    path("", include("reservations.api.urls")),
    path("", include("clusters.api.urls")),
    path("", include("nodepools.api.urls")),
    path("", include("billing.api.urls")),
    path("", include("webhooks.api.urls")),
    path(
        "schema/",
        SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[AllowAny]),
        name="schema",
    ),
    path(
        "docs/",
        # the split view serves Swagger UI's start-up script as a file: no inline script, so
        # the page works under the Content-Security-Policy
        SpectacularSwaggerSplitView.as_view(
            url_name="schema", authentication_classes=[], permission_classes=[AllowAny]
        ),
        name="docs",
    ),
]

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    path("api/v1/", include(api_v1)),
    path("admin/", admin.site.urls),
    path("console/", include("portal.console_urls")),
    path("", include("portal.urls")),
]

handler400 = "nvke.http.bad_request"
handler403 = "nvke.http.permission_denied"
handler404 = "nvke.http.not_found"
handler500 = "nvke.http.server_error"
