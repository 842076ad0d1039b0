"""The tenant cluster's view of its nodes: each node of a pool as a ``Node`` in the cluster's API,
derived from what its host's agent last reported (DESIGN §3 "Inside the tenant's cluster").

What a real host's kubelet, NVIDIA device plugin and GPU Feature Discovery (GFD) would publish,
:func:`tenant_node` derives in ONE place, for real and simulated hosts alike, from the host's
latest observed facts (:func:`fleet.agent_facts.host_facts`: the GPUs the agent lists, their MIG
mode and GPU instances, their health) — never from what NVKE asked for. The pool's rendered GPU
config (:mod:`nodepools.gpu_config`) only says how the device plugin is configured (MIG
strategy, time-slicing / MPS replicas), as the ConfigMap does on a real cluster:

* resources (capacity / allocatable), as the device plugin advertises them: ``nvidia.com/gpu``
  = GPUs x replicas (strategy ``none``), one per MIG device (``single``), or
  ``nvidia.com/mig-<profile>`` per MIG device (``mixed``; a GPU with MIG off there is one
  ``nvidia.com/gpu``); a GPU the fleet holds UNHEALTHY (Xid 79, a failed health check) stays
  in capacity and leaves allocatable, as the device plugin marks a device unhealthy;
* GFD labels: ``nvidia.com/gpu.present``, ``gpu.product`` (NVML name, ``-MIG-<profile>`` under
  ``single``, ``-SHARED`` when shared), ``gpu.memory`` (MiB), ``gpu.count``, ``gpu.replicas``,
  ``gpu.sharing-strategy``, ``mig.capable``, ``mig.strategy``, ``mig-<profile>.count`` /
  ``.product`` under ``mixed``, ``mig.config.state`` (``success`` once the GPUs run the
  pool's MIG config, else ``pending``), ``cuda.driver-version.*``, ``gpu.clique``
  (``<fabric cluster UUID>.<clique id>`` on a multi-node NVLink domain); the pool's own labels
  (``nvke.io/nodepool`` …) and the taint ``nvidia.com/gpu=present:NoSchedule``;
* a pool with ``gpu_publishing: dra`` publishes no GPU resource: its GPUs are the DRA
  devices of one ResourceSlice per node (``TenantNode.dra_devices``, :mod:`nodepools.dra`);
* the condition ``GpuXidCritical`` (as GKE's ``XidCriticalError``): True while a GPU of the node
  has an open unhealthy interval caused by an Xid, naming the GPU and the Xid.

:func:`sync_cluster_nodes` is the one writer: it hands the derived nodes of every pool of a
cluster to the provider (:meth:`clusters.providers.base.Provider.sync_nodes`), which creates,
updates and deletes the API's Nodes (and DRA pools' ResourceSlices): ``hosted``, and
``clusterapi`` where its machines are simulated (``NVKE_CLUSTERAPI_SIMULATED_NODES``: it also
gets the nodes still ``PROVISIONING`` and names each Node after its Machine's); the reconciler
of node pools calls it at every step and the ``gpu_health_changed`` receiver through
:func:`nodepools.tasks.sync_tenant_nodes`.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

from django.db.models import QuerySet

from clusters.providers import get_provider
from clusters.providers.base import DRA_NODE_LABEL, TenantNode
from clusters.versions import complete
from fleet.agent_facts import GpuFacts, HostFacts, host_facts
from fleet.models import GpuHealthInterval

from .choices import GpuPublishing, NodePhase
from .dra import gpu_devices
from .gpu_config import GPU_TAINT, label_safe, product_label, resource_suffix
from .models import Node, NodePool
from .observed_gates import expectation
from .shared_host_nodes import node_gpu_instances

if TYPE_CHECKING:
    from clusters.models import Cluster

#: nodes that exist as machines (placed and booted): they are Nodes in the cluster's API
IN_API = (
    NodePhase.READY,
    NodePhase.NOT_READY,
    NodePhase.CORDONED,
    NodePhase.DRAINING,
    NodePhase.REPAIRING,
)
#: nodes the tenant's scheduler must not place new pods on (``spec.unschedulable``)
UNSCHEDULABLE = (NodePhase.CORDONED, NodePhase.DRAINING, NodePhase.REPAIRING)
#: the agent reports no CPU / memory yet: KWOK's own defaults for them, so that only GPUs
#: constrain scheduling; ``pods`` is the kubelet's default ``maxPods``
BASE_RESOURCES = {"cpu": "1k", "memory": "1Ti", "pods": "110"}
#: rendered labels recomputed here from what the host reports
_OBSERVED_PREFIXES = ("nvidia.com/gpu.product", "nvidia.com/mig-")
XID_CONDITION = "GpuXidCritical"


def _sharing(config: dict[str, Any]) -> tuple[str, int]:
    """(``time-slicing`` | ``mps`` | ``none``, replicas) of the pool's device-plugin config."""
    sharing = (config.get("device_plugin_config") or {}).get("sharing") or {}
    for key, name in (("timeSlicing", "time-slicing"), ("mps", "mps")):
        if key in sharing:
            resources = sharing[key].get("resources") or [{}]
            return name, int(resources[0].get("replicas") or 1)
    return "none", 1


