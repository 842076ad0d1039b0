"""Physical GPU inventory: hosts, GPUs, agent reports, GPU samples and Xid events.

Fleet rows belong to the platform operator, not to a tenant: they declare no ``tenant_path``
and are only served by operator endpoints. A GPU held by a tenant's node records the holder
(the node id, a plain UUID: fleet does not know node pools) and the holder's tenant.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from .choices import GpuHealth, HostState


class Host(models.Model):
    """A physical GPU server (bare-metal node or hypervisor) where ``nvke-agent`` runs.

    ``zone`` (``us-east-1a``) is in region R when it equals R or starts with R. Agent secrets
    (bootstrap token, host credential) are stored as SHA-256 hex digests: both are 256-bit
    random values, so a fast hash is safe and keeps every report cheap to authenticate.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    hostname = models.CharField(max_length=253, unique=True)
    zone = models.CharField(max_length=64)
    rack = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=16, choices=HostState.choices, default=HostState.AVAILABLE)
    gpu_model = models.ForeignKey(
        "catalog.GpuModel", on_delete=models.PROTECT, related_name="hosts"
    )
    gpu_count = models.PositiveSmallIntegerField()
    driver_version = models.CharField(max_length=32, blank=True)
    cuda_version = models.CharField(max_length=16, blank=True)
    agent_version = models.CharField(max_length=32, blank=True)
    #: Human-readable warnings from import and ingestion (inventory mismatch, …).
    warnings = models.JSONField(default=list, blank=True)
    bootstrap_token_hash = models.CharField(max_length=64, blank=True)
    bootstrap_token_expires_at = models.DateTimeField(null=True, blank=True)
    bootstrap_token_used_at = models.DateTimeField(null=True, blank=True)
    credential_hash = models.CharField(max_length=64, blank=True, db_index=True)
    registered_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    last_report_seq = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["hostname"]
        indexes = [models.Index(fields=["gpu_model", "state"])]

    def __str__(self) -> str:
        return self.hostname

    @staticmethod
    def in_region_q(region: str, prefix: str = "") -> Q:
        """Q matching hosts whose zone is in ``region`` (equal, or starting with it)."""
        return Q(**{f"{prefix}zone": region}) | Q(**{f"{prefix}zone__startswith": region})


class Gpu(models.Model):
    """A physical GPU, identified fleet-wide by its NVML UUID (``GPU-…``).

    ``memory_total_bytes`` is NVML's total (bytes). ``mig_mode`` is ``enabled``/``disabled`` or
    null when the GPU has no MIG; ``mig_devices`` is the list of MIG devices as last reported
    (``[{gpu_instance_id, compute_instance_id, uuid, memory_total_bytes, …}]``).
    ``holder_id`` is the node that holds the GPU (null = free).
    """

    uuid = models.CharField(max_length=64, unique=True)
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    pci_bus_id = models.CharField(max_length=32)
    minor_number = models.PositiveSmallIntegerField(null=True, blank=True)
    gpu_model = models.ForeignKey("catalog.GpuModel", on_delete=models.PROTECT)
    product_name = models.CharField(max_length=128)
    memory_total_bytes = models.BigIntegerField(null=True, blank=True)
    mig_mode = models.CharField(max_length=16, null=True, blank=True)
    mig_devices = models.JSONField(default=list, blank=True)
    health = models.CharField(max_length=16, choices=GpuHealth.choices, default=GpuHealth.HEALTHY)
    holder_id = models.UUIDField(null=True, blank=True, db_index=True)
    holder_tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    claimed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host", "index"]
        constraints = [
            models.UniqueConstraint(fields=["host", "index"], name="gpu_host_index_uniq"),
            models.CheckConstraint(
                condition=Q(holder_id__isnull=True, holder_tenant__isnull=True)
                | Q(holder_id__isnull=False, holder_tenant__isnull=False),
                name="gpu_holder_has_tenant",
            ),
        ]

    def __str__(self) -> str:
        return self.uuid


class AgentReport(models.Model):
    """One accepted agent report; ``(host, seq)`` is unique, which makes ingestion idempotent."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="reports")
    seq = models.BigIntegerField()
    received_at = models.DateTimeField(auto_now_add=True)
    samples_stored = models.PositiveIntegerField(default=0)
    samples_rejected = models.PositiveIntegerField(default=0)
    events_stored = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host", "seq"], name="agentreport_host_seq_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.host_id}#{self.seq}"


class GpuSample(models.Model):
    """A telemetry sample of one GPU (or one MIG GPU instance) at ``ts``.

    Stored in ``fleet_gpusample``, a table PARTITIONED BY RANGE (ts) with one partition per UTC
    day (created ahead by :mod:`fleet.partitions`), written with COPY. Units: utilization %,
    memory bytes, power mW, energy mJ (since driver load), temperature °C. Utilization is null
    when NVML does not report it (MIG mode: ``N/A``), never 0.
    """

    pk = models.CompositePrimaryKey("id", "ts")
    id = models.BigIntegerField()
    ts = models.DateTimeField()
    host = models.ForeignKey(Host, on_delete=models.DO_NOTHING, db_constraint=False)
    gpu_uuid = models.CharField(max_length=64)
    mig_gpu_instance_id = models.IntegerField(null=True)
    utilization_gpu_pct = models.FloatField(null=True)
    utilization_memory_pct = models.FloatField(null=True)
    memory_used_bytes = models.BigIntegerField(null=True)
    memory_total_bytes = models.BigIntegerField(null=True)
    power_mw = models.BigIntegerField(null=True)
    energy_mj = models.BigIntegerField(null=True)
    temperature_c = models.FloatField(null=True)
    ecc_volatile_uncorrected = models.BigIntegerField(null=True)
    report_seq = models.BigIntegerField()

    class Meta:
        managed = False
        db_table = "fleet_gpusample"

    def __str__(self) -> str:
        return f"{self.gpu_uuid}@{self.ts}"


class XidEvent(models.Model):
    """An Xid error reported by a host's agent (NVIDIA Xid catalog code + driver message)."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="xid_events")
    gpu_uuid = models.CharField(max_length=64)
    ts = models.DateTimeField()
    xid = models.PositiveIntegerField()
    message = models.TextField(blank=True)
    report_seq = models.BigIntegerField()

    class Meta:
        ordering = ["-ts"]
        indexes = [models.Index(fields=["gpu_uuid", "ts"])]

    def __str__(self) -> str:
        return f"Xid {self.xid} on {self.gpu_uuid}"
