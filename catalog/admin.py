"""Admin for the catalog: operators may correct or add rows (``load_catalog`` re-applies the
data files on top; see catalog/data/README.md)."""

from __future__ import annotations

from django.contrib import admin

from .models import (
    CudaDriverRequirement,
    DriverBranch,
    DriverRule,
    GpuArchitecture,
    GpuModel,
    GpuSystem,
    KubernetesVersion,
    MigProfile,
    VgpuProfile,
    XidCode,
)


class MigProfileInline(admin.TabularInline):
    model = MigProfile
    extra = 0
    fields = [
        "name",
        "aliases",
        "compute_slices",
        "memory_slices",
        "max_instances",
        "placement_starts",
        "placement_size",
        "placements_verified",
        "memory_mib",
    ]


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    list_display = [
        "slug",
        "name",
        "architecture",
        "memory_mib",
        "mig_capable",
        "placements_verified",
    ]
    list_filter = ["architecture", "mig_capable"]
    search_fields = ["slug", "name", "product_names"]
    inlines = [MigProfileInline]


@admin.register(MigProfile)
class MigProfileAdmin(admin.ModelAdmin):
    list_display = [
        "gpu_model",
        "name",
        "compute_slices",
        "memory_slices",
        "max_instances",
        "placements",
        "placements_verified",
    ]
    list_filter = ["gpu_model", "placements_verified"]
    search_fields = ["name", "aliases"]


@admin.register(KubernetesVersion)
class KubernetesVersionAdmin(admin.ModelAdmin):
    list_display = ["version", "released", "end_of_life"]


@admin.register(GpuArchitecture)
class GpuArchitectureAdmin(admin.ModelAdmin):
    list_display = ["name", "compute_capabilities", "min_driver", "last_driver_branch"]


@admin.register(DriverBranch)
class DriverBranchAdmin(admin.ModelAdmin):
    list_display = ["branch", "designation", "end_of_life", "architectures"]


@admin.register(CudaDriverRequirement)
class CudaDriverRequirementAdmin(admin.ModelAdmin):
    list_display = ["label", "cuda_version", "update", "min_linux_driver", "family_min_driver"]


@admin.register(XidCode)
class XidCodeAdmin(admin.ModelAdmin):
    list_display = ["code", "mnemonic", "severity", "device_plugin_marks_unhealthy"]
    list_filter = ["severity"]
    search_fields = ["mnemonic", "description"]


@admin.register(VgpuProfile)
class VgpuProfileAdmin(admin.ModelAdmin):
    list_display = ["gpu_model", "name", "series", "framebuffer_mib", "max_per_gpu", "mig_profile"]
    list_filter = ["gpu_model", "verified"]
    search_fields = ["name"]


@admin.register(DriverRule)
class DriverRuleAdmin(admin.ModelAdmin):
    list_display = ["key", "kind", "gpu_model", "min_driver", "min_branch"]
    list_filter = ["kind"]


@admin.register(GpuSystem)
class GpuSystemAdmin(admin.ModelAdmin):
    list_display = [
        "slug",
        "gpu_model",
        "compute_trays",
        "gpus_per_tray",
        "nvlink_domain_gpus",
    ]