def _mig_config_state(pool: NodePool, gpus: list[GpuFacts]) -> str:
    """``success`` when every GPU runs the pool's MIG config as reported, else ``pending``."""
    expected = expectation(pool, driver="")
    if expected.mig_enabled is None:
        return "success"
    for gpu in gpus:
        if (gpu.mig_mode == "enabled") != expected.mig_enabled:
            return "pending"
        if expected.mig_enabled and gpu.instances != expected.instances:
            return "pending"
    return "success"


def tenant_node(
    node: Node,
    pool: NodePool,
    facts: HostFacts | None,
    *,
    region: str,
    kubelet_version: str,
    xids: dict[str, int] | None = None,
    own: dict[str, tuple[tuple[str, int, int], ...]] | None = None,
    profile_ids: dict[str, int] | None = None,
) -> TenantNode:
    """The Node ``node`` is in its cluster's API, from ``facts`` (its host's latest agent
    report; None: no GPU is published). ``xids``: GPU UUID -> the Xid of its open unhealthy
    interval. ``own``: a VM node of a shared host's own GPU instances per GPU
    (:func:`nodepools.shared_host_nodes.node_gpu_instances`; the GPU's other instances are
    other tenants'), None for a whole-GPU node. ``kubelet_version``: ``"v1.36.3"``.
    ``profile_ids``: the pool's GPU model's :func:`mig_profile_ids`, naming a DRA pool's MIG
    devices. Pure: reads nothing else."""
    config = pool.gpu_config or {}
    strategy = ((config.get("device_plugin_config") or {}).get("flags") or {}).get(
        "migStrategy"
    ) or (config.get("mig_strategy") or "none")
    sharing, replicas = _sharing(config)
    xids = xids or {}
    gpus: list[GpuFacts] = []
    if facts is not None:
        for gpu_uuid in node.gpu_uuids:
            gpu = facts.gpus.get(gpu_uuid)
            if gpu is not None and gpu.host_id == facts.host_id and not gpu.missing:
                gpus.append(gpu)

    capacity: Counter[str] = Counter()
    allocatable: Counter[str] = Counter()
    profiles: Counter[str] = Counter()
    for gpu in gpus:
        mig = gpu.mig_mode == "enabled" and strategy != "none"
        instances = gpu.instances
        if own is not None:
            mine = set(own.get(gpu.uuid, ()))
            instances = tuple(i for i in instances if i in mine)
        if mig:
            devices = Counter(
                "nvidia.com/gpu" if strategy == "single" else f"nvidia.com/mig-{resource_suffix(p)}"
                for p, _, _ in instances
            )
            profiles.update(p for p, _, _ in instances)
        else:
            devices = Counter({"nvidia.com/gpu": replicas})
        capacity.update(devices)
        if gpu.health == "HEALTHY":
            allocatable.update(devices)
    if config.get("vgpu_device_manager_config"):
        # vGPU devices are the vGPU device manager's; the agent does not list them yet
        capacity = allocatable = Counter(config.get("resources") or {})
    dra_devices = None
    if pool.gpu_publishing == GpuPublishing.DRA:
        # the GPUs are DRA devices of the node's ResourceSlice, never also nvidia.com/gpu
        capacity, allocatable = Counter(), Counter()
        dra_devices = gpu_devices(gpus, facts, profile_ids)

    rendered = config.get("labels") or {}
    labels = {k: v for k, v in rendered.items() if not k.startswith(_OBSERVED_PREFIXES)}
    labels.update(
        {
            "kubernetes.io/hostname": node.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "topology.kubernetes.io/region": region,
            "nvidia.com/mig.capable": "true" if pool.gpu_model.mig_capable else "false",
            "nvidia.com/mig.strategy": strategy,
            "nvidia.com/gpu.sharing-strategy": sharing,
            "nvidia.com/gpu.replicas": str(replicas),
        }
    )
    if node.zone:
        labels["topology.kubernetes.io/zone"] = node.zone
    if dra_devices is not None:
        # the GPU Operator's switch (also rendered): the one mark of a Node whose GPUs are
        # DRA devices, by which the provider knows whether to look for slices at all
        labels[DRA_NODE_LABEL] = "false"
    if gpus:
        product = product_label(gpus[0].product_name or pool.gpu_model.name)
        shared = "-SHARED" if sharing != "none" else ""
        labels["nvidia.com/gpu.present"] = "true"
        if strategy == "single" and profiles:
            profile = sorted(profiles)[0]
            labels["nvidia.com/gpu.product"] = f"{product}-MIG-{label_safe(profile)}{shared}"
            labels["nvidia.com/gpu.count"] = str(sum(profiles.values()))
        else:
            labels["nvidia.com/gpu.product"] = f"{product}{shared}"
            labels["nvidia.com/gpu.count"] = str(len(gpus))
        if gpus[0].memory_total_bytes:
            labels["nvidia.com/gpu.memory"] = str(gpus[0].memory_total_bytes // 2**20)
        if strategy == "mixed":
            for profile, count in profiles.items():
                labels[f"nvidia.com/mig-{resource_suffix(profile)}.count"] = str(count)
                labels[f"nvidia.com/mig-{resource_suffix(profile)}.product"] = (
                    f"{product}-MIG-{label_safe(profile)}"
                )
        if "nvidia.com/mig.config" in labels:
            labels["nvidia.com/mig.config.state"] = _mig_config_state(pool, gpus)
    if facts is not None and facts.driver_version:
        parts = facts.driver_version.split(".")
        labels["nvidia.com/cuda.driver-version.full"] = facts.driver_version
        for key, value in zip(("major", "minor", "revision"), parts, strict=False):
            labels[f"nvidia.com/cuda.driver-version.{key}"] = value
    if facts is not None and facts.nvlink_domain is not None:
        cluster_uuid, clique = facts.nvlink_domain
        labels["nvidia.com/gpu.clique"] = f"{cluster_uuid}.{clique}"

    critical = sorted((g.uuid, xids[g.uuid]) for g in gpus if g.uuid in xids)
    if critical:
        condition = {
            "type": XID_CONDITION,
            "status": "True",
            "reason": "XidCriticalError",
            "message": "; ".join(f"{u}: Xid {x}" for u, x in critical),
        }
    else:
        condition = {
            "type": XID_CONDITION,
            "status": "False",
            "reason": "NoXidCriticalError",
            "message": "no GPU of the node reports a critical Xid",
        }
    return TenantNode(
        name=node.name,
        labels=labels,
        taints=tuple(dict(t) for t in (config.get("taints") or [GPU_TAINT])),
        capacity={**BASE_RESOURCES, **{k: str(v) for k, v in sorted(capacity.items())}},
        allocatable={**BASE_RESOURCES, **{k: str(v) for k, v in sorted(allocatable.items())}},
        conditions=(condition,),
        unschedulable=node.phase in UNSCHEDULABLE,
        kubelet_version=kubelet_version,
        dra_devices=dra_devices,
        node_id=node.id,
    )


def mig_profile_ids(gpu_model_id: Any) -> dict[str, int]:
    """``{profile: GPU instance profile id}`` of a GPU model's MIG profiles whose id the
    catalog knows (``nvidia-smi mig -lgip``'s ID; H100: ``1g.10gb`` 19), for DRA device
    names. One query."""
    from catalog.models import MigProfile

    return dict(
        MigProfile.objects.filter(
            gpu_model_id=gpu_model_id, nvidia_smi_id__isnull=False
        ).values_list("name", "nvidia_smi_id")
    )


def kubelet_version(node: Node, control_plane_version: str) -> str:
    """``v<major.minor.patch>`` of the node's kubelet: the node's version, completed with the
    control plane's patch when the node only names a minor it shares (``1.36`` + ``1.36.3``:
    :func:`clusters.versions.complete`)."""
    return "v" + complete(node.kubernetes_version or control_plane_version, control_plane_version)


def cluster_tenant_nodes(
    cluster_id: uuid.UUID | str, phases: tuple[str, ...] = IN_API
) -> list[TenantNode]:
    """Every node of the cluster's pools in ``phases`` (default: placed and booted,
    :data:`IN_API`), derived from its host's latest report."""
    return tenant_nodes_of(
        Node.objects.filter(cluster_id=cluster_id, phase__in=phases)
        .select_related("nodepool__gpu_model", "cluster")
        .order_by("name")
    )


def tenant_nodes_of(queryset: QuerySet[Node]) -> list[TenantNode]:
    """The nodes of ``queryset`` (with ``nodepool__gpu_model`` and ``cluster``), each
    derived from its host's latest report by :func:`tenant_node`."""
    nodes = list(queryset)
    uuids = [u for n in nodes for u in n.gpu_uuids]
    xids = dict(
        GpuHealthInterval.objects.filter(
            gpu_uuid__in=uuids, ended_at__isnull=True, xid__isnull=False
        ).values_list("gpu_uuid", "xid")
    )
    profile_ids = {  # one query per GPU model of the cluster's DRA pools
        model: mig_profile_ids(model)
        for model in {
            n.nodepool.gpu_model_id for n in nodes if n.nodepool.gpu_publishing == GpuPublishing.DRA
        }
    }
    out = []
    for node in nodes:
        facts = host_facts(node.host_id, node.gpu_uuids) if node.host_id else None
        cluster = node.cluster
        out.append(
            tenant_node(
                node,
                node.nodepool,
                facts,
                region=cluster.region,
                kubelet_version=kubelet_version(
                    node, cluster.control_plane_version or cluster.kubernetes_version
                ),
                xids=xids,
                own=node_gpu_instances(node, facts),
                profile_ids=profile_ids.get(node.nodepool.gpu_model_id),
            )
        )
    return out


def sync_cluster_nodes(
    cluster_id: uuid.UUID | str, cluster: Cluster | None = None
) -> list[TenantNode]:
    """The one writer of a cluster's Nodes: hands :func:`cluster_tenant_nodes` to the
    cluster's provider (which makes its API hold exactly them). Returns what it handed over.
    ``cluster``: the row when the caller has it (the node pool reconciler: its provider is
    all that is read before the provider says whether it publishes Nodes).
    Raises :class:`clusters.providers.base.ProviderError` when the API refuses."""
    from clusters.models import Cluster
    from clusters.specs import cluster_spec

    if cluster is None:
        cluster = Cluster.objects.get(pk=cluster_id)
    provider = get_provider(cluster.provider)
    if not provider.publishes_nodes:
        return []
    phases = (NodePhase.PROVISIONING, *IN_API) if provider.publishes_booting_nodes else IN_API
    nodes = cluster_tenant_nodes(cluster_id, phases)
    provider.sync_nodes(cluster_spec(cluster), nodes)
    return nodes
