"""Physical GPU inventory: hosts, GPUs, agent reports, GPU samples and Xid events.

Fleet rows belong to the platform operator, not to a tenant: they declare no ``tenant_path``
and are only served by operator endpoints. A GPU held by a tenant's node records the holder
(the node id, a plain UUID: fleet does not know node pools) and the holder's tenant.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import (
    ArrayField,
    DateTimeRangeField,
    IntegerRangeField,
    RangeOperators,
)
from django.db import models
from django.db.models import F, Q

from nvke.public_ids import public_id_field

from .choices import (
    CheckKind,
    CheckStatus,
    GpuHealth,
    GpuInstanceState,
    HealthReason,
    HostEventKind,
    HostState,
    HostTenancy,
    ScrubState,
    ScrubStatus,
)


class Host(models.Model):
    """A physical GPU server (bare-metal node or hypervisor) where ``nvke-agent`` runs.

    ``region`` (``us-east-1``) is given at import or derived from ``zone`` (``us-east-1a``,
    ``us-central1-a``); a zone is also in region R when it starts with R not followed by a
    digit (:func:`zone_in_region`: ``europe-west10-a`` is not in ``europe-west1``).
    ``topology`` is the GPU interconnect as read from ``nvidia-smi topo -m`` or NVML (shape in
    :mod:`fleet.topology`); ``Gpu.nvlink_island`` is derived from it. ``state_reason`` says why
    the host is in its state; ``drain_target`` is the state a draining host enters once no GPU
    is held. Agent secrets (bootstrap token, host credential) are stored as SHA-256 hex digests:
    both are 256-bit random values, so a fast hash is safe and keeps every report cheap to
    authenticate.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    hostname = models.CharField(max_length=253, unique=True)
    region = models.CharField(max_length=64, blank=True, db_index=True)
    zone = models.CharField(max_length=64)
    rack = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=16, choices=HostState.choices, default=HostState.AVAILABLE)
    state_reason = models.CharField(max_length=300, blank=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    #: who set the current state (a :class:`HostEvent` ``actor``: ``agent`` for the health
    #: path's cordon, ``apikey:<prefix>`` of an operator, ``system`` …), written with ``state``
    #: by :func:`fleet.services.change_host_state`, also when a state is set again (an
    #: operator's cordon of a host the agent cordoned makes it the operator's); "" for states
    #: set before it was recorded. Auto-repair lifts only a cordon whose actor is ``agent``.
    state_actor = models.CharField(max_length=100, blank=True)
    #: set while draining: the state the host enters once none of its GPUs is held
    drain_target = models.CharField(max_length=16, choices=HostState.choices, blank=True)
    drain_requested_at = models.DateTimeField(null=True, blank=True)
    #: while draining: the nodes to move off (counted when the drain was asked for) and
    #: whether their drains evict pods that block them (PodDisruptionBudgets), as an upgrade's
    #: ``force`` does
    drain_nodes = models.PositiveIntegerField(default=0)
    drain_force = models.BooleanField(default=False)
    topology = models.JSONField(default=dict, blank=True)
    #: dedicated (whole GPUs, one tenant at a time) or shared (a hypervisor: tenants' VM nodes
    #: hold MIG GPU instances, :class:`GpuInstance`); set by an operator while no whole GPU is
    #: held (:mod:`fleet.shared_hosts`)
    tenancy = models.CharField(
        max_length=16, choices=HostTenancy.choices, default=HostTenancy.DEDICATED
    )
    #: the host's multi-node NVLink domain (GB200 NVL72 rack): NVML's GPU fabric cluster UUID
    #: and clique id, the same for every GPU of the host (:mod:`fleet.nvlink_domains`: set at
    #: import or from the agent's per-GPU fabric info, null when the host has none or its GPUs
    #: disagree). The one place a host's domain is stored.
    nvlink_cluster_uuid = models.UUIDField(null=True, blank=True)
    nvlink_clique_id = models.BigIntegerField(null=True, blank=True)
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
    #: what the agent's source said failed in its latest report ("" = it read the GPUs; e.g.
    #: "NVML: Driver/library version mismatch" when NVML does not initialise)
    agent_source_error = models.CharField(max_length=300, blank=True)
    #: when the latest report that read the GPUs (an inventory, or the source's error saying
    #: why it could not) was stored, and how many have been: the observed-state gates
    #: (nodepools/observed_gates.py) wait for one made after an action
    inventory_at = models.DateTimeField(null=True, blank=True)
    inventory_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    # Summary of the host's GPUs for placement's candidate query, kept by a PostgreSQL trigger
    # on fleet_gpu (migration 0003), whatever code changed the GPUs: usable free GPUs, GPUs
    # held, the tenants holding any, and those holding without hardware-isolated sharing.
    free_gpus = models.PositiveSmallIntegerField(default=0, editable=False)
    held_gpus = models.PositiveSmallIntegerField(default=0, editable=False)
    held_tenants = ArrayField(models.UUIDField(), default=list, blank=True, editable=False)
    exclusive_tenants = ArrayField(models.UUIDField(), default=list, blank=True, editable=False)

    class Meta:
        ordering = ["hostname"]
        indexes = [
            models.Index(fields=["gpu_model", "state"]),
            models.Index(fields=["gpu_model", "state", "free_gpus"], name="fleet_host_free_idx"),
            models.Index(
                fields=["gpu_model", "nvlink_cluster_uuid", "nvlink_clique_id"],
                name="fleet_host_nvlink_idx",
            ),
        ]
        constraints = [
            # a domain is both halves or neither; NVML's cliqueId is an unsigned 32-bit int
            models.CheckConstraint(
                condition=Q(nvlink_cluster_uuid__isnull=True, nvlink_clique_id__isnull=True)
                | Q(
                    nvlink_cluster_uuid__isnull=False,
                    nvlink_clique_id__gte=0,
                    nvlink_clique_id__lte=2**32 - 1,
                ),
                name="host_nvlink_domain_whole",
            )
        ]

    def __str__(self) -> str:
        return self.hostname

    SUMMARY_FIELDS = ("free_gpus", "held_gpus", "held_tenants", "exclusive_tenants")

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Never write the trigger-kept GPU summary back from a (possibly stale) instance."""
        if not self._state.adding and kwargs.get("update_fields") is None:
            kwargs["update_fields"] = [
                f.name
                for f in self._meta.concrete_fields
                if not f.primary_key and f.name not in self.SUMMARY_FIELDS
            ]
        super().save(*args, **kwargs)

    @staticmethod
    def in_region_q(region: str, prefix: str = "") -> Q:
        """Q matching hosts in ``region``: :func:`host_in_region` in SQL (the host's region,
        or for a host whose region is its zone, the zone by :func:`zone_in_region`)."""
        p = prefix
        if not region:
            return Q(pk__in=[])  # no host is in no region
        by_zone = Q(**{f"{p}zone": region}) | (
            Q(**{f"{p}zone__startswith": region + "-"}) & ~Q(**{f"{p}zone__regex": _CLOUD_ZONE})
        )
        if region[-1:].isdigit():  # a cloud zone of this region: the region + [-] + a letter
            by_zone |= Q(**{f"{p}zone__regex": "^" + re.escape(region) + "-?[a-z]$"})
        own_zone = Q(**{f"{p}region": ""}) | Q(**{f"{p}region": F(f"{p}zone")})
        return Q(**{f"{p}region": region}) | (own_zone & by_zone)


#: a zone with a cloud name (:func:`region_of_zone` gives it a region of its own), in SQL
_CLOUD_ZONE = r"^.*[0-9]-?[a-z]$"


def zone_in_region(zone: str, region: str) -> bool:
    """Whether ``zone`` is in ``region`` by its name — the one rule placement, reservations
    and the portal use (with a host's own region: :func:`host_in_region`). A zone with a
    cloud name is in the region that name gives and no other (:func:`region_of_zone`:
    ``us-east-1a`` is in ``us-east-1``, not in ``us``, ``us-east`` or ``us-east-10``;
    ``europe-west10-a`` not in ``europe-west1``). A name of the operator's own is in the
    region it equals or that it starts with followed by ``-`` (``dc1-rack2`` is in ``dc1``,
    not in ``d`` or ``dc``)."""
    if not region:
        return False
    if zone == region:
        return True
    derived = region_of_zone(zone)
    if derived != zone:
        return derived == region
    return zone.startswith(region + "-")


def host_in_region(host_region: str, zone: str, region: str) -> bool:
    """Whether a host (its ``region`` field and ``zone``) is in ``region``: its region is,
    or, for a host whose region is its zone (imported without one, a zone without a cloud
    name), its zone by :func:`zone_in_region`. A region given at import is the host's only
    one (zone ``1`` of Azure's ``eastus``). ``Host.in_region_q`` is the same rule in SQL."""
    if host_region == region:
        return bool(region)
    return host_region in ("", zone) and zone_in_region(zone, region)


def region_of_zone(zone: str) -> str:
    """The region a zone name belongs to, by the cloud naming conventions.

    ``us-east-1a`` -> ``us-east-1`` (AWS: region + letter), ``us-central1-a`` -> ``us-central1``
    (GCP: region + ``-`` + letter); anything else is its own region (``dc1`` -> ``dc1``).
    """
    match = re.fullmatch(r"(.*\d)-?[a-z]", zone)
    return match.group(1) if match else zone


class Gpu(models.Model):
    """A physical GPU, identified fleet-wide by its NVML UUID (``GPU-…``).

    ``memory_total_bytes`` is NVML's total (bytes). ``mig_mode`` is ``enabled``/``disabled`` or
    null when the GPU has no MIG; ``mig_devices`` is the list of MIG devices as last reported
    (``[{gpu_instance_id, compute_instance_id, uuid, memory_total_bytes, …}]``).
    ``holder_id`` is the node that holds the GPU (null = free); ``holder_shares_host`` is true
    when the holder's isolation allows hardware-isolated sharing of the host with other
    tenants. ``nvlink_island`` numbers the set of GPUs of the host joined by NVLink / one
    NVSwitch (null: topology unknown). ``scrub_state`` is PENDING from the moment a tenant
    releases the GPU until MIG teardown, reset and memory clearing are confirmed.
    ``missing_since`` is set while the agent's inventory does not list the GPU.
    ``attributes`` holds static NVML facts from the agent (serial, architecture, compute
    capability, power limits in mW, max clocks in MHz, NVLink links); ``health_counters`` the
    last health counters (aggregate ECC counts, retired pages, remapped rows, pending MIG mode).
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
    health_reason = models.CharField(max_length=300, blank=True)
    holder_id = models.UUIDField(null=True, blank=True, db_index=True)
    holder_tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    holder_shares_host = models.BooleanField(default=False)
    #: the holder's group (its node pool), for spreading a group over zones
    holder_group_id = models.UUIDField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    nvlink_island = models.PositiveSmallIntegerField(null=True, blank=True)
    scrub_state = models.CharField(
        max_length=8, choices=ScrubState.choices, default=ScrubState.CLEAN
    )
    #: the last tenant that held the GPU (whose data a scrub must clear)
    last_tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    missing_since = models.DateTimeField(null=True, blank=True)
    serial = models.CharField(max_length=64, blank=True)
    attributes = models.JSONField(default=dict, blank=True)
    health_counters = models.JSONField(default=dict, blank=True)
    #: on a shared host: the memory clears of released GPU instances the agent last reported
    #: (``[{"scrub_id", "start", "size", "status": "ok" | "failed", "cleared_bytes",
    #: "finished_at", "method"}]``), the evidence :func:`fleet.shared_hosts.confirm_scrubs`
    #: needs before a released GPU instance is FREE
    slice_scrubs = models.JSONField(default=list, blank=True)

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
    """One accepted agent report; ``(host, seq)`` is unique, which makes ingestion idempotent.

    ``rejections`` counts the samples not stored, by reason (``{"ts_in_future": 2, …}``, the
    reasons in :mod:`fleet.ingest`); ``samples_deduplicated`` the repeated samples dropped (a
    physical GPU listed once per MIG instance). ``min_ts``/``max_ts`` bound the stored samples
    (the rollup task recomputes the minutes they touch). ``clock_skew_s`` is the agent's
    ``sent_at`` minus the server's receive time (s; positive: the agent's clock is ahead).
    ``content_sha256`` is the digest of what the agent produced (the body without the fields
    stamped at send time, :func:`fleet.ingest.content_digest`) and ``instance_id`` the agent
    process that produced it: the same seq again with another digest is a second agent using
    this host's credential.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="reports")
    seq = models.BigIntegerField()
    received_at = models.DateTimeField(auto_now_add=True, db_index=True)
    samples_stored = models.PositiveIntegerField(default=0)
    samples_rejected = models.PositiveIntegerField(default=0)
    samples_deduplicated = models.PositiveIntegerField(default=0)
    events_stored = models.PositiveIntegerField(default=0)
    rejections = models.JSONField(default=dict, blank=True)
    min_ts = models.DateTimeField(null=True, blank=True)
    max_ts = models.DateTimeField(null=True, blank=True)
    clock_skew_s = models.FloatField(null=True, blank=True)
    content_sha256 = models.CharField(max_length=64, blank=True)
    instance_id = models.CharField(max_length=64, blank=True)

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
    ecc_volatile_corrected = models.BigIntegerField(null=True)
    sm_clock_mhz = models.IntegerField(null=True)
    memory_clock_mhz = models.IntegerField(null=True)
    clocks_event_reasons = models.BigIntegerField(null=True)
    report_seq = models.BigIntegerField()

    class Meta:
        # Created by RunSQL in migration 0001 (PARTITION BY RANGE); managed since 0004 only so
        # that Django's flush (transactional tests) truncates it with the other tables.
        db_table = "fleet_gpusample"

    def __str__(self) -> str:
        return f"{self.gpu_uuid}@{self.ts}"


class XidEvent(models.Model):
    """An Xid error reported by a host's agent (NVIDIA Xid catalog code + driver message).

    ``late``: the Xid is dated before the newest sample of its host (any GPU) the server had
    accepted when it arrived (a host back-dating an Xid to refund an allocation;
    :mod:`fleet.ingest`). It is kept with the date the agent gave, and its unhealthy interval —
    the SLA credit — starts no earlier than ``credit_from``, that sample's time. A spool
    replayed after an outage is old, not late: no sample newer than its Xids had arrived.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="xid_events")
    gpu_uuid = models.CharField(max_length=64)
    ts = models.DateTimeField()
    xid = models.PositiveIntegerField()
    message = models.TextField(blank=True)
    report_seq = models.BigIntegerField()
    late = models.BooleanField(default=False)
    credit_from = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-ts"]
        indexes = [models.Index(fields=["gpu_uuid", "ts"])]

    def __str__(self) -> str:
        return f"Xid {self.xid} on {self.gpu_uuid}"


class HostEvent(models.Model):
    """The history of a host: imports, state changes, operator actions, checks, scrubs, Xids.

    ``actor`` is who caused it (``apikey:<prefix>`` of an operator, ``agent``, ``system``).
    ``data`` holds the details of the kind (check id, GPU UUIDs, Xid code …).
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="events")
    ts = models.DateTimeField(db_index=True)
    kind = models.CharField(max_length=16, choices=HostEventKind.choices)
    actor = models.CharField(max_length=100, default="system")
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    message = models.CharField(max_length=500)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-ts", "-id"]
        indexes = [models.Index(fields=["host", "-ts"])]

    def __str__(self) -> str:
        return f"{self.host_id} {self.kind}: {self.message}"


class HostCheck(models.Model):
    """A health check of a host's GPUs (onboarding report, agent NVML facts, DCGM diag).

    ``findings`` is ``[{"gpu_uuid", "check", "status", "detail"}]`` (``status`` PASSED /
    WARNING / FAILED); ``source`` names what was read (``nvidia-smi -q -x report``, ``NVML via
    nvke-agent``, ``dcgmi diag -r 1``). A FAILED check marks the failing GPUs unhealthy.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="checks")
    kind = models.CharField(max_length=16, choices=CheckKind.choices)
    status = models.CharField(max_length=8, choices=CheckStatus.choices)
    source = models.CharField(max_length=100)
    checked_at = models.DateTimeField()
    findings = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-checked_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} check of {self.host_id}: {self.status}"


class GpuScrub(models.Model):
    """The scrub of one GPU after a tenant released it (DESIGN §4 host hygiene).

    ``steps`` is ``[{"step": "mig_teardown" | "gpu_reset" | "memory_clear", "status": "ok" |
    "failed" | "skipped", "detail"}]`` as the executor reported them; ``executor`` says who did
    it (``nvke-agent nvml``, ``nvke-agent replay (simulated)``, ``control plane: no agent
    registered (simulated infrastructure)``). While a scrub is PENDING or FAILED the GPU is
    handed to nobody.
    """

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="scrubs")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="scrubs")
    previous_tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    previous_holder_id = models.UUIDField(null=True, blank=True)
    status = models.CharField(
        max_length=8, choices=ScrubStatus.choices, default=ScrubStatus.PENDING
    )
    mig_teardown = models.BooleanField(default=False)
    requested_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    executor = models.CharField(max_length=100, blank=True)
    steps = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"],
                condition=Q(status="PENDING"),
                name="gpuscrub_one_pending_per_gpu",
            )
        ]

    def __str__(self) -> str:
        return f"scrub of {self.gpu_id}: {self.status}"


class GpuHealthInterval(models.Model):
    """A time a GPU was unhealthy: ``[started_at, ended_at)`` (open while ``ended_at`` is null).

    For billing (SLA credits) and auto-repair. Intervals of one GPU never overlap (an exclusion
    constraint); when the cause changes while the GPU stays unhealthy (say a missing GPU then
    reports Xid 79) the open interval is closed and a new one starts at the same instant.
    ``reason`` is a :class:`~fleet.choices.HealthReason`; for Xids, ``xid`` and ``action`` (the
    catalog's NVIDIA immediate action, e.g. ``RESET_GPU``); ``needs_operator`` is true when the
    fault needs the platform (reset, reboot, hardware) rather than the tenant's workload — the
    time SLA credits cover. ``holder_id``/``tenant`` are who held the GPU when it started.
    """

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="health_intervals")
    #: what invoices show tenants as ``health_interval_id`` (:mod:`nvke.public_ids`)
    public_id = public_id_field()
    gpu_uuid = models.CharField(max_length=64, db_index=True)
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="+")
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=16, choices=HealthReason.choices)
    xid = models.PositiveIntegerField(null=True, blank=True)
    action = models.CharField(max_length=100, blank=True)
    needs_operator = models.BooleanField(default=False)
    #: the health rule's ladder step that opened it (:class:`~fleet.choices.LadderStep`;
    #: "" for causes no rule decides): what auto-repair does
    rule_action = models.CharField(max_length=24, blank=True)
    detail = models.CharField(max_length=500, blank=True)
    holder_id = models.UUIDField(null=True, blank=True)
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    ended_by = models.CharField(max_length=100, blank=True)

    class Meta:
        ordering = ["gpu_uuid", "started_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"], condition=Q(ended_at__isnull=True), name="gpuhealth_one_open"
            ),
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=models.F("started_at")),
                name="gpuhealth_ends_after_start",
            ),
            ExclusionConstraint(
                name="gpuhealth_no_overlap",
                expressions=[
                    ("gpu", RangeOperators.EQUAL),
                    (
                        models.Func(
                            "started_at",
                            "ended_at",
                            models.Value("[)"),
                            function="tstzrange",
                            output_field=DateTimeRangeField(),
                        ),
                        RangeOperators.OVERLAPS,
                    ),
                ],
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_uuid} unhealthy from {self.started_at} ({self.reason})"


class EnergyCounterReset(models.Model):
    """An energy counter that went backwards or jumped implausibly (driver reload, bad read).

    ``ts`` is the sample where it was seen, ``previous_mj``/``current_mj`` the two readings
    (mJ), ``kind`` ``went_backwards`` or ``implausible_jump`` (more than the GPU's maximum power
    could use in the time between the readings). The rollups count no energy for that step.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="+")
    gpu_uuid = models.CharField(max_length=64)
    ts = models.DateTimeField()
    previous_ts = models.DateTimeField()
    previous_mj = models.BigIntegerField()
    current_mj = models.BigIntegerField()
    kind = models.CharField(max_length=20)

    class Meta:
        ordering = ["gpu_uuid", "ts"]
        constraints = [
            models.UniqueConstraint(fields=["gpu_uuid", "ts"], name="energyreset_gpu_ts_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.gpu_uuid} energy {self.kind} at {self.ts}"


class _Rollup(models.Model):
    """Aggregates of the samples of one GPU (or one MIG device) over one bucket.

    Sums and counts (not averages) so hours are exact sums of minutes:
    ``utilization_gpu_pct_sum / utilization_samples`` is the mean utilization % over the
    samples that had one (MIG-mode ``N/A`` samples are not counted). ``energy_mj`` is the
    energy used in the bucket (mJ, from counter deltas; null when no delta was valid).
    Memory bytes, power mW, temperature °C.
    """

    bucket = models.DateTimeField()
    host = models.ForeignKey(Host, on_delete=models.DO_NOTHING, db_constraint=False)
    gpu_uuid = models.CharField(max_length=64)
    mig_gpu_instance_id = models.IntegerField(null=True, blank=True)
    samples = models.PositiveIntegerField()
    utilization_samples = models.PositiveIntegerField()
    utilization_gpu_pct_sum = models.FloatField(null=True)
    utilization_gpu_pct_max = models.FloatField(null=True)
    memory_used_bytes_sum = models.DecimalField(max_digits=30, decimal_places=0, null=True)
    memory_samples = models.PositiveIntegerField(default=0)
    memory_used_bytes_max = models.BigIntegerField(null=True)
    memory_total_bytes = models.BigIntegerField(null=True)
    power_mw_sum = models.DecimalField(max_digits=30, decimal_places=0, null=True)
    power_samples = models.PositiveIntegerField(default=0)
    power_mw_max = models.BigIntegerField(null=True)
    energy_mj = models.BigIntegerField(null=True)
    temperature_c_max = models.FloatField(null=True)
    ecc_volatile_uncorrected_max = models.BigIntegerField(null=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.gpu_uuid}/{self.mig_gpu_instance_id} @ {self.bucket}"

    @property
    def utilization_gpu_pct_avg(self) -> float | None:
        """Mean utilization % over the samples that reported one."""
        if not self.utilization_samples or self.utilization_gpu_pct_sum is None:
            return None
        return self.utilization_gpu_pct_sum / self.utilization_samples


class GpuRollup1m(_Rollup):
    """1-minute rollup of ``fleet_gpusample`` (see :class:`_Rollup`)."""

    class Meta:
        ordering = ["gpu_uuid", "bucket"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu_uuid", "mig_gpu_instance_id", "bucket"],
                name="rollup1m_key",
                nulls_distinct=False,
            )
        ]
        indexes = [models.Index(fields=["bucket"]), models.Index(fields=["host", "bucket"])]


class GpuRollup1h(_Rollup):
    """1-hour rollup, the sum of the hour's 1-minute rollups (see :class:`_Rollup`)."""

    class Meta:
        ordering = ["gpu_uuid", "bucket"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu_uuid", "mig_gpu_instance_id", "bucket"],
                name="rollup1h_key",
                nulls_distinct=False,
            )
        ]
        indexes = [models.Index(fields=["bucket"]), models.Index(fields=["host", "bucket"])]


class RollupCursor(models.Model):
    """How far the rollup task has read ``AgentReport.received_at`` (one row, ``name``)."""

    name = models.CharField(max_length=32, primary_key=True)
    received_until = models.DateTimeField()
    last_report_id = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}: {self.received_until}"


