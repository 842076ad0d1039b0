"""Node pool and node serializers."""

from __future__ import annotations

from rest_framework import serializers

from nodepools.choices import GpuPublishing
from nodepools.host_drivers import DRIVER_PIN_HELP
from nodepools.models import DisruptionRequest, Node, NodePool
from nvke.lean_lists import LeanListSerializer, row_builder
from nvke.validation import StrictUUIDField

DNS_LABEL = r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$"


class NodeSerializer(serializers.ModelSerializer):
    """A node. ``kubernetes_version`` is the kubelet's (the version it booted with, replaced
    once an upgrade is verified against what the kubelet reports); ``driver_version`` is the
    NVIDIA driver its host's agent last reported (``fleet.Host.driver_version``: one place for
    that fact, not the version the pool asked for), null before the node has a host.

    ``disruption`` / ``disruption_step``: why the node is being taken out of service and how
    far it got ("" when it is not; ``Node``'s docstring). ``config_state`` and ``move_state``
    are derived from them (the step while the disruption is ``isolation-change`` / ``move``,
    else ""), as documented before the one sub-state replaced them."""

    host = serializers.CharField(source="host.hostname", default=None, read_only=True)
    host_id = serializers.UUIDField(read_only=True)
    driver_version = serializers.CharField(
        source="host.driver_version",
        default=None,
        read_only=True,
        help_text="the NVIDIA driver the node's host runs, as its agent last reported it (one "
        "for every node of the host; the pool's pin, if any, is installed there); null before "
        "the node has a host",
    )
    config_state = serializers.CharField(read_only=True)
    move_state = serializers.CharField(read_only=True)

    class Meta:
        model = Node
        read_only_fields = ["disruption", "disruption_step"]
        fields = [
            "id",
            "name",
            "phase",
            "host",
            "host_id",
            "zone",
            "gpu_uuids",
            "gpu_layout",
            "kubernetes_version",
            "driver_version",
            "config_state",
            "move_state",
            "disruption",
            "disruption_step",
            "observed_problem",
            "created_at",
            "ready_at",
            "released_at",
        ]


class PoolNodesSerializer(serializers.ListSerializer):
    """A pool's nodes: on a list page, the rows the page fetched for it (``.values()`` dicts,
    already without the DELETED ones where the pool is not DELETED: see
    ``nodepools.api.views.attach_node_rows``), else the prefetched ``pool.nodes``, the DELETED
    ones only once the pool itself is DELETED. Declared once on :class:`NodePoolSerializer`, so
    a page of 50 pools builds the node fields once, not 50 times (DRF builds a serializer's
    fields per instance: a serializer made inside a method field cost ~10 ms a pool)."""

    def to_representation(self, data):  # type: ignore[override]
        build = row_builder(self.child)  # the lean path (nvke/lean_lists.py), same output
        if type(data) is list:  # a list page's attached rows
            return [build(n) for n in data]
        pool = getattr(data, "instance", None)
        nodes = list(data.all()) if hasattr(data, "all") else list(data)
        if pool is None or pool.phase != "DELETED":
            nodes = [n for n in nodes if n.phase != "DELETED"]
        return [build(n) for n in nodes]


class NodePoolSerializer(serializers.ModelSerializer):
    cluster_id = serializers.UUIDField(read_only=True)
    gpu_model = serializers.CharField(source="gpu_model_id", read_only=True)
    reservation = serializers.UUIDField(source="reservation_id", read_only=True, allow_null=True)
    nodes = PoolNodesSerializer(child=NodeSerializer(), read_only=True)

    class Meta:
        model = NodePool
        list_serializer_class = LeanListSerializer
        fields = [
            "id",
            "cluster_id",
            "name",
            "gpu_model",
            "gpus_per_node",
            "node_count",
            "reservation",
            "autoscaling",
            "isolation",
            "placement",
            "gpu_publishing",
            "kubernetes_version",
            "driver_version",
            "cuda_version",
            "gpu_config",
            "rollout",
            "upgrade",
            "disruption_hook",
            "phase",
            "conditions",
            "generation",
            "observed_generation",
            "created_at",
            "updated_at",
            "deletion_requested_at",
            "deleted_at",
            "nodes",
        ]
        extra_kwargs = {"driver_version": {"help_text": DRIVER_PIN_HELP}}


class DisruptionHookSerializer(serializers.Serializer):
    """``PUT .../disruption-hook``: before a planned disruption of a node (upgrade, isolation
    change, defragmentation move, host maintenance, scale-down) NVKE sends the CloudEvent
    ``nodepool.disruption.requested`` and waits up to ``checkpoint_deadline_s`` for an ack."""

    checkpoint_deadline_s = serializers.IntegerField(
        min_value=1,
        required=False,
        help_text="how long a planned disruption waits for the tenant's ack, in seconds "
        "(default 600, at most the operator's NVKE_CHECKPOINT_DEADLINE_MAX_S)",
    )


