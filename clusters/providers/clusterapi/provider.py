"""The ``clusterapi`` provider: NVKE clusters as Cluster API objects on a management cluster.

What each call does (objects: :mod:`.render`; status mapping: :mod:`.status`; API calls:
:mod:`.client`, the official ``kubernetes`` client, server-side apply as ``nvke``):

* ``ensure_control_plane``: apply the ``Cluster`` and ``KubeadmControlPlane``, read them back;
* ``ensure_machines``: reserve GPUs on NVKE's fleet inventory (the same placement as the
  ``simulated`` provider: quotas, capacity and billing stay exact), then - once the caller's
  transaction commits - add the nodes to the pool's ``MachineDeployment`` (annotation
  ``nvke.io/nodes``, ``replicas``) with its ``KubeadmConfigTemplate`` and
  ``MachineHealthCheck``;
* ``machine_status``: make sure the node is in the MachineDeployment (a lost apply is redone
  here: level-triggered) and the pool's GPU Operator objects are in the workload cluster, bind
  the node to a Machine (annotation ``nvke.io/node-id`` on the oldest unbound Machine), and
  report it ready once the Machine runs a Ready Node whose GPUs run the pool's config;
* ``delete_machines``: mark the nodes' Machines ``cluster.x-k8s.io/delete-machine``, take the
  nodes out of the MachineDeployment (no nodes left: the MachineDeployment, its health check
  and templates are deleted), then release the GPUs;
* ``drain_node`` / ``apply_node_config`` / ``node_config_status``: on the workload cluster
  (its kubeconfig is the Secret ``<cluster>-kubeconfig`` Cluster API writes): cordon and evict
  every pod that requests an ``nvidia.com/*`` resource (Eviction API, so disruption budgets
  hold), set the Node's GPU selector labels, then read what MIG Manager and GPU Feature
  Discovery report; a node NVKE cordoned is uncordoned when its config is confirmed;
* ``delete_control_plane``: delete the ``Cluster`` (Cluster API deletes what it owns) and
  NVKE's leftovers; done when none is left;
* ``kubeconfig``: the admin kubeconfig from ``<cluster>-kubeconfig``.
* ``sync_nodes`` (only with ``NVKE_CLUSTERAPI_SIMULATED_NODES``, test beds whose machines
  CAPD simulates: no kubelet or GPU Operator publishes their Nodes): the Node of each bound
  Machine, derived from its host's agent report as for hosted clusters
  (:mod:`.simulated_nodes`), written by the Node sync after every reconcile step;
  ``machine_status`` waits for KWOK to post a joined machine's Node Ready.

Tested against real Cluster API controllers on a real kube-apiserver, with CAPD's in-memory
backend simulating the machines (docs/operator/cluster-api.md, tests/clusterapi/).
"""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import Iterator
from datetime import datetime
from functools import cached_property
from typing import Any

from django.conf import settings
from django.db import transaction

from ..base import (
    ClusterSpec,
    ControlPlaneStatus,
    DeletionStatus,
    MachinePlacement,
    MachineStatus,
    NodeConfigStatus,
    NodePoolSpec,
    NodeSpec,
    NodeVersions,
    Provider,
    ProviderError,
    ReplacedMachine,
    TenantNode,
    api_refusals,
)
from ..fleet_claims import claim_fleet_gpus
from . import render, status
from .client import ApiError, KubeApi, management_api, workload_api
from .render import (
    CLUSTER,
    CONFIG_MAP,
    GPU_OPERATOR_NAMESPACE,
    KUBEADM_CONFIG_TEMPLATE,
    KUBEADM_CONTROL_PLANE,
    MACHINE,
    MACHINE_DEPLOYMENT,
    MACHINE_HEALTH_CHECK,
    NODE,
    PERSISTENT_VOLUME_CLAIM,
    POD,
    POD_DISRUPTION_BUDGET,
    SECRET,
    SERVICE,
)

log = logging.getLogger(__name__)

#: optimistic-concurrency retries of a read-modify-apply (MachineDeployment, ConfigMaps)
APPLY_ATTEMPTS = 3


def _annotations(obj: dict[str, Any] | None) -> dict[str, str]:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


def _name(obj: dict[str, Any]) -> str:
    return obj["metadata"]["name"]