class GpuInstance(models.Model):
    """One MIG GPU instance of a shared host's GPU, managed by NVKE across tenants.

    ``profile`` at memory slices ``start`` .. ``start + size - 1`` (the catalog's ``-lgipp``
    placement table, :mod:`catalog.mig`); ``compute_slices`` of the profile. ``holder_id`` is
    the tenant's VM node holding it (a plain UUID, as on :class:`Gpu`), ``tenant`` its tenant;
    ``gpu_instance_id`` the id NVML gave it (as the host's agent reports it; null until
    reported). State (:class:`~fleet.choices.GpuInstanceState`): ACTIVE while held; SCRUBBING from
    release until the agent's report shows the instance destroyed *and* the scrub
    ``scrub_id`` completed (``scrub_evidence``: what the agent reported); FREE afterwards,
    kept as history. ``previous_tenant`` is whose data the scrub clears.

    Last line of defence against two placements taking overlapping slices: an exclusion
    constraint — no two non-FREE rows of one GPU whose memory-slice ranges overlap.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpu_instances")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="instances")
    profile = models.CharField(max_length=32)
    start = models.PositiveSmallIntegerField()
    size = models.PositiveSmallIntegerField()
    compute_slices = models.PositiveSmallIntegerField()
    state = models.CharField(
        max_length=12, choices=GpuInstanceState.choices, default=GpuInstanceState.ACTIVE
    )
    holder_id = models.UUIDField(null=True, blank=True, db_index=True)
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    previous_tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    gpu_instance_id = models.PositiveSmallIntegerField(null=True, blank=True)
    scrub_id = models.UUIDField(null=True, blank=True)
    scrub_evidence = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    freed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host", "gpu", "start", "created_at"]
        constraints = [
            ExclusionConstraint(
                name="gpuinstance_no_overlap",
                expressions=[
                    ("gpu", RangeOperators.EQUAL),
                    (
                        models.Func(
                            "start",
                            models.F("start") + models.F("size"),
                            function="int4range",
                            output_field=IntegerRangeField(),
                        ),
                        RangeOperators.OVERLAPS,
                    ),
                ],
                condition=~Q(state=GpuInstanceState.FREE),
            ),
            models.CheckConstraint(
                condition=~Q(state=GpuInstanceState.ACTIVE)
                | Q(holder_id__isnull=False, tenant__isnull=False),
                name="gpuinstance_active_has_holder",
            ),
            models.CheckConstraint(condition=Q(size__gt=0), name="gpuinstance_size_positive"),
        ]
        indexes = [models.Index(fields=["host", "state"])]

    def __str__(self) -> str:
        return f"{self.profile}@{self.start} on {self.gpu_id} ({self.state})"


from .breaker_models import BreakerTrip, CordonRecord  # noqa: E402, F401
from .rule_models import HealthRule, HealthRuleFiring  # noqa: E402, F401
