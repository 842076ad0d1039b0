"""What an infrastructure provider must do (DESIGN §3 "Providers").

Providers take and return plain dataclasses: a cluster spec, a node pool spec with its rendered
GPU config and the nodes to create in; placements and status out. They never touch NVKE's
models (only ``nodepools`` writes Node rows). Errors are :class:`ProviderError` with
``retryable`` telling the reconciler whether to back off and retry.
"""

from __future__ import annotations

import abc
import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class ClusterSpec:
    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    kubernetes_version: str
    region: str
    created_at: datetime


@dataclass(frozen=True)
class ControlPlaneStatus:
    ready: bool
    endpoint: str = ""
    #: the Kubernetes version the control plane runs ("" when unknown)
    version: str = ""
    message: str = ""
    #: seconds until it is worth asking again (when not ready)
    retry_after_s: float = 1.0


@dataclass(frozen=True)
class NodeSpec:
    """One node (machine) of a pool: its id (the GPU holder id), name, GPUs (once placed),
    host (once placed), the Kubernetes version its kubelet is to run and its pinned NVIDIA
    driver ("" = no pin: the node runs the driver its host has; placement keeps a pin off
    hosts where installing it would change another node's driver, :mod:`fleet.host_driver`)."""

    id: uuid.UUID
    name: str
    created_at: datetime
    gpu_uuids: tuple[str, ...] = ()
    host_id: uuid.UUID | None = None
    kubernetes_version: str = ""
    driver_version: str = ""


@dataclass(frozen=True)
class NodePoolSpec:
    """A node pool as a provider sees it. ``gpu_config`` is the rendered GPU Operator input."""

    id: uuid.UUID
    cluster: ClusterSpec
    name: str
    gpu_model: str
    gpus_per_node: int
    isolation: dict[str, Any]
    gpu_config: dict[str, Any] = field(default_factory=dict)
    #: ``{}`` or ``{"same_nvlink_domain": True}``: every node in one multi-node NVLink domain
    placement: dict[str, Any] = field(default_factory=dict)
    #: the versions the pool's nodes should run ("" = the cluster's / no driver pin);
    #: during a node upgrade, the upgrade's target
    kubernetes_version: str = ""
    driver_version: str = ""
    #: the capacity reservation the pool draws from (None: on-demand) and its zone ("": any)
    reservation_id: uuid.UUID | None = None
    zone: str = ""
    #: the (fabric cluster UUID, clique id) of the NVLink domain its reservation holds as a
    #: whole: every node is placed there (None: any host)
    nvlink_domain: tuple[uuid.UUID, int] | None = None


@dataclass(frozen=True)
class MachinePlacement:
    """Where a node's machine runs: host and GPU UUIDs (whole GPUs, by index)."""

    node_id: uuid.UUID
    host_id: uuid.UUID | None
    hostname: str
    zone: str
    gpu_uuids: tuple[str, ...]


@dataclass(frozen=True)
class MachineStatus:
    node_id: uuid.UUID
    ready: bool
    message: str = ""
    retry_after_s: float = 1.0


@dataclass(frozen=True)
class NodeConfigStatus:
    """Whether a node runs its pool's GPU config (the GPU Operator's ``mig.config.state``).

    ``state``: ``pending`` | ``success`` | ``failed``. ``gpu_layout`` is what the node's GPUs
    run, as observed: ``[{"gpu_uuid", "mig_devices": [{"profile", "start", "size"}],
    "sharing": {"strategy", "replicas"} | None, "vgpu_devices": {type: count}}]``.
    """

    node_id: uuid.UUID
    state: str
    gpu_layout: tuple[dict[str, Any], ...] = ()
    message: str = ""
    retry_after_s: float = 1.0


@dataclass(frozen=True)
class NodeVersions:
    """A node's versions as its provider reports them after an upgrade (``""`` when unknown);
    only ``kubernetes_version`` is used (driver and NVML come from the host's agent)."""

    kubernetes_version: str
    driver_version: str
    nvml_ok: bool


