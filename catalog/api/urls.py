"""Catalog routes, included by the root URLconf under ``/api/v1/catalog/`` (namespace
``catalog``): ``catalog:gpu-model-list``, ``catalog:gpu-model-detail``,
``catalog:kubernetes-version-list``."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from .views import GpuModelViewSet, KubernetesVersionViewSet

app_name = "catalog"

router = SimpleRouter(trailing_slash=False)
router.register("gpu-models", GpuModelViewSet, basename="gpu-model")
router.register("kubernetes-versions", KubernetesVersionViewSet, basename="kubernetes-version")

urlpatterns = router.urls
