"""Fleet API serializers (operator endpoints and the agent's registration)."""

from __future__ import annotations

from rest_framework import serializers

from fleet.models import Gpu, Host


class GpuSerializer(serializers.ModelSerializer):
    held = serializers.SerializerMethodField()

    class Meta:
        model = Gpu
        fields = [
            "uuid",
            "index",
            "pci_bus_id",
            "minor_number",
            "gpu_model",
            "product_name",
            "memory_total_bytes",
            "mig_mode",
            "mig_devices",
            "health",
            "held",
            "holder_id",
            "holder_tenant",
        ]

    def get_held(self, gpu: Gpu) -> bool:
        return gpu.holder_id is not None


class HostSerializer(serializers.ModelSerializer):
    gpus = GpuSerializer(many=True, read_only=True)

    class Meta:
        model = Host
        fields = [
            "id",
            "hostname",
            "zone",
            "rack",
            "state",
            "gpu_model",
            "gpu_count",
            "driver_version",
            "cuda_version",
            "agent_version",
            "warnings",
            "registered_at",
            "last_seen_at",
            "last_report_seq",
            "created_at",
            "gpus",
        ]


class HostImportSerializer(serializers.Serializer):
    hostname = serializers.RegexField(
        r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
        max_length=253,
        error_messages={"invalid": "hostname must be a lower-case DNS name"},
    )
    zone = serializers.RegexField(
        r"^[a-z0-9]([-a-z0-9]{0,62}[a-z0-9])?$",
        max_length=64,
        error_messages={"invalid": "zone must be lower-case letters, digits and '-'"},
    )
    rack = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")
    nvidia_smi_xml = serializers.CharField(max_length=8 * 1024 * 1024, trim_whitespace=False)


class HostCreatedSerializer(HostSerializer):
    bootstrap_token = serializers.CharField(read_only=True)

    class Meta(HostSerializer.Meta):
        fields = [*HostSerializer.Meta.fields, "bootstrap_token"]


class AgentRegisterSerializer(serializers.Serializer):
    bootstrap_token = serializers.CharField(max_length=200)
    hostname = serializers.CharField(max_length=253, required=False, allow_blank=True)
    agent_version = serializers.CharField(max_length=32, required=False, allow_blank=True)