@dataclass(frozen=True)
class DeletionStatus:
    """Where a control plane's deletion stands. ``leftovers``: what still exists, by kind and
    name (``"Service team/web (LoadBalancer)"``, ``"Cluster nvke/llm-1a2b3c4d"``); ``gone``
    once nothing is left."""

    gone: bool
    leftovers: tuple[str, ...] = ()
    message: str = ""


@dataclass(frozen=True)
class ReplacedMachine:
    """A node whose machine the infrastructure replaced on its own (a health check deleted
    it): NVKE releases the node and creates another in its place. ``reason`` in words."""

    node_id: uuid.UUID
    reason: str


#: the Dynamic Resource Allocation driver whose devices NVKE publishes for a DRA pool's nodes
#: (NVIDIA's k8s-dra-driver-gpu): ResourceSlice ``spec.driver``, DeviceClass name, and the
#: domain of its attributes in CEL (``device.attributes["gpu.nvidia.com"].productName``)
DRA_DRIVER = "gpu.nvidia.com"
#: the GPU Operator's per-node switch every node whose GPUs are DRA devices carries with the
#: value "false" (so a real node's device plugin does not advertise them too); on a hosted
#: cluster, a Node without it never had a ResourceSlice of NVKE's
DRA_NODE_LABEL = "nvidia.com/gpu.deploy.device-plugin"


@dataclass(frozen=True)
class TenantNode:
    """A node as the tenant's Kubernetes API must show it (``nodepools.tenant_nodes`` derives
    it from the host agent's latest report). ``capacity``/``allocatable``: resource name ->
    quantity text; ``taints``: ``[{"key", "value", "effect"}]``; ``conditions``: ``[{"type",
    "status", "reason", "message"}]`` beside the kubelet's own; ``kubelet_version``
    ``"v1.36.3"``. ``dra_devices``: None where the device plugin publishes the node's GPUs
    (in ``capacity``); else the node's DRA devices of :data:`DRA_DRIVER`, as
    ``resource.k8s.io/v1`` ResourceSlice ``spec.devices`` entries (``{"name", "attributes":
    {name: {"string"|"version"|"int": v}}, "capacity": {name: {"value": quantity}}}``).
    ``node_id``: the NVKE node it stands for (a provider whose Node names are not NVKE's, the
    ``clusterapi`` one's simulated machines, finds the node's machine by it)."""

    name: str
    labels: dict[str, str]
    taints: tuple[dict[str, str], ...]
    capacity: dict[str, str]
    allocatable: dict[str, str]
    conditions: tuple[dict[str, str], ...]
    unschedulable: bool
    kubelet_version: str
    dra_devices: tuple[dict[str, Any], ...] | None = None
    node_id: uuid.UUID | None = None


@dataclass(frozen=True)
class Evictions:
    """One look at a node's pods. ``remaining``: ``"namespace/name (why)"`` for each pod still
    on the node (refused by a budget, without a controller, or terminating); ``evicted``: the
    pods evicted by this call; ``deleted``: those deleted without the Eviction API (force)."""

    remaining: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


