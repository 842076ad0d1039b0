"""Node pools (declarative GPU node groups of a cluster) and their nodes."""

from __future__ import annotations

import uuid

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.utils import timezone

from clusters.choices import Phase, TargetType

from .choices import Disruption, DisruptionStep, GpuPublishing, NodePhase
from .querysets import NodeQuerySet


class NodePool(models.Model):
    """A group of identical GPU nodes in a cluster.

    Spec: ``gpu_model`` (catalog slug), ``gpus_per_node``, ``node_count``, ``isolation``
    (DESIGN §10 shapes, :mod:`nodepools.isolation`), ``driver_version``, ``cuda_version``,
    ``placement`` (one NVLink domain, :mod:`nodepools.nvlink`), ``gpu_publishing`` (device
    plugin or DRA devices, :mod:`nodepools.dra`).
    Status: ``phase``, ``conditions``, ``observed_generation``, the rendered ``gpu_config``
    (:mod:`nodepools.gpu_config`) its nodes receive, and ``rollout`` while an isolation
    change runs node by node.
    """

    tenant_path = "tenant"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    cluster = models.ForeignKey(
        "clusters.Cluster", on_delete=models.PROTECT, related_name="nodepools"
    )
    name = models.CharField(max_length=40)
    gpu_model = models.ForeignKey("catalog.GpuModel", on_delete=models.PROTECT, related_name="+")
    gpus_per_node = models.PositiveSmallIntegerField()
    node_count = models.PositiveIntegerField()
    isolation = models.JSONField(default=dict)
    #: pinned driver: a branch (``R580``) or release (``580.95.05``); blank = GPU Operator's
    driver_version = models.CharField(max_length=32, blank=True)
    #: the CUDA version the pool's workloads need (``12.8``); blank = not checked
    cuda_version = models.CharField(max_length=16, blank=True)
    gpu_config = models.JSONField(default=dict, blank=True)
    #: where the nodes go: ``{}`` or ``{"same_nvlink_domain": true}`` (all nodes in one
    #: multi-node NVLink domain, nodepools/nvlink.py); set at creation
    placement = models.JSONField(default=dict, blank=True)
    #: how the pool's GPUs reach the tenant's scheduler: ``device-plugin`` (``nvidia.com/gpu``
    #: in the Nodes' allocatable) or ``dra`` (ResourceSlices of driver ``gpu.nvidia.com``,
    #: :mod:`nodepools.dra`); never both; set at creation
    gpu_publishing = models.CharField(
        max_length=16, choices=GpuPublishing.choices, default=GpuPublishing.DEVICE_PLUGIN
    )
    #: the capacity reservation the pool draws from (None: on-demand); while it is in force
    #: the pool's nodes are placed on its GPUs (see reservations/)
    reservation = models.ForeignKey(
        "reservations.Reservation",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="nodepools",
    )
    #: ``{"enabled", "min_node_count", "max_node_count"}`` (see nodepools/autoscaling.py)
    autoscaling = models.JSONField(default=dict, blank=True)
    #: Kubernetes version of the pool's nodes (spec; "" = the control plane's at creation)
    kubernetes_version = models.CharField(max_length=16, blank=True)
    #: a node upgrade in progress (UPGRADE_NODES): ``{"operation", "max_surge",
    #: "max_unavailable", "drain_timeout_s", "force", "urgent", "state": "rolling" | "paused",
    #: "blocked": {"node", "pods"}, "done"}``; empty when none (see nodepools/upgrades.py)
    upgrade = models.JSONField(default=dict, blank=True)
    #: an isolation change in progress: ``{"operation": id, "from_isolation": {...},
    #: "from_gpu_config": {...}, "state": "rolling" | "rolling-back", "error": {...}}``;
    #: empty when none. Kept until every node runs the pool's ``gpu_config``.
    rollout = models.JSONField(default=dict, blank=True)
    #: the tenant's disruption hook: ``{"checkpoint_deadline_s": n}`` (a planned disruption
    #: of a node asks first and waits up to n seconds for the tenant's checkpoint,
    #: :mod:`nodepools.checkpoints`); empty: no hook, planned disruptions do not wait
    disruption_hook = models.JSONField(default=dict, blank=True)
    generation = models.PositiveIntegerField(default=1)
    observed_generation = models.PositiveIntegerField(default=0)
    phase = models.CharField(max_length=16, choices=Phase.choices, default=Phase.PROVISIONING)
    conditions = models.JSONField(default=list, blank=True)
    deletion_requested_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    #: retryable provider/placement failures of node creation in a row, and since when
    #: (the reconciler backs off and gives up after ``NVKE_PROVIDER_RETRY_DEADLINE_S``)
    provision_failures = models.PositiveIntegerField(default=0)
    provision_retry_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "name"],
                condition=~Q(phase=Phase.DELETED),
                name="nodepool_cluster_name_live_uniq",
            )
        ]

    def __str__(self) -> str:
        return self.name

    def operation_target(self) -> dict:
        """The keyword arguments that name this pool to
        :func:`clusters.operations.start_operation`: tenant, cluster and target."""
        return {
            "tenant_id": self.tenant_id,
            "cluster_id": self.cluster_id,
            "target_type": TargetType.NODE_POOL,
            "target_id": self.id,
        }


