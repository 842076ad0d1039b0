"""Read-only catalog endpoints. Authentication and permissions are the project defaults
(any authenticated principal may read); the lists are small, so they are not paginated."""

from __future__ import annotations

from rest_framework import mixins, viewsets

from catalog.models import CudaDriverRequirement, DriverBranch, GpuModel, KubernetesVersion, XidCode

from .serializers import (
    CudaDriverRequirementSerializer,
    DriverBranchSerializer,
    GpuModelSerializer,
    KubernetesVersionSerializer,
    XidCodeSerializer,
)

#: catalog slugs: lower-case letters, digits and hyphens (``h200-sxm-141gb``)
SLUG_REGEX = r"[a-z0-9]+(?:-[a-z0-9]+)*"


class GpuModelViewSet(viewsets.ReadOnlyModelViewSet):
    """``GET gpu-models`` and ``GET gpu-models/{slug}``: GPU models with their MIG profiles."""

    queryset = GpuModel.objects.prefetch_related(
        "mig_profiles", "vgpu_profiles__mig_profile", "systems"
    )
    serializer_class = GpuModelSerializer
    lookup_field = "slug"
    lookup_value_regex = SLUG_REGEX
    pagination_class = None


class KubernetesVersionViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """``GET kubernetes-versions``: newest first, each with ``supported`` for today and
    ``runnable`` (supported, and the provider of new clusters runs it)."""

    queryset = KubernetesVersion.objects.all()
    serializer_class = KubernetesVersionSerializer
    pagination_class = None


class DriverBranchViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """``GET driver-branches``: newest first, with the architectures each supports."""

    queryset = DriverBranch.objects.all()
    serializer_class = DriverBranchSerializer
    pagination_class = None


class CudaDriverRequirementViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """``GET cuda-versions``: CUDA toolkit releases -> minimum Linux driver."""

    queryset = CudaDriverRequirement.objects.all()
    serializer_class = CudaDriverRequirementSerializer
    pagination_class = None


class XidCodeViewSet(viewsets.ReadOnlyModelViewSet):
    """``GET xid-codes`` and ``GET xid-codes/{code}``: severity and operator action."""

    queryset = XidCode.objects.all()
    serializer_class = XidCodeSerializer
    lookup_value_regex = r"[0-9]+"
    pagination_class = None