class ProviderError(Exception):
    """A provider call failed. ``code`` is stable; ``retryable`` says if trying again can help."""

    code = "provider_error"

    def __init__(self, message: str, *, retryable: bool = True, code: str | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        if code:
            self.code = code


@contextlib.contextmanager
def api_refusals(refused: str) -> Iterator[None]:
    """A Kubernetes API's refusals inside (``kubernetes.client.rest.ApiException``) raised as
    retryable ProviderErrors ``"<refused> (<status> <reason>)"``, code ``cluster_api_error``:
    the tenant cluster's API of the ``hosted`` provider, a workload cluster's of
    ``clusterapi``."""
    from kubernetes.client.rest import ApiException

    try:
        yield
    except ApiException as exc:
        raise ProviderError(
            f"{refused} ({exc.status} {exc.reason})", code="cluster_api_error"
        ) from exc


class InsufficientCapacity(ProviderError):
    """No capacity for the requested machines; nothing was placed (a host busy with another
    claim or an agent report is a retryable ``placement_contended`` ProviderError instead)."""

    code = "insufficient_capacity"


class Provider(abc.ABC):
    """Interface every provider implements (``simulated``, ``clusterapi``)."""

    name: str
    #: whether :meth:`sync_nodes` writes Nodes (NVKE then derives them for it)
    publishes_nodes: bool = False
    #: whether :meth:`sync_nodes` also gets the nodes still ``PROVISIONING`` (a Cluster API
    #: machine's Node is there once the machine boots, before NVKE counts the node ready)
    publishes_booting_nodes: bool = False
    #: whether :meth:`sync_addons` applies the pools' GPU add-ons to the cluster's API
    applies_addons: bool = False

    def kubernetes_minors(self) -> tuple[str, ...] | None:
        """The Kubernetes minors (``("1.36", "1.37")``) this provider can run control planes
        and kubelets of, or None when it can run any the catalog supports. Cluster creation
        and upgrades refuse the others (:func:`clusters.versions.require_supported`), and the
        catalog, ``available_upgrades`` and the portal offer only these. Default: None (the
        ``simulated`` provider runs no Kubernetes; ``clusterapi`` renders any version and
        the infrastructure's machine images decide)."""
        return None

    @abc.abstractmethod
    def ensure_control_plane(self, cluster: ClusterSpec, now: datetime) -> ControlPlaneStatus:
        """Create the control plane if needed and report whether it is ready."""

    @abc.abstractmethod
    def delete_control_plane(self, cluster: ClusterSpec) -> DeletionStatus:
        """Delete the control plane (and what the cluster made outside itself: load
        balancers, volumes); ``gone`` when nothing is left. Called again until then."""

    @abc.abstractmethod
    def ensure_machines(self, pool: NodePoolSpec, nodes: list[NodeSpec]) -> list[MachinePlacement]:
        """Create machines for ``nodes``, all or none (raises InsufficientCapacity).

        Must be called inside the caller's transaction; idempotent per node id.
        """

    @abc.abstractmethod
    def machine_status(self, pool: NodePoolSpec, node: NodeSpec, now: datetime) -> MachineStatus:
        """Whether a node's machine has joined the cluster and is Ready."""

    @abc.abstractmethod
    def delete_machines(self, pool: NodePoolSpec, nodes: list[NodeSpec]) -> None:
        """Delete the machines of ``nodes`` and release what they held. Idempotent."""

    @abc.abstractmethod
    def kubeconfig(self, cluster: ClusterSpec) -> str:
        """An admin kubeconfig (YAML) for the cluster."""

    def sync_nodes(self, cluster: ClusterSpec, nodes: list[TenantNode]) -> None:
        """Make the cluster's API hold exactly ``nodes`` among the Nodes NVKE made: create
        the missing, update labels, taints, resources, conditions and ``unschedulable`` of the
        others, delete the rest; likewise one ResourceSlice of :data:`DRA_DRIVER` per node
        with ``dra_devices`` (and that driver's DeviceClass while any exists), none for the
        others. Default: nothing (a provider whose kubelets and DRA driver publish it)."""
        return None

    def sync_addons(self, cluster: ClusterSpec, pools: list[NodePoolSpec]) -> dict[uuid.UUID, str]:
        """Make the cluster's API hold the GPU add-ons rendered for ``pools`` (every pool of
        the cluster not being deleted): the GPU Operator inputs of their ``gpu_config``, the
        ClusterPolicy, the ComputeDomains of pools kept in one NVLink domain, with their CRDs;
        and none of other pools'. Returns the API's refusals by pool id (an object rendered
        for several pools: each of them); raises :class:`ProviderError` when the API does not
        answer. Default: nothing (the ``clusterapi`` provider applies a pool's add-ons as its
        machines come up, in :meth:`machine_status`)."""
        return {}

    def replaced_machines(self, pool: NodePoolSpec, nodes: list[NodeSpec]) -> list[ReplacedMachine]:
        """Of ``nodes`` (READY), those whose machine the infrastructure replaced by itself
        (a MachineHealthCheck remediation). Default: none (NVKE repairs nodes itself)."""
        return []

    # GPU reconfiguration of a running node (an isolation change, node by node). Not abstract
    # so that a provider without it still loads; the reconciler fails the operation with the
    # error's code.

    def drain_blockers(self, pool: NodePoolSpec, node: NodeSpec) -> list[str]:
        """Pods that keep the node from draining (a PodDisruptionBudget at its minimum, a pod
        without a controller): ``["namespace/name (reason)"]``; empty when it can drain."""
        return []

    def upgrade_node(
        self, pool: NodePoolSpec, node: NodeSpec, *, kubernetes_version: str, driver_version: str
    ) -> None:
        """Upgrade a drained node's kubelet and/or NVIDIA driver in place."""
        raise ProviderError(
            f"provider {self.name!r} cannot upgrade nodes", retryable=False, code="not_supported"
        )

    def node_versions(self, pool: NodePoolSpec, node: NodeSpec) -> NodeVersions:
        """The node's kubelet version as the Kubernetes Node object says it. (The driver and
        NVML are NOT taken from here: the reconciler reads them from the host's agent,
        :mod:`nodepools.observed_gates`; providers may leave them blank.)"""
        raise ProviderError(
            f"provider {self.name!r} cannot report node versions",
            retryable=False,
            code="not_supported",
        )

    def reboot_node(self, pool: NodePoolSpec, node: NodeSpec) -> None:
        """Restart a drained node's machine (auto-repair); its GPUs are reset on the way.
        Whether it worked is the host's agent's to say, not the provider's."""
        raise ProviderError(
            f"provider {self.name!r} cannot reboot nodes", retryable=False, code="not_supported"
        )

    def cordon_node(self, pool: NodePoolSpec, node: NodeSpec) -> None:
        """Mark the node unschedulable (idempotent). Default: :meth:`drain_node`, which
        cordons as it starts the evictions (``not_supported`` where the provider cannot)."""
        self.drain_node(pool, node)

    def evict_pods(self, pool: NodePoolSpec, node: NodeSpec, *, force: bool) -> Evictions:
        """One look at the node's drain: ask its pods to leave (``force``: without consulting
        disruption budgets) and say which are still there and why. Idempotent.
        Default: :meth:`drain_blockers`, then :meth:`drain_node` once none blocks (with
        ``force`` nothing: the machine's deletion takes the pods)."""
        if force:
            return Evictions()
        blocked = self.drain_blockers(pool, node)
        if not blocked:
            self.drain_node(pool, node)
        return Evictions(remaining=list(blocked))

    def pod_annotations(self, pool: NodePoolSpec, node: NodeSpec, key: str) -> dict[str, str]:
        """The value of annotation ``key`` on each pod bound to the node that carries it:
        ``{"namespace/name": value}`` (the checkpoint ack ``nvke.io/checkpointed``,
        :mod:`nodepools.checkpoints`). Default: ``{}`` (a provider that cannot read the
        tenant's pods: acks come through the API only)."""
        return {}

    def drain_node(self, pool: NodePoolSpec, node: NodeSpec) -> bool:
        """Cordon the node and evict its GPU pods; True once drained. Idempotent."""
        raise ProviderError(
            f"provider {self.name!r} cannot drain nodes", retryable=False, code="not_supported"
        )

    def apply_node_config(self, pool: NodePoolSpec, node: NodeSpec) -> None:
        """Give the (drained) node ``pool.gpu_config``: its labels (``nvidia.com/mig.config``
        …) and the configs they name, so MIG Manager / the device plugin reconfigure it."""
        raise ProviderError(
            f"provider {self.name!r} cannot reconfigure nodes",
            retryable=False,
            code="not_supported",
        )

    def node_config_status(
        self, pool: NodePoolSpec, node: NodeSpec, now: datetime
    ) -> NodeConfigStatus:
        """What the GPU Operator says of the node's config (``mig.config.state``: pending,
        success, failed) and the sharing / vGPU devices its device plugin runs. The MIG
        geometry is NOT taken from here: the reconciler reads it from the host's agent."""
        raise ProviderError(
            f"provider {self.name!r} cannot report node GPU config",
            retryable=False,
            code="not_supported",
        )
