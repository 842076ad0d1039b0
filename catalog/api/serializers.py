"""Read-only serializers of the catalog API (shapes documented in the OpenAPI schema)."""

from __future__ import annotations

from datetime import date

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from catalog.models import (
    CudaDriverRequirement,
    DriverBranch,
    GpuModel,
    GpuSystem,
    KubernetesVersion,
    MigProfile,
    VgpuProfile,
    XidCode,
)
from catalog.services import runnable_kubernetes_minors


class MigProfileSerializer(serializers.ModelSerializer):
    """A MIG profile; ``placements`` in ``nvidia-smi mig -lgipp`` notation (``{0,2,4}:2``)."""

    placements = serializers.CharField(
        read_only=True, help_text="valid start memory slices and slices per instance, {0,2,4}:2"
    )

    class Meta:
        model = MigProfile
        fields = [
            "name",
            "aliases",
            "compute_slices",
            "memory_slices",
            "max_instances",
            "placements",
            "placements_verified",
            "memory_mib",
        ]
        read_only_fields = fields


class VgpuProfileSerializer(serializers.ModelSerializer):
    """A vGPU type: time-sliced (``framebuffer_mib``, ``max_per_gpu``) or MIG-backed
    (``mig_profile``: one vGPU per GPU instance of that profile)."""

    mig_profile = serializers.CharField(
        source="mig_profile.name", default=None, read_only=True, allow_null=True
    )

    class Meta:
        model = VgpuProfile
        fields = ["name", "series", "framebuffer_mib", "max_per_gpu", "mig_profile", "verified"]
        read_only_fields = fields


class GpuSystemSerializer(serializers.ModelSerializer):
    """A rack-scale system of the model: trays (NVKE hosts) and the NVLink domain size."""

    class Meta:
        model = GpuSystem
        fields = [
            "slug",
            "name",
            "compute_trays",
            "gpus_per_tray",
            "grace_cpus_per_tray",
            "nvlink_switch_trays",
            "nvlink_domain_gpus",
            "sources",
        ]
        read_only_fields = fields


class GpuModelSerializer(serializers.ModelSerializer):
    """A GPU model with its MIG profiles (empty for GPUs without MIG), vGPU types and the
    rack-scale systems it is built into (multi-node NVLink domains; empty for most)."""

    mig_profiles = MigProfileSerializer(many=True, read_only=True)
    vgpu_profiles = VgpuProfileSerializer(many=True, read_only=True)
    systems = GpuSystemSerializer(many=True, read_only=True)

    class Meta:
        model = GpuModel
        fields = [
            "slug",
            "name",
            "product_names",
            "architecture",
            "memory_mib",
            "mig_capable",
            "mig_compute_slices",
            "mig_memory_slices",
            "max_mig_instances",
            "placements_verified",
            "vgpu_mixed_size_mode",
            "mig_profiles",
            "vgpu_profiles",
            "systems",
        ]
        read_only_fields = fields


class KubernetesVersionSerializer(serializers.ModelSerializer):
    """A Kubernetes minor with its upstream dates; ``supported`` is computed for today (UTC);
    ``runnable``: supported, and this installation can create clusters of it (the provider
    of new clusters runs it: a ``hosted`` control plane only the minors NVKE builds binaries
    of). The context's ``runnable_minors`` (a set, or None for any) is read once a response."""

    supported = serializers.SerializerMethodField()
    runnable = serializers.SerializerMethodField()

    class Meta:
        model = KubernetesVersion
        fields = ["version", "released", "end_of_life", "supported", "runnable", "source"]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_supported(self, obj: KubernetesVersion) -> bool:
        today: date = self.context.get("today") or timezone.now().date()
        return obj.is_supported(today)

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_runnable(self, obj: KubernetesVersion) -> bool:
        if "runnable_minors" not in self.context:
            self.context["runnable_minors"] = runnable_kubernetes_minors()
        minors = self.context["runnable_minors"]
        return self.get_supported(obj) and (minors is None or obj.version in minors)


class DriverBranchSerializer(serializers.ModelSerializer):
    """A data-center driver branch and the GPU architectures it supports."""

    class Meta:
        model = DriverBranch
        fields = ["branch", "designation", "end_of_life", "max_cuda", "architectures", "notes"]
        read_only_fields = fields


class CudaDriverRequirementSerializer(serializers.ModelSerializer):
    """A CUDA toolkit release and the minimum Linux driver it needs."""

    class Meta:
        model = CudaDriverRequirement
        fields = ["label", "cuda_version", "update", "min_linux_driver", "family_min_driver"]
        read_only_fields = fields


class XidCodeSerializer(serializers.ModelSerializer):
    """An Xid code with NVKE's severity and the operator action."""

    class Meta:
        model = XidCode
        fields = [
            "code",
            "mnemonic",
            "description",
            "severity",
            "operator_action",
            "nvidia_immediate_action",
            "device_plugin_marks_unhealthy",
        ]
        read_only_fields = fields