class DisruptionRequestSerializer(serializers.ModelSerializer):
    """One ask before a planned disruption (``nodepools.models.DisruptionRequest``)."""

    nodepool_id = serializers.UUIDField(read_only=True)
    state = serializers.CharField(read_only=True, help_text="waiting | acknowledged | expired")

    class Meta:
        model = DisruptionRequest
        fields = [
            "id",
            "nodepool_id",
            "nodes",
            "reason",
            "state",
            "requested_at",
            "deadline",
            "acknowledged_at",
            "acknowledged_via",
            "acknowledged_by",
            "released_at",
        ]
        read_only_fields = fields


class NodePoolCreateSerializer(serializers.Serializer):
    name = serializers.RegexField(
        DNS_LABEL,
        max_length=40,
        error_messages={
            "invalid": "name must be a DNS-1123 label: lower-case letters, digits and '-', "
            "starting with a letter"
        },
    )
    gpu_model = serializers.CharField(max_length=64)
    gpus_per_node = serializers.IntegerField(min_value=1, max_value=64)
    node_count = serializers.IntegerField(min_value=1, max_value=1000)
    isolation = serializers.JSONField(required=False, default=lambda: {"mode": "exclusive"})
    placement = serializers.JSONField(
        required=False,
        default=dict,
        help_text='{"same_nvlink_domain": true}: every node in one multi-node NVLink domain '
        "(GB200 NVL72); only for GPU models with such domains",
    )
    gpu_publishing = serializers.ChoiceField(
        choices=GpuPublishing.choices,
        required=False,
        default=GpuPublishing.DEVICE_PLUGIN,
        help_text="how the tenant's scheduler sees the GPUs: device-plugin (nvidia.com/gpu in "
        "each Node's allocatable) or dra (one ResourceSlice per node of the NVIDIA DRA driver "
        "gpu.nvidia.com, and its DeviceClass); never both; exclusive isolation only for dra",
    )
    driver_version = serializers.CharField(
        max_length=32,
        required=False,
        default="",
        allow_blank=True,
        help_text=DRIVER_PIN_HELP,
    )
    cuda_version = serializers.CharField(
        max_length=16,
        required=False,
        default="",
        allow_blank=True,
        help_text="CUDA version the workloads need (12.8); the driver must support it",
    )
    reservation = StrictUUIDField(
        required=False,
        allow_null=True,
        default=None,
        help_text="id of the tenant's capacity reservation the pool draws from "
        "(guaranteed placement while it is in force)",
    )


class NodePoolUpdateSerializer(serializers.Serializer):
    """``PATCH``: only the isolation policy changes this way (an UPDATE_ISOLATION operation);
    the size changes through ``set-size``."""

    isolation = serializers.JSONField()


class DryRunGpuInstancesSerializer(serializers.Serializer):
    profile = serializers.CharField(help_text="MIG profile of the GPU instances (1g.10gb)")
    needed = serializers.IntegerField(help_text="instances of it the pool's new nodes hold")
    free = serializers.IntegerField(
        help_text="instances of it the shared hosts can still take now (this profile alone)"
    )


class DryRunCapacitySerializer(serializers.Serializer):
    placeable_now = serializers.BooleanField()
    placeable_from = serializers.DateTimeField(
        allow_null=True,
        help_text="when it fits if not now, by counts and host shapes; null: not at any "
        "future instant",
    )
    reservation_id = serializers.UUIDField(
        allow_null=True, help_text="the reservation it would be placed on"
    )
    unit = serializers.ChoiceField(
        choices=["gpu", "gpu_instance"],
        help_text="gpu: whole GPUs of dedicated hosts (the *_gpus fields); gpu_instance: a "
        "tenancy shared pool's GPU instances on shared hosts (gpu_instances; the *_gpus "
        "fields are null)",
    )
    needed_gpus = serializers.IntegerField(allow_null=True)
    free_gpus = serializers.IntegerField(
        allow_null=True,
        help_text="on-demand: GPUs unreserved pools may take now (scrubbing ones not counted); "
        "reservation: GPUs left in it",
    )
    scrubbing_gpus = serializers.IntegerField(
        allow_null=True,
        help_text="on-demand: GPUs being scrubbed after their last release (not in free_gpus; "
        "free once the agent reports the scrub); null for reservation and shared pools",
    )
    reserved_gpus = serializers.IntegerField(
        allow_null=True,
        help_text="on-demand: the most GPUs reserved from now on in the region; "
        "reservation: its size",
    )
    held_by_reservations = serializers.IntegerField(
        allow_null=True,
        help_text="GPUs of the model in the region that nodes of active reservations (other "
        "than the pool's own) hold now: the same whatever the pool's size",
    )
    gpu_instances = DryRunGpuInstancesSerializer(
        many=True,
        allow_null=True,
        help_text="a shared pool: per MIG profile of its nodes; null for whole-GPU pools",
    )
    message = serializers.CharField()