def _derived(disruption: str) -> models.GeneratedField:
    """A read-only column: ``Node.disruption_step`` while the node's disruption is
    ``disruption``, else ""."""
    return models.GeneratedField(
        expression=models.Case(
            models.When(disruption=disruption, then=models.F("disruption_step")),
            default=models.Value(""),
        ),
        output_field=models.CharField(max_length=16, blank=True),
        db_persist=True,
    )


class Node(models.Model):
    """A Kubernetes node of a pool, placed on (part of) a physical host.

    ``gpu_uuids`` are the physical GPUs it holds (the fleet records the node id as their
    holder). ``ready_at``/``released_at`` bound its allocation (the billing ledger copies them).
    A deleted node keeps its row (phase DELETED) for history.

    **Disruption** (:mod:`nodepools.disruption`, its only writer): one sub-state says why the
    node is being taken out of service, ``disruption`` (:class:`~nodepools.choices.Disruption`:
    ``isolation-change``, ``upgrade``, ``repair``, ``move``, ``scale-down``, ``deletion``; ""
    when it is not), and how far it got, ``disruption_step``
    (:class:`~nodepools.choices.DisruptionStep`), with ``drain_started_at`` the clock of its
    drain (or of the verification that follows an upgrade's install). ``repair_action``,
    ``repair_reason`` and ``repair_requested_at`` are a repair's details.

    A node has at most one disruption. Where a second one is asked for while one runs:

    - **repair wins over everything**: a repair requested on a node mid-upgrade, mid-isolation
      change, moving off a host or drained by a scale-down replaces that disruption at once
      (``repair``/``requested``); the repair is an emergency and never waits for a planned
      drain. The one it replaced is not resumed half-way: it starts again from its first step
      once the repair is done and the node is READY with no disruption (an upgrade or an
      isolation change finds the node still on the old versions / GPU config and takes it
      again; a host still draining marks it ``move``/``replacing`` again; a pool still too big
      removes the repaired node's surplus as usual, unhealthy nodes first). A replaced node
      leaves the pool, so nothing resumes for it. A repair already requested stands.
    - **a move wins over planned disruptions** (upgrade, isolation change, scale-down): the
      node leaves its host anyway, so what was planned for it is dropped (the upgrade and the
      isolation change go on with the pool's other nodes; the replacement boots with the
      pool's spec). A move never replaces a repair: a node being repaired starts moving once
      its repair is done.
    - the planned disruptions never replace one another: the reconcile step runs one at a time
      (repair, isolation change, upgrade, in that order) and each takes only nodes with no
      disruption; a scale-down that is no longer wanted (the pool grew back) uncordons its
      nodes.
    - ``deletion`` (the machine is deleted now) never waits and writes nothing over another
      disruption: the node is released in the same step.

    ``config_state``, ``upgrade_state``, ``repair_state`` and ``move_state`` are the former
    per-caller fields, now read-only columns PostgreSQL derives from the one sub-state (the
    step when ``disruption`` is that caller's, else ""), kept for the API, the portal and
    queries that read them.
    """

    tenant_path = "tenant"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="+")
    nodepool = models.ForeignKey(NodePool, on_delete=models.PROTECT, related_name="nodes")
    name = models.CharField(max_length=63, unique=True)
    phase = models.CharField(
        max_length=16, choices=NodePhase.choices, default=NodePhase.PROVISIONING
    )
    host = models.ForeignKey(
        "fleet.Host", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    zone = models.CharField(max_length=64, blank=True)
    gpu_uuids = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    #: :func:`nodepools.gpu_config.config_hash` of the GPU config the node runs ("" = the
    #: pool's config when the node was created, before this field existed)
    applied_config = models.CharField(max_length=16, blank=True)
    #: what the node's GPUs run, as validated: ``[{"gpu_uuid", "mig_devices": [{"profile",
    #: "start", "size"}], "sharing": ...}]``
    gpu_layout = models.JSONField(default=list, blank=True)
    #: versions the node runs (status): Kubernetes (kubelet) and the NVIDIA driver
    kubernetes_version = models.CharField(max_length=16, blank=True)
    driver_version = models.CharField(max_length=32, blank=True)
    #: why the node is being disrupted ("" = it is not) and how far it got; the clock of its
    #: drain (see the class docstring; written only by :mod:`nodepools.disruption`)
    disruption = models.CharField(max_length=16, choices=Disruption.choices, blank=True)
    disruption_step = models.CharField(max_length=16, choices=DisruptionStep.choices, blank=True)
    drain_started_at = models.DateTimeField(null=True, blank=True)
    #: a repair's details: ``reboot`` | ``replace``, why (an Xid and its catalog action,
    #: NOT_READY), since when (also: since when the node is NOT_READY, before a repair)
    repair_action = models.CharField(max_length=16, blank=True)
    repair_reason = models.CharField(max_length=200, blank=True)
    repair_requested_at = models.DateTimeField(null=True, blank=True)
    #: the released node this one replaces, set where the count cannot say it: a pool ERROR
    #: for its spec places one node per node auto-repair released
    #: (:func:`nodepools.repair.placed_replacements`)
    replaces = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    #: the former per-caller sub-states, derived by PostgreSQL from the one above (read-only:
    #: the API's ``config_state`` / ``move_state``, the portal, the console)
    config_state = _derived(Disruption.ISOLATION_CHANGE)
    upgrade_state = _derived(Disruption.UPGRADE)
    repair_state = _derived(Disruption.REPAIR)
    move_state = _derived(Disruption.MOVE)
    #: the observed-state gate (nodepools/observed_gates.py): what the host's agent reports
    #: differently from what the node must run ("" = it agrees or nothing is waited for),
    #: since when the node waits, and the host's inventory count before the last action (a
    #: newer report is needed)
    observed_problem = models.CharField(max_length=500, blank=True)
    observed_since = models.DateTimeField(null=True, blank=True)
    observed_after = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)

    objects = NodeQuerySet.as_manager()

    class Meta:
        ordering = ["nodepool", "created_at", "name"]

    def __str__(self) -> str:
        return self.name


