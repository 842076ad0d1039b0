"""The read-only catalog API without the auth layer (route-walking tests with principals
belong to the tenants/auth tests): routes, serialized shapes and the OpenAPI schema."""

from __future__ import annotations

from datetime import date

import pytest
from django.urls import resolve, reverse
from drf_spectacular.generators import SchemaGenerator
from rest_framework.settings import api_settings

from catalog.api.serializers import GpuModelSerializer, KubernetesVersionSerializer
from catalog.api.views import GpuModelViewSet, KubernetesVersionViewSet
from catalog.models import KubernetesVersion


def test_routes_are_namespaced_and_route_slugs():
    assert reverse("catalog:gpu-model-list") == "/api/v1/catalog/gpu-models"
    assert (
        reverse("catalog:gpu-model-detail", kwargs={"slug": "h200-sxm-141gb"})
        == "/api/v1/catalog/gpu-models/h200-sxm-141gb"
    )
    assert reverse("catalog:kubernetes-version-list") == "/api/v1/catalog/kubernetes-versions"
    match = resolve("/api/v1/catalog/gpu-models/a100-sxm4-80gb")
    assert match.view_name == "catalog:gpu-model-detail"
    assert match.kwargs == {"slug": "a100-sxm4-80gb"}


def test_views_keep_the_project_auth_defaults_and_do_not_paginate():
    for view in (GpuModelViewSet, KubernetesVersionViewSet):
        assert "authentication_classes" not in vars(view)
        assert "permission_classes" not in vars(view)
        assert view.pagination_class is None
        assert view.permission_classes == api_settings.DEFAULT_PERMISSION_CLASSES


@pytest.mark.django_db
def test_gpu_model_shape(loaded):
    model = GpuModelViewSet.queryset.get(slug="h100-nvl-94gb")
    data = GpuModelSerializer(model).data
    assert {k: v for k, v in data.items() if k not in ("mig_profiles", "vgpu_profiles")} == {
        "slug": "h100-nvl-94gb",
        "name": "H100-NVL-94GB",
        "product_names": ["NVIDIA H100 NVL"],
        "architecture": "hopper",
        "memory_mib": 95830,
        "mig_capable": True,
        "mig_compute_slices": 7,
        "mig_memory_slices": 8,
        "max_mig_instances": 7,
        "placements_verified": True,
        "vgpu_mixed_size_mode": None,
        "systems": [],
    }
    assert data["vgpu_profiles"] == []  # no sourced vGPU types for the H100 NVL yet
    assert [p["name"] for p in data["mig_profiles"]] == [
        "1g.12gb",
        "1g.12gb+me",
        "1g.24gb",
        "2g.24gb",
        "3g.47gb",
        "4g.47gb",
        "7g.94gb",
    ]
    assert data["mig_profiles"][2] == {
        "name": "1g.24gb",
        "aliases": [],
        "compute_slices": 1,
        "memory_slices": 2,
        "max_instances": 4,
        "placements": "{0,2,4,6}:2",
        "placements_verified": True,
        "memory_mib": 22144,
    }


@pytest.mark.django_db
def test_a_gpu_without_mig_has_no_profiles(loaded):
    data = GpuModelSerializer(GpuModelViewSet.queryset.get(slug="t4")).data
    assert data["mig_capable"] is False
    assert data["mig_profiles"] == []
    assert data["mig_compute_slices"] is None
    assert data["product_names"] == ["Tesla T4"]
    # NVIDIA's Turing vGPU table: T4-16C/8C/4C, 1/2/4 per GPU, no mixed-size mode
    assert data["vgpu_mixed_size_mode"] is False
    assert [(p["name"], p["framebuffer_mib"], p["max_per_gpu"]) for p in data["vgpu_profiles"]] == [
        ("T4-16C", 16384, 1),
        ("T4-8C", 8192, 2),
        ("T4-4C", 4096, 4),
    ]


@pytest.mark.django_db
def test_mig_backed_vgpu_types_name_their_mig_profile(loaded):
    data = GpuModelSerializer(GpuModelViewSet.queryset.get(slug="h200-nvl-141gb")).data
    backed = {p["name"]: p["mig_profile"] for p in data["vgpu_profiles"] if p["mig_profile"]}
    assert backed["H200-1-18CME"] == "1g.18gb+me"
    assert backed["H200-7-141C"] == "7g.141gb"
    assert len(backed) == 7
    assert all(p["verified"] is False for p in data["vgpu_profiles"])


@pytest.mark.django_db
def test_driver_and_xid_lists(loaded):
    from catalog.api.serializers import DriverBranchSerializer, XidCodeSerializer
    from catalog.models import DriverBranch, XidCode

    branches = {
        b["branch"]: b for b in DriverBranchSerializer(DriverBranch.objects.all(), many=True).data
    }
    assert "volta" in branches["R580"]["architectures"]  # last branch for Volta
    assert "volta" not in branches["R595"]["architectures"]
    assert "hopper" not in branches["R470"]["architectures"]  # Hopper needs >= 520.61.05
    xid = XidCodeSerializer(XidCode.objects.get(code=79)).data
    assert xid["severity"] == "critical"


@pytest.mark.django_db
def test_kubernetes_versions_say_whether_they_are_supported(loaded):
    rows = KubernetesVersion.objects.all()
    data = KubernetesVersionSerializer(rows, many=True, context={"today": date(2026, 11, 29)}).data
    assert [(row["version"], row["supported"]) for row in data] == [
        ("1.37", True),
        ("1.36", True),
        ("1.35", True),
        ("1.34", False),
        ("1.33", False),
        ("1.32", False),
        ("1.31", False),
    ]
    assert data[0]["released"] == "2026-08-26" and data[0]["end_of_life"] == "2027-10-28"


def test_openapi_schema_describes_the_catalog_endpoints():
    from catalog.api.urls import urlpatterns

    schema = SchemaGenerator(patterns=urlpatterns).get_schema(request=None, public=True)
    assert set(schema["paths"]) == {
        "/gpu-models",
        "/gpu-models/{slug}",
        "/kubernetes-versions",
        "/driver-branches",
        "/cuda-versions",
        "/xid-codes",
        "/xid-codes/{code}",
    }
    version = schema["components"]["schemas"]["KubernetesVersion"]
    assert version["properties"]["supported"]["type"] == "boolean"
    profile = schema["components"]["schemas"]["MigProfile"]
    assert profile["properties"]["placements"]["type"] == "string"


def test_every_catalog_model_is_in_the_admin():
    from django.apps import apps
    from django.contrib import admin

    for model in apps.get_app_config("catalog").get_models():
        assert admin.site.is_registered(model), model.__name__