class _QuotaPart(serializers.Serializer):
    limit = serializers.IntegerField()
    reserved = serializers.IntegerField(
        help_text="held by the quota for the tenant's live specs (provisioning or not); "
        "counted: left_after = limit - reserved - requested"
    )
    in_use = serializers.IntegerField(
        help_text="what the tenant's READY nodes hold now (shown beside reserved, not counted)"
    )
    requested = serializers.IntegerField()
    left_after = serializers.IntegerField()


class _GpuQuotaPart(_QuotaPart):
    gpu_model = serializers.CharField()


class DryRunQuotaSerializer(serializers.Serializer):
    fits = serializers.BooleanField()
    gpus = _GpuQuotaPart()
    nodes = _QuotaPart()


class DryRunCostSerializer(serializers.Serializer):
    currency = serializers.CharField()
    basis = serializers.ChoiceField(choices=["on-demand", "reservation"])
    gpus = serializers.IntegerField(help_text="whole GPUs, or GPU instances of a shared pool")
    gpu_hours_per_hour = serializers.DecimalField(
        max_digits=20,
        decimal_places=6,
        help_text="GPU-hours the pool bills per hour: gpus, or instances x the MIG profile's "
        "billable fraction for a pool sharing GPUs across tenants",
    )
    unit_price = serializers.DecimalField(
        max_digits=20, decimal_places=6, help_text="per GPU-hour, on-demand"
    )
    hourly = serializers.DecimalField(
        max_digits=20,
        decimal_places=4,
        help_text="what the pool adds per hour (0 on a reservation: its usage is covered)",
    )
    reservation_unit_price = serializers.DecimalField(
        max_digits=20,
        decimal_places=6,
        allow_null=True,
        help_text="per reserved GPU-hour, the rate the invoice bills the reservation at; null "
        "off a reservation, or when the price sheet has none (its invoice then fails "
        "missing_reservation_price)",
    )
    reservation_hourly = serializers.DecimalField(
        max_digits=20,
        decimal_places=4,
        allow_null=True,
        help_text="the reservation's own charge per hour (billed whether used or not)",
    )


class DryRunSerializer(serializers.Serializer):
    """``?dry_run=true``: what would be applied, nothing changed."""

    dry_run = serializers.BooleanField()
    isolation = serializers.JSONField()
    gpu_config = serializers.JSONField()
    disruption = serializers.JSONField(
        help_text='{"nodes": [{"name", "drain", "repartition", "gpus", "gpu_instances"}], '
        '"drain": n, "repartition": n, "max_unavailable": 1}; a node\'s gpus: whole GPUs it '
        "holds; a shared pool's VM node holds GPU instances instead: gpus null, gpu_instances "
        '{"1g.10gb": 1}'
    )
    capacity = DryRunCapacitySerializer(
        allow_null=True,
        help_text="create, and a resize that grows: can the nodes be placed, now or from when",
    )
    quota = DryRunQuotaSerializer(
        allow_null=True, help_text="create, and a resize that grows: quota left after it"
    )
    cost = DryRunCostSerializer(
        allow_null=True,
        help_text="create and resize: the pool's hourly cost from the price sheet (or null)",
    )
    cost_error = serializers.JSONField(
        required=False,
        help_text="only when cost is null: for want of a price, the usage API's cost_error "
        '({"code": "missing_price", "detail", "gpu_model", "mig_profile", "currency", "at"}); '
        "on a reservation without room for the pool, the create's 409 body "
        '({"code": "reservation_exhausted", "detail", "reserved", "planned", "needed"})',
    )
    node_count = serializers.DictField(
        child=serializers.IntegerField(),
        required=False,
        help_text='set-size only: {"from": n, "to": m}; disruption.nodes are the nodes a '
        "scale-down removes, in the order it removes them (unhealthy first, then the newest)",
    )


class GpuConfigSerializer(serializers.Serializer):
    """``GET .../gpu-config``: the pool's rendered GPU Operator inputs, its rollout, and what
    each node's GPUs run (validated per-GPU layout)."""

    nodepool_id = serializers.UUIDField()
    isolation = serializers.JSONField()
    gpu_config = serializers.JSONField()
    rollout = serializers.JSONField()
    nodes = serializers.JSONField()
