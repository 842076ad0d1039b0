"""Catalog routes, included by the root URLconf under ``/api/v1/catalog/`` (namespace
``catalog``): ``catalog:gpu-model-list``, ``catalog:gpu-model-detail``,
``catalog:kubernetes-version-list``, ``catalog:driver-branch-list``, ``catalog:cuda-version-list``,
``catalog:xid-code-list``, ``catalog:xid-code-detail``."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from .views import (
    CudaDriverRequirementViewSet,
    DriverBranchViewSet,
    GpuModelViewSet,
    KubernetesVersionViewSet,
    XidCodeViewSet,
)

app_name = "catalog"

router = SimpleRouter(trailing_slash=False)
router.register("gpu-models", GpuModelViewSet, basename="gpu-model")
router.register("kubernetes-versions", KubernetesVersionViewSet, basename="kubernetes-version")
router.register("driver-branches", DriverBranchViewSet, basename="driver-branch")
router.register("cuda-versions", CudaDriverRequirementViewSet, basename="cuda-version")
router.register("xid-codes", XidCodeViewSet, basename="xid-code")

urlpatterns = router.urls
