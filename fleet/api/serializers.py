"""Fleet API serializers (operator endpoints and the agent's registration)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet.choices import GpuInstanceState, HostState, HostTenancy
from fleet.models import Gpu, GpuHealthInterval, GpuScrub, Host, HostCheck, HostEvent
from fleet.nvlink_domains import host_domain
from nvke.validation import BoundedDateTimeField


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
            "nvlink_island",
            "health",
            "health_reason",
            "scrub_state",
            "missing_since",
            "held",
            "holder_id",
            "holder_tenant",
            "serial",
            "attributes",
            "health_counters",
        ]

    def get_held(self, gpu: Gpu) -> bool:
        return gpu.holder_id is not None


class NvlinkDomainSerializer(serializers.Serializer):
    """A host's multi-node NVLink domain (NVML GPU fabric info: cluster UUID + clique id)."""

    cluster_uuid = serializers.UUIDField()
    clique_id = serializers.IntegerField(min_value=0, max_value=2**32 - 1)
    label = serializers.CharField()


class HostSerializer(serializers.ModelSerializer):
    gpus = GpuSerializer(many=True, read_only=True)
    nvlink_domain = serializers.SerializerMethodField(
        help_text="multi-node NVLink domain: {cluster_uuid, clique_id, label} or null"
    )

    @extend_schema_field(NvlinkDomainSerializer(allow_null=True))
    def get_nvlink_domain(self, host: Host) -> dict | None:
        domain = host_domain(host)
        return domain.as_dict() if domain else None

    class Meta:
        model = Host
        fields = [
            "id",
            "hostname",
            "region",
            "zone",
            "rack",
            "state",
            "state_reason",
            "state_actor",
            "state_changed_at",
            "tenancy",
            "drain_target",
            "drain_nodes",
            "drain_force",
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
            "topology",
            "nvlink_domain",
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
    region = serializers.RegexField(
        r"^[a-z0-9]([-a-z0-9]{0,62}[a-z0-9])?$",
        max_length=64,
        required=False,
        default="",
        allow_blank=True,
        error_messages={"invalid": "region must be lower-case letters, digits and '-'"},
    )
    rack = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")
    nvidia_smi_xml = serializers.CharField(max_length=8 * 1024 * 1024, trim_whitespace=False)
    nvidia_smi_topo = serializers.CharField(
        max_length=256 * 1024,
        required=False,
        default="",
        allow_blank=True,
        trim_whitespace=False,
        help_text="output of `nvidia-smi topo -m` on the host (NVLink topology)",
    )
    nvlink_cluster_uuid = serializers.CharField(
        max_length=64,
        required=False,
        default="",
        allow_blank=True,
        help_text="multi-node NVLink domain (GB200 NVL72): the GPUs' fabric cluster UUID as "
        "NVML reports it (nvmlDeviceGetGpuFabricInfo clusterUuid); with nvlink_clique_id",
    )
    nvlink_clique_id = serializers.CharField(
        max_length=16,
        required=False,
        default="",
        allow_blank=True,
        help_text="the GPUs' fabric clique id (0 .. 4294967295); with nvlink_cluster_uuid",
    )


class HostCreatedSerializer(HostSerializer):
    bootstrap_token = serializers.CharField(read_only=True)

    class Meta(HostSerializer.Meta):
        fields = [*HostSerializer.Meta.fields, "bootstrap_token"]


class AgentRegisterSerializer(serializers.Serializer):
    bootstrap_token = serializers.CharField(max_length=200)
    hostname = serializers.CharField(max_length=253, required=False, allow_blank=True)
    agent_version = serializers.CharField(max_length=32, required=False, allow_blank=True)


class TenancySerializer(serializers.Serializer):
    """``{"tenancy": "dedicated" | "shared"}``."""

    tenancy = serializers.ChoiceField(choices=HostTenancy.choices)


class SliceMapInstanceSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    profile = serializers.CharField()
    start = serializers.IntegerField(help_text="first memory slice (catalog -lgipp placement)")
    size = serializers.IntegerField(help_text="memory slices")
    state = serializers.ChoiceField(choices=GpuInstanceState.choices)
    tenant_id = serializers.CharField(help_text="holder's tenant (while SCRUBBING: the last)")
    tenant = serializers.CharField()
    holder_id = serializers.CharField(help_text="the VM node holding it ('' when released)")
    gpu_instance_id = serializers.IntegerField(allow_null=True)
    released_at = serializers.DateTimeField(allow_null=True)


class SliceMapGpuSerializer(serializers.Serializer):
    gpu_uuid = serializers.CharField()
    index = serializers.IntegerField()
    memory_slices = serializers.IntegerField()
    instances = SliceMapInstanceSerializer(many=True)
    free = serializers.ListField(child=serializers.IntegerField(), help_text="free memory slices")


class CordonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class DrainSerializer(serializers.Serializer):
    target = serializers.ChoiceField(
        choices=[HostState.CORDONED, HostState.MAINTENANCE, HostState.RETIRED],
        required=False,
        default=HostState.CORDONED,
    )
    #: evict pods that block a node's drain (PodDisruptionBudgets at their minimum), as an
    #: upgrade's ``force``; without it a blocked drain waits and then reports the pods
    force = serializers.BooleanField(required=False, default=False)


class MarkHealthySerializer(serializers.Serializer):
    gpu_uuids = serializers.ListField(
        child=serializers.CharField(max_length=64),
        required=False,
        allow_null=True,
        default=None,
        max_length=64,  # fleet.formats.MAX_GPUS_PER_HOST
    )


class MarkHealthyResultSerializer(serializers.Serializer):
    marked_healthy = serializers.ListField(child=serializers.CharField())


class HostEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = HostEvent
        fields = ["id", "ts", "kind", "actor", "from_state", "to_state", "message", "data"]


class HostCheckSerializer(serializers.ModelSerializer):
    class Meta:
        model = HostCheck
        fields = ["id", "kind", "status", "source", "checked_at", "findings"]


class GpuScrubSerializer(serializers.ModelSerializer):
    gpu_uuid = serializers.CharField(source="gpu.uuid", read_only=True)

    class Meta:
        model = GpuScrub
        fields = [
            "id",
            "gpu_uuid",
            "status",
            "previous_tenant",
            "previous_holder_id",
            "mig_teardown",
            "requested_at",
            "sent_at",
            "completed_at",
            "executor",
            "steps",
        ]


class GpuHealthIntervalSerializer(serializers.ModelSerializer):
    class Meta:
        model = GpuHealthInterval
        fields = [
            "id",
            "gpu_uuid",
            "started_at",
            "ended_at",
            "reason",
            "xid",
            "action",
            "needs_operator",
            "detail",
            "holder_id",
            "tenant",
            "ended_by",
        ]


class TelemetryQuerySerializer(serializers.Serializer):
    resolution = serializers.ChoiceField(choices=["1m", "1h"], required=False, default="1m")
    start = BoundedDateTimeField(required=False)
    end = BoundedDateTimeField(required=False)


class TelemetryPointSerializer(serializers.Serializer):
    bucket = serializers.DateTimeField()
    gpu_uuid = serializers.CharField()
    mig_gpu_instance_id = serializers.IntegerField(allow_null=True)
    samples = serializers.IntegerField()
    utilization_gpu_pct = serializers.FloatField(allow_null=True)
    utilization_gpu_pct_max = serializers.FloatField(allow_null=True)
    memory_used_bytes = serializers.IntegerField(allow_null=True)
    memory_used_bytes_max = serializers.IntegerField(allow_null=True)
    memory_total_bytes = serializers.IntegerField(allow_null=True)
    power_mw = serializers.IntegerField(allow_null=True)
    power_mw_max = serializers.IntegerField(allow_null=True)
    energy_mj = serializers.IntegerField(allow_null=True)
    temperature_c_max = serializers.FloatField(allow_null=True)
    ecc_volatile_uncorrected_max = serializers.IntegerField(allow_null=True)


class FragmentationQuerySerializer(serializers.Serializer):
    gpu_model = serializers.CharField(required=False)
    zone = serializers.CharField(required=False)