class DisruptionRequest(models.Model):
    """One ask before a planned disruption of nodes of a pool with a disruption hook
    (:mod:`nodepools.checkpoints`): the tenant is told (CloudEvent
    ``nodepool.disruption.requested``) and the drain waits until the request is acknowledged
    (through the API, or a pod on the node annotated ``nvke.io/checkpointed: <id>``) or its
    ``deadline`` passed; ``released_at`` is when the drain went on.

    ``nodes``: the node names; ``reason``: the planned caller of
    :data:`nodepools.disruption.POLICIES` (``upgrade``, ``scale-down`` …);
    ``acknowledged_via``: ``api`` or ``annotation``, ``acknowledged_by`` who (the principal,
    or the ``namespace/pod`` that carried the annotation)."""

    tenant_path = "tenant"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    nodepool = models.ForeignKey(
        NodePool, on_delete=models.CASCADE, related_name="disruption_requests"
    )
    nodes = models.JSONField(default=list)
    reason = models.CharField(max_length=32)
    requested_at = models.DateTimeField()
    deadline = models.DateTimeField()
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_via = models.CharField(
        max_length=16, blank=True, choices=[("api", "api"), ("annotation", "annotation")]
    )
    acknowledged_by = models.CharField(max_length=200, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at"]
        indexes = [models.Index(fields=["nodepool", "requested_at"])]

    def __str__(self) -> str:
        return f"{self.reason} of {', '.join(self.nodes)}"

    @property
    def state(self) -> str:
        """``waiting`` (asked, no answer yet), ``acknowledged``, or ``expired`` (the drain
        went on at the deadline without an answer)."""
        if self.acknowledged_at is not None:
            return "acknowledged"
        return "expired" if self.released_at is not None else "waiting"


from .defrag_models import DefragRun  # noqa: E402,F401  (registered in this app)