def holds_gpu(pod: dict[str, Any]) -> bool:
    """A pod holds a GPU when a container (or init container) requests or limits any
    ``nvidia.com/*`` resource (whole GPUs, MIG devices, shared replicas, vGPU types) - whether
    or not a process runs on the GPU right now."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            if any(str(k).startswith("nvidia.com/") for k in resources.get(section) or {}):
                return True
    return False


def _evictable(pod: dict[str, Any]) -> bool:
    """Pods a drain evicts: running or pending, not a DaemonSet's (it would come back; the
    GPU Operator's own pods are DaemonSet pods), not a static (mirror) pod."""
    meta = pod.get("metadata") or {}
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    return not any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or [])


class ClusterApiProvider(Provider):
    """Cluster API on the management cluster named by ``NVKE_CLUSTERAPI_KUBECONFIG``."""

    name = "clusterapi"
    #: a simulated machine's Node is written once the machine boots (simulated_nodes.py)
    publishes_booting_nodes = True

    @property
    def publishes_nodes(self) -> bool:  # type: ignore[override]
        """Only where the machines are simulated (``NVKE_CLUSTERAPI_SIMULATED_NODES``): real
        machines' kubelets and GPU Operator publish their Nodes."""
        return bool(settings.NVKE_CLUSTERAPI_SIMULATED_NODES)

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        namespace: str | None = None,
        infrastructure: str | None = None,
    ) -> None:
        self.kubeconfig_path = (
            kubeconfig if kubeconfig is not None else settings.NVKE_CLUSTERAPI_KUBECONFIG
        )
        self.namespace = namespace or settings.NVKE_CLUSTERAPI_NAMESPACE
        try:
            self.infrastructure = render.Infrastructure.parse(
                infrastructure or settings.NVKE_CLUSTERAPI_INFRASTRUCTURE
            )
        except ValueError as exc:
            raise ProviderError(
                str(exc), retryable=False, code="clusterapi_not_configured"
            ) from exc
        #: pods that blocked the last :meth:`drain_node` (``namespace/name``), for messages
        self.last_drain_blockers: list[str] = []

    @cached_property
    def api(self) -> KubeApi:
        """The management cluster."""
        return management_api(self.kubeconfig_path)

    # --- control plane --------------------------------------------------------------------------

    def ensure_control_plane(self, cluster: ClusterSpec, now: datetime) -> ControlPlaneStatus:
        with _render_errors():
            objects = render.render_cluster(
                cluster,
                namespace=self.namespace,
                infrastructure=self.infrastructure,
                control_plane_replicas=settings.NVKE_CLUSTERAPI_CONTROL_PLANE_REPLICAS,
            )
        for obj in objects:
            self.api.apply(obj)
        return status.control_plane_status(
            self.api.get(CLUSTER, render.cluster_name(cluster), self.namespace),
            self.api.get(KUBEADM_CONTROL_PLANE, render.control_plane_name(cluster), self.namespace),
            desired_version=objects[1]["spec"]["version"],
        )

    def delete_control_plane(self, cluster: ClusterSpec) -> DeletionStatus:
        """First what the cluster made outside itself (its LoadBalancer Services and
        PersistentVolumeClaims in the workload cluster: load balancers and volumes that keep
        costing money), deleted and waited for; then the ``Cluster`` (Cluster API deletes what
        it owns) and NVKE's objects. Each call reports what is still there."""
        name = render.cluster_name(cluster)
        capi_cluster = self.api.get(CLUSTER, name, self.namespace)
        deleting = bool((capi_cluster or {}).get("metadata", {}).get("deletionTimestamp"))
        if capi_cluster is not None and not deleting:
            left = self._delete_workload_leftovers(cluster)
            if left:
                return DeletionStatus(
                    gone=False,
                    leftovers=tuple(left),
                    message="waiting for the workload cluster's load balancers and volumes",
                )
            self.api.delete(CLUSTER, name, self.namespace)
        if self.api.get(CLUSTER, name, self.namespace) is not None:
            # Cluster API deletes machines, control plane and infrastructure in its order (the
            # DevCluster / Metal3Cluster last): nothing of it is touched meanwhile
            return DeletionStatus(
                gone=False,
                leftovers=(f"Cluster {self.namespace}/{name}",),
                message="waiting for Cluster API to delete the cluster",
            )
        if self.publishes_nodes:  # the simulated machines are gone: so are their Nodes
            self.sync_nodes(cluster, [])
        selector = {render.L_CLUSTER_ID: str(cluster.id)}
        left = []
        for kind in (
            MACHINE_HEALTH_CHECK,
            MACHINE_DEPLOYMENT,
            KUBEADM_CONFIG_TEMPLATE,
            KUBEADM_CONTROL_PLANE,
            *self._infrastructure_kinds(),
        ):
            for obj in self.api.list(kind, self.namespace, label_selector=selector):
                left.append(f"{kind.kind} {self.namespace}/{_name(obj)}")
                if not (obj.get("metadata") or {}).get("deletionTimestamp"):
                    self.api.delete(kind, _name(obj), self.namespace)
        if left:
            log.info("Cluster API objects of %s still being deleted: %s", name, ", ".join(left))
        return DeletionStatus(
            gone=not left,
            leftovers=tuple(left),
            message="waiting for Cluster API to delete the cluster" if left else "",
        )

    def _infrastructure_kinds(self) -> list[render.Kind]:
        if not self.infrastructure.managed:
            return []
        kinds = [self.infrastructure.kind("MachineTemplate")]
        if self.infrastructure.prefix == "Dev":
            kinds.append(self.infrastructure.kind("Cluster"))
        return kinds

    def _delete_workload_leftovers(self, cluster: ClusterSpec) -> list[str]:
        """Delete the workload cluster's LoadBalancer Services and PVCs; what still exists
        (``"Service ns/name (LoadBalancer)"``). A cluster whose kubeconfig Cluster API never
        wrote has none."""
        try:
            workload = self._workload(cluster)
        except ProviderError as exc:
            if exc.code == "kubeconfig_not_ready":
                return []
            raise
        left = []
        for svc in workload.list(SERVICE):
            if (svc.get("spec") or {}).get("type") != "LoadBalancer":
                continue
            meta = svc["metadata"]
            left.append(f"Service {meta['namespace']}/{meta['name']} (LoadBalancer)")
            if not meta.get("deletionTimestamp"):
                workload.delete(SERVICE, meta["name"], meta["namespace"])
        for pvc in workload.list(PERSISTENT_VOLUME_CLAIM):
            meta = pvc["metadata"]
            left.append(f"PersistentVolumeClaim {meta['namespace']}/{meta['name']}")
            if not meta.get("deletionTimestamp"):
                workload.delete(PERSISTENT_VOLUME_CLAIM, meta["name"], meta["namespace"])
        return left

    def kubeconfig(self, cluster: ClusterSpec) -> str:
        return self._kubeconfig(cluster)

    def _kubeconfig(self, cluster: ClusterSpec) -> str:
        secret = self.api.get(SECRET, render.kubeconfig_secret_name(cluster), self.namespace)
        value = ((secret or {}).get("data") or {}).get("value")
        if not value:
            raise ProviderError(
                f"Cluster API has not written the kubeconfig of {render.cluster_name(cluster)} yet",
                retryable=True,
                code="kubeconfig_not_ready",
            )
        return base64.b64decode(value).decode()

    def _workload(self, cluster: ClusterSpec) -> KubeApi:
        override = settings.NVKE_CLUSTERAPI_WORKLOAD_KUBECONFIG
        if override:  # a test bed: one API server plays every workload cluster
            api = management_api(override)
            api.name = f"workload cluster {render.cluster_name(cluster)}"
            return api
        return workload_api(self._kubeconfig(cluster), name=render.cluster_name(cluster))

    # --- the Nodes of simulated machines ------------------------------------------------------

    def sync_nodes(self, cluster: ClusterSpec, nodes: list[TenantNode]) -> None:
        """Where the machines are simulated: the workload API holds the Node of each of
        ``nodes`` a live Machine of the cluster runs, named after the Machine's ``nodeRef``
        (:mod:`.simulated_nodes`); the cluster's other Nodes NVKE made are deleted."""
        if not self.publishes_nodes:
            return
        from . import simulated_nodes

        machines = self.api.list(
            MACHINE,
            self.namespace,
            label_selector={render.CAPI_CLUSTER_NAME_LABEL: render.cluster_name(cluster)},
        )
        workload = self._workload(cluster)
        with api_refusals("the workload cluster's API refused NVKE's Nodes"):
            simulated_nodes.sync(workload.api_client, cluster.id, machines, nodes)

    # --- machines -------------------------------------------------------------------------------

    def ensure_machines(self, pool: NodePoolSpec, nodes: list[NodeSpec]) -> list[MachinePlacement]:
        placed = claim_fleet_gpus(pool, nodes)
        add = {str(p.holder_id): p.hostname for p in placed}
        # The MachineDeployment grows only once the nodes are committed: a rolled-back step
        # leaves nothing behind on the management cluster. A failed apply is redone by
        # machine_status, which finds the node missing from the MachineDeployment.
        transaction.on_commit(lambda: self._sync_pool_logged(pool, add), robust=True)
        return [
            MachinePlacement(p.holder_id, p.host_id, p.hostname, p.zone, p.gpu_uuids)
            for p in placed
        ]

    def machine_status(self, pool: NodePoolSpec, node: NodeSpec, now: datetime) -> MachineStatus:
        try:
            return self._machine_status(pool, node, now)
        except ProviderError as exc:
            if not exc.retryable:
                raise
            return MachineStatus(
                node.id, ready=False, message=f"Cluster API: {exc}", retry_after_s=15.0
            )

    def _machine_status(self, pool: NodePoolSpec, node: NodeSpec, now: datetime) -> MachineStatus:
        deployment_name = render.machine_deployment_name(pool)
        deployment = self.api.get(MACHINE_DEPLOYMENT, deployment_name, self.namespace)
        if str(node.id) not in render.nodes_of(deployment):
            self._sync_pool(pool, add={str(node.id): _reserved_hostname(node)})
            return MachineStatus(
                node.id,
                ready=False,
                message=f"machine requested from MachineDeployment {deployment_name}",
                retry_after_s=status.MACHINE_POLL_S,
            )
        wanted = self._gpu_operator_digest(pool)
        if _annotations(deployment).get(render.A_GPU_OPERATOR) != wanted:
            try:
                self._apply_gpu_operator(pool, self._workload(pool.cluster))
            except ProviderError as exc:
                return MachineStatus(
                    node.id,
                    ready=False,
                    message=f"the GPU Operator configuration is not applied yet: {exc}",
                    retry_after_s=15.0,
                )
            self._sync_pool(pool, gpu_operator=wanted)
        machine = self._bound_machine(pool, node, bind=True)
        found = status.machine_status(node.id, machine, deployment=deployment_name)
        if not found.ready:
            return found
        placed = status.machine_placement(node.id, machine)
        reserved = _reserved_hostname(node)
        if reserved and placed.hostname and placed.hostname != reserved:
            log.warning(
                "node %s: NVKE reserved GPUs on %s, Cluster API placed Machine %s on %s",
                node.id,
                reserved,
                _name(machine),
                placed.hostname,
            )
        node_obj = self._workload(pool.cluster).get(NODE, status.node_name(machine))
        if self.publishes_nodes and not status.node_ready(node_obj):
            # the reconciler's Node sync after this step writes it (sync_nodes); KWOK posts
            # it Ready
            return MachineStatus(
                node.id,
                ready=False,
                message=f"Node {status.node_name(machine)} is not Ready yet (KWOK posts it)",
                retry_after_s=1.0,
            )
        config = self._node_config(pool, node, node_obj, now)
        if config.state != "success":
            return MachineStatus(
                node.id,
                ready=False,
                message=f"GPU configuration {config.state}: {config.message}",
                retry_after_s=config.retry_after_s if config.state == "pending" else 30.0,
            )
        return found

    def delete_machines(self, pool: NodePoolSpec, nodes: list[NodeSpec]) -> None:
        from fleet import placement

        if not nodes:
            return
        ids = {str(n.id) for n in nodes}
        for machine in self._machines(pool):
            meta = machine.get("metadata") or {}
            if status.node_id_of(machine) not in ids or meta.get("deletionTimestamp"):
                continue
            if render.CAPI_DELETE_MACHINE_ANNOTATION in (meta.get("annotations") or {}):
                continue
            self.api.merge_patch(
                MACHINE,
                meta["name"],
                {"metadata": {"annotations": {render.CAPI_DELETE_MACHINE_ANNOTATION: "nvke"}}},
                self.namespace,
            )
        self._sync_pool(pool, remove=ids)
        for node in nodes:
            placement.release_gpus(node.id)

    # --- GPU reconfiguration of a running node --------------------------------------------------

    def _gpu_pods(self, workload: KubeApi, node_name: str) -> list[dict[str, Any]]:
        return [
            p
            for p in workload.list(POD, field_selector=f"spec.nodeName={node_name}")
            if holds_gpu(p) and _evictable(p)
        ]

    def _workload_node(self, pool: NodePoolSpec, node: NodeSpec) -> tuple[KubeApi, str]:
        """The workload cluster and the name of the node's Node ("" when it has none)."""
        machine = self._bound_machine(pool, node)
        return self._workload(pool.cluster), status.node_name(machine)

    def drain_blockers(self, pool: NodePoolSpec, node: NodeSpec) -> list[str]:
        """The node's GPU pods a drain cannot evict now, as kubectl drain would refuse them:
        ``"ns/pod (PodDisruptionBudget ns/pdb allows 0 disruptions)"`` for a budget at its
        minimum (``status.disruptionsAllowed`` 0, or not yet computed by the disruption
        controller), ``"ns/pod (no controller: it would not come back)"`` for a bare pod."""
        workload, node_name = self._workload_node(pool, node)
        if not node_name:
            return []
        blockers = []
        budgets: dict[str, list[dict[str, Any]]] = {}
        for pod in self._gpu_pods(workload, node_name):
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            namespace = meta.get("namespace", "default")
            where = f"{namespace}/{meta['name']}"
            if not meta.get("ownerReferences"):
                blockers.append(f"{where} (no controller: it would not come back)")
                continue
            if namespace not in budgets:
                budgets[namespace] = workload.list(POD_DISRUPTION_BUDGET, namespace)
            for pdb in budgets[namespace]:
                if not status.selects(pdb, meta.get("labels") or {}):
                    continue
                allowed = int((pdb.get("status") or {}).get("disruptionsAllowed") or 0)
                if allowed < 1:
                    blockers.append(
                        f"{where} (PodDisruptionBudget {namespace}/{_name(pdb)} "
                        f"allows {allowed} disruptions)"
                    )
                    break
        return blockers

    def drain_node(self, pool: NodePoolSpec, node: NodeSpec) -> bool:
        """Cordon the Node and evict its GPU pods through the Eviction API (disruption
        budgets hold: a refused eviction is retried on the next call); True once none is left.
        DaemonSet and mirror pods stay, as with kubectl drain."""
        workload, node_name = self._workload_node(pool, node)
        if not node_name:
            return True  # nothing runs on a machine without a Node
        node_obj = workload.get(NODE, node_name)
        if node_obj is None:
            return True
        if not (node_obj.get("spec") or {}).get("unschedulable"):
            workload.merge_patch(
                NODE,
                node_name,
                {
                    "metadata": {"annotations": {render.A_NODE_CORDONED: "true"}},
                    "spec": {"unschedulable": True},
                },
            )
        pods = self._gpu_pods(workload, node_name)
        blocked = []
        for pod in pods:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                continue  # evicted, still terminating
            if workload.evict(meta["name"], meta.get("namespace", "default")) == "blocked":
                blocked.append(f"{meta.get('namespace', 'default')}/{meta['name']}")
        self.last_drain_blockers = blocked
        if blocked:
            log.warning(
                "drain of %s blocked by disruption budgets: %s", node_name, ", ".join(blocked)
            )
        return not self._gpu_pods(workload, node_name) if pods else True

    # --- node upgrades: the Machine is replaced -------------------------------------------------

    def upgrade_node(
        self, pool: NodePoolSpec, node: NodeSpec, *, kubernetes_version: str, driver_version: str
    ) -> None:
        """Upgrade a drained node by replacing its Machine: the pool's MachineDeployment gets
        the new version (the workers never run newer than the control plane) and the pool's
        GPU Operator objects the new driver; then the node's Machine is deleted (its Node
        already drained by NVKE, so Cluster API is told to skip its own drain) and the
        MachineSet of the new template creates the replacement, which :meth:`node_versions`
        binds to the same NVKE node. Kubeadm machines are immutable: Cluster API v1.13 has no
        in-place kubelet upgrade without a runtime extension, so replacement it is."""
        self._apply_gpu_operator(pool, self._workload(pool.cluster))
        self._sync_pool(pool, gpu_operator=self._gpu_operator_digest(pool))
        machine = self._bound_machine(pool, node)
        if machine is None:
            return  # already replaced: node_versions binds the new one
        meta = machine["metadata"]
        self.api.merge_patch(
            MACHINE,
            meta["name"],
            {
                "metadata": {
                    "annotations": {
                        render.CAPI_EXCLUDE_NODE_DRAINING: "nvke",
                        render.A_REPLACED_FOR_UPGRADE: str(node.id),
                    }
                }
            },
            self.namespace,
        )
        self.api.delete(MACHINE, meta["name"], self.namespace)

    def node_versions(self, pool: NodePoolSpec, node: NodeSpec) -> NodeVersions:
        """The kubelet version the node's Node reports (``status.nodeInfo.kubeletVersion``,
        as a minor: ``1.37``) and the driver the host agent reports for the node's host
        (``Host.driver_version``); ``nvml_ok`` while the agent still sees each of the node's
        GPUs through NVML. Unknown ("") while the replacement Machine boots."""
        machine = self._bound_machine(pool, node, bind=True)
        found = status.machine_status(
            node.id, machine, deployment=render.machine_deployment_name(pool)
        )
        driver, nvml_ok = _agent_report(node)
        if not found.ready:
            return NodeVersions(kubernetes_version="", driver_version=driver, nvml_ok=nvml_ok)
        node_obj = self._workload(pool.cluster).get(NODE, status.node_name(machine))
        kubelet = (
            ((node_obj or {}).get("status") or {}).get("nodeInfo", {}).get("kubeletVersion", "")
        )
        return NodeVersions(
            kubernetes_version=render.minor_version(kubelet),
            driver_version=driver if pool.driver_version else "",
            nvml_ok=nvml_ok,
        )

    # --- machines Cluster API replaced ----------------------------------------------------------

    def replaced_machines(self, pool: NodePoolSpec, nodes: list[NodeSpec]) -> list[ReplacedMachine]:
        """READY nodes whose Machine Cluster API deleted by itself (a MachineHealthCheck
        remediation, or someone deleting it): the node's entry in the MachineDeployment
        becomes a vacancy (``replicas`` unchanged, so the MachineSet's replacement stays) that
        the next node NVKE adds takes over."""
        if not nodes:
            return []
        machines = self._machines(pool)
        replaced: list[ReplacedMachine] = []
        for node in nodes:
            mine = [m for m in machines if status.node_id_of(m) == str(node.id)]
            live = [m for m in mine if not _deleting(m)]
            if live:
                continue
            if mine:
                why = status.remediation_reason(mine[0])
            else:
                why = "its Machine was deleted by Cluster API"
            replaced.append(ReplacedMachine(node.id, why))
        if replaced:
            self._sync_pool(pool, vacate={str(r.node_id) for r in replaced})
        return replaced

    def apply_node_config(self, pool: NodePoolSpec, node: NodeSpec) -> None:
        from django.utils import timezone

        machine = self._bound_machine(pool, node)
        node_name = status.node_name(machine)
        if not node_name:
            raise ProviderError(
                f"node {node.name} has no Machine with a Node in the workload cluster",
                code="clusterapi_node_missing",
            )
        workload = self._workload(pool.cluster)
        self._apply_gpu_operator(pool, workload)
        want = (pool.gpu_config or {}).get("labels") or {}
        labels: dict[str, str | None] = {k: want.get(k) for k in render.SELECTOR_LABELS}
        labels.update({k: v for k, v in want.items() if k.startswith("nvke.io/")})
        workload.merge_patch(
            NODE,
            node_name,
            {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        render.A_NODE_GPU_CONFIG: render.digest(pool.gpu_config or {}),
                        render.A_NODE_GPU_CONFIG_AT: timezone.now().isoformat(),
                    },
                }
            },
        )
        # machines created from now on boot with the new config (OnDelete: no rollout)
        self._sync_pool(pool, gpu_operator=self._gpu_operator_digest(pool))

    def node_config_status(
        self, pool: NodePoolSpec, node: NodeSpec, now: datetime
    ) -> NodeConfigStatus:
        machine = self._bound_machine(pool, node)
        node_name = status.node_name(machine)
        workload = self._workload(pool.cluster)
        node_obj = workload.get(NODE, node_name) if node_name else None
        found = self._node_config(pool, node, node_obj, now)
        if found.state == "success" and render.A_NODE_CORDONED in _annotations(node_obj):
            # NVKE cordoned it for the change; its GPUs now run the pool's config
            workload.merge_patch(
                NODE,
                node_name,
                {
                    "metadata": {"annotations": {render.A_NODE_CORDONED: None}},
                    "spec": {"unschedulable": False},
                },
            )
        return found

    def _node_config(
        self, pool: NodePoolSpec, node: NodeSpec, node_obj: dict[str, Any] | None, now: datetime
    ) -> NodeConfigStatus:
        devices = status.mig_devices(pool.gpu_config or {})
        placements: list[dict[str, Any]] = []
        if devices:
            from catalog.mig import LayoutDoesNotFit, MigTable, place_layout
            from catalog.models import GpuModel

            table = MigTable.from_gpu_model(GpuModel.objects.get(slug=pool.gpu_model))
            try:
                created = place_layout(devices, table)
            except LayoutDoesNotFit as exc:
                return NodeConfigStatus(node.id, "failed", message=f"mig-parted: {exc.reason}")
            placements = [{"profile": p.profile, "start": p.start, "size": p.size} for p in created]
        return status.node_config_status(pool, node, node_obj, now, mig_placements=placements)

    # --- helpers --------------------------------------------------------------------------------

    def _machines(self, pool: NodePoolSpec) -> list[dict[str, Any]]:
        return status.machines_by_age(
            self.api.list(MACHINE, self.namespace, label_selector=render.machine_selector(pool)),
            render.machine_deployment_name(pool),
        )

    def _bound_machine(
        self, pool: NodePoolSpec, node: NodeSpec, *, bind: bool = False
    ) -> dict[str, Any] | None:
        """The Machine running ``node`` (a live one first: during an upgrade the old one is
        being deleted); with ``bind``, when no live Machine is bound, the oldest unbound live
        Machine of the pool becomes the node's (annotation ``nvke.io/node-id``)."""
        machines = self._machines(pool)
        bound = [m for m in machines if status.node_id_of(m) == str(node.id)]
        live = [m for m in bound if not _deleting(m)]
        if live or not bind:
            return (live or bound or [None])[0]
        for machine in machines:
            meta = machine.get("metadata") or {}
            if status.node_id_of(machine) or _deleting(machine):
                continue
            if render.CAPI_DELETE_MACHINE_ANNOTATION in (meta.get("annotations") or {}):
                continue
            return self.api.merge_patch(
                MACHINE,
                meta["name"],
                {"metadata": {"annotations": {render.A_NODE_ID: str(node.id)}}},
                self.namespace,
            )
        return bound[0] if bound else None

    def _gpu_operator_digest(self, pool: NodePoolSpec) -> str:
        return render.digest(
            [
                (pool.gpu_config or {}).get("manifests") or [],
                render.render_default_driver(),
                render.render_cluster_policy(),
            ]
        )

    def _apply_gpu_operator(self, pool: NodePoolSpec, workload: KubeApi) -> None:
        """Apply the pool's GPU Operator objects to the workload cluster; shared ConfigMaps
        are read, merged and applied on the condition that nobody changed them meanwhile."""
        names = [
            _name(m)
            for m in (pool.gpu_config or {}).get("manifests") or []
            if m.get("kind") == "ConfigMap"
        ]
        for attempt in range(APPLY_ATTEMPTS):
            existing = {
                name: obj
                for name in names
                if (obj := workload.get(CONFIG_MAP, name, GPU_OPERATOR_NAMESPACE)) is not None
            }
            try:
                for obj in render.render_gpu_operator(pool, existing):
                    if obj["kind"] == "ConfigMap" and _name(obj) in existing:
                        version = existing[_name(obj)]["metadata"].get("resourceVersion")
                        if version:
                            obj["metadata"]["resourceVersion"] = version
                    workload.apply(obj)
                return
            except ApiError as exc:
                if exc.status != 409 or attempt == APPLY_ATTEMPTS - 1:
                    raise

    def _sync_pool_logged(self, pool: NodePoolSpec, add: dict[str, str]) -> None:
        try:
            self._sync_pool(pool, add=add)
        except ProviderError as exc:  # machine_status redoes it
            log.warning("MachineDeployment of pool %s not updated yet: %s", pool.id, exc)

    def _sync_pool(
        self,
        pool: NodePoolSpec,
        *,
        add: dict[str, str] | None = None,
        remove: set[str] | None = None,
        vacate: set[str] | None = None,
        gpu_operator: str | None = None,
    ) -> None:
        """Apply the pool's MachineDeployment (and templates, health check) for its nodes as
        recorded on it, plus ``add`` minus ``remove``; with no node left, delete them.

        ``vacate``: nodes whose Machine Cluster API replaced; each entry becomes a vacancy
        (``vacant:<id>``, counted in ``replicas``) that the next ``add`` takes over, so the
        replacement Machine is kept and bound to the new node.

        The apply carries the resourceVersion read: two writers never lose each other's nodes
        (409, read again)."""
        name = render.machine_deployment_name(pool)
        for attempt in range(APPLY_ATTEMPTS):
            current = self.api.get(MACHINE_DEPLOYMENT, name, self.namespace)
            nodes = render.nodes_of(current)
            for node_id in vacate or ():
                if node_id in nodes:
                    nodes[f"{render.VACANT}{node_id}"] = nodes.pop(node_id)
            for node_id, hostname in (add or {}).items():
                if node_id in nodes:
                    continue
                vacancy = next((k for k in nodes if k.startswith(render.VACANT)), None)
                if vacancy:
                    del nodes[vacancy]
                nodes[node_id] = hostname
            for node_id in remove or ():
                nodes.pop(node_id, None)
            if not any(not k.startswith(render.VACANT) for k in nodes):
                self._delete_pool_objects(pool, current)
                return
            control_plane = self.api.get(
                KUBEADM_CONTROL_PLANE, render.control_plane_name(pool.cluster), self.namespace
            )
            with _render_errors():
                version = render.capi_version(
                    pool.kubernetes_version or pool.cluster.kubernetes_version
                )
            infra_template = render.render_worker_template(
                pool,
                namespace=self.namespace,
                infrastructure=self.infrastructure,
                host_ids=_host_ids(nodes.values()),
                machine_spec=settings.NVKE_CLUSTERAPI_MACHINE_SPEC,
            )
            with _render_errors():
                template, deployment, health_check = render.render_node_pool(
                    pool,
                    nodes=nodes,
                    namespace=self.namespace,
                    infrastructure=self.infrastructure,
                    kubernetes_version=status.running_version(control_plane, version),
                    infrastructure_template=(
                        infra_template["metadata"]["name"] if infra_template else None
                    ),
                )
            keep = gpu_operator or _annotations(current).get(render.A_GPU_OPERATOR)
            if keep:
                deployment["metadata"]["annotations"][render.A_GPU_OPERATOR] = keep
            if current is not None:
                deployment["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            if infra_template:
                self.api.apply(infra_template)
            self.api.apply(template)
            self.api.apply(health_check)
            try:
                self.api.apply(deployment)
                return
            except ApiError as exc:
                if exc.status != 409 or attempt == APPLY_ATTEMPTS - 1:
                    raise

    def _delete_pool_objects(self, pool: NodePoolSpec, deployment: dict[str, Any] | None) -> None:
        name = render.machine_deployment_name(pool)
        if deployment is not None:
            self.api.delete(MACHINE_DEPLOYMENT, name, self.namespace)
        self.api.delete(MACHINE_HEALTH_CHECK, name, self.namespace)
        selector = {render.L_POOL_ID: str(pool.id)}
        for kind in (KUBEADM_CONFIG_TEMPLATE, *self._infrastructure_kinds()):
            if kind.kind.endswith("Cluster"):
                continue
            for template in self.api.list(kind, self.namespace, label_selector=selector):
                self.api.delete(kind, _name(template), self.namespace)


@contextlib.contextmanager
def _render_errors() -> Iterator[None]:
    """A spec that cannot be rendered (a version kubeadm cannot take, labels too long for
    the kubelet) fails for good: retrying renders the same."""
    try:
        yield
    except ValueError as exc:
        raise ProviderError(str(exc), retryable=False, code="clusterapi_cannot_render") from exc


def _deleting(obj: dict[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _host_ids(hostnames: Any) -> list[str]:
    """Fleet host ids of the hosts NVKE reserved (by hostname; "" entries skipped)."""
    from fleet.models import Host

    names = [h for h in hostnames if h]
    return sorted(
        str(i) for i in Host.objects.filter(hostname__in=names).values_list("id", flat=True)
    )


def _agent_report(node: NodeSpec) -> tuple[str, bool]:
    """(driver version, NVML sees every GPU) as the host agent of the node's host reports
    them: ``Host.driver_version`` and no GPU of the node missing from its inventory."""
    from fleet.models import Gpu

    gpus = list(Gpu.objects.filter(uuid__in=node.gpu_uuids).select_related("host"))
    driver = gpus[0].host.driver_version if gpus else ""
    return driver, all(g.missing_since is None for g in gpus)


def _reserved_hostname(node: NodeSpec) -> str:
    """The host NVKE reserved the node's GPUs on ("" when it holds none)."""
    from fleet.models import Gpu

    return (
        Gpu.objects.filter(holder_id=node.id).values_list("host__hostname", flat=True).first() or ""
    )
