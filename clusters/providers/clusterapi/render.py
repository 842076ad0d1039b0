"""Render NVKE clusters and node pools as Cluster API and GPU Operator objects (pure functions).

Management cluster (namespace ``NVKE_CLUSTERAPI_NAMESPACE``), API ``v1beta2`` (Cluster API
v1.11 and later; CRDs vendored in ``crds/``):

* per cluster: a ``Cluster`` and a ``KubeadmControlPlane`` (``<cluster>-control-plane``);
* per node pool: a ``KubeadmConfigTemplate``, a ``MachineDeployment`` and a
  ``MachineHealthCheck``.

Workload cluster (the tenant's cluster, reached with the kubeconfig Secret Cluster API writes):
the GPU Operator's ``ClusterPolicy`` (``cluster-policy``), a fallback ``NVIDIADriver``
(``nvke-default``) and each pool's rendered GPU Operator inputs (``NodePoolSpec.gpu_config``
``manifests``: ConfigMaps merged across pools, a pinned ``NVIDIADriver``).

Where the GPU labels and taints go: in the pool's ``KubeadmConfigTemplate``,
``joinConfiguration.nodeRegistration.kubeletExtraArgs`` (``node-labels``) and ``taints``, so
the kubelet registers the Node with them and the MIG Manager / device plugin see the pool's
config before any pod can land. ``MachineDeployment.spec.template.metadata.labels`` would not
do: by default Cluster API copies Machine labels to the Node only for
``node-role.kubernetes.io/*``, ``node-restriction.kubernetes.io`` and ``node.cluster.x-k8s.io``
keys (``api/core/v1beta2/machine_types.go`` ``NodeRoleLabelPrefix`` …; more only if its manager
runs with ``--additional-sync-machine-labels``, which NVKE cannot assume), and
``spec.template.spec.taints`` (Machine taints) is newer than Cluster API v1.11 and cannot be
assumed. The Machine
template carries NVKE's own labels (cluster, pool, GPU model) for selection.

MachineDeployments roll out ``OnDelete``: a changed template (new GPU config, new version)
applies to machines created afterwards and never replaces running GPU nodes behind NVKE's back;
NVKE changes running nodes itself (drain, in-place reconfiguration, repair). Which machines
belong to which NVKE node is kept in the annotation ``nvke.io/nodes`` of the MachineDeployment
(``{node id: reserved hostname}``; ``replicas`` is its length).

Infrastructure objects: for ``Dev`` (CAPD's in-memory backend, SIMULATED machines) NVKE
creates the ``DevCluster`` and the ``DevMachineTemplate``s; for ``Metal3`` a
``Metal3MachineTemplate`` per pool whose ``hostSelector`` admits only the hosts NVKE reserved
(:func:`render_worker_template`). Otherwise they are referenced: per cluster a
``<Prefix>Cluster`` named like the Cluster; worker machines use the template
``nvke-<gpu model slug>``, control-plane machines ``nvke-control-plane`` (made by the operator).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from ..base import ClusterSpec, NodePoolSpec

FIELD_MANAGER = "nvke"
MANAGED_BY = {"app.kubernetes.io/managed-by": "nvke"}

L_CLUSTER_ID = "nvke.io/cluster-id"
L_TENANT_ID = "nvke.io/tenant-id"
L_POOL_ID = "nvke.io/nodepool-id"
L_POOL = "nvke.io/nodepool"
L_GPU_MODEL = "nvke.io/gpu-model"
A_CLUSTER_NAME = "nvke.io/cluster-name"
#: MachineDeployment: ``{node id: reserved hostname}`` (JSON), the NVKE nodes it runs
A_NODES = "nvke.io/nodes"
#: MachineDeployment: digest of the GPU Operator objects last applied to the workload cluster
A_GPU_OPERATOR = "nvke.io/gpu-operator-config"
#: Machine: the NVKE node (id) it runs
A_NODE_ID = "nvke.io/node-id"
#: Node (workload): digest of the GPU config NVKE last gave it, and when (RFC 3339)
A_NODE_GPU_CONFIG = "nvke.io/gpu-config"
A_NODE_GPU_CONFIG_AT = "nvke.io/gpu-config-applied-at"
#: Node (workload): NVKE cordoned it (for a GPU reconfiguration) and will uncordon it
A_NODE_CORDONED = "nvke.io/cordoned"

#: Cluster API's own labels and annotations (api/core/v1beta2 common_types.go, machine_types.go)
CAPI_CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
CAPI_DEPLOYMENT_NAME_LABEL = "cluster.x-k8s.io/deployment-name"
#: a Machine with this annotation goes first when its MachineSet scales down, whatever the
#: deletion order (api/core/v1beta2 common_types.go ``DeleteMachineAnnotation``)
CAPI_DELETE_MACHINE_ANNOTATION = "cluster.x-k8s.io/delete-machine"
#: a Machine with this annotation is deleted without Cluster API draining its Node first
#: (api/core/v1beta2 machine_types.go ``ExcludeNodeDrainingAnnotation``): NVKE drained it
CAPI_EXCLUDE_NODE_DRAINING = "machine.cluster.x-k8s.io/exclude-node-draining"
#: Machine: NVKE deleted it to upgrade the node (id) it ran; the replacement runs that node
A_REPLACED_FOR_UPGRADE = "nvke.io/replaced-for-upgrade"
#: prefix of a MachineDeployment ``nvke.io/nodes`` key that holds a place for a node to come:
#: the node's Machine was replaced by Cluster API (``vacant:<old node id>``)
VACANT = "vacant:"

#: GPU labels NVKE sets on running Nodes when a pool's config changes (in place); the others
#: of ``gpu_config["labels"]`` (product, sharing) are GPU Feature Discovery's after boot.
SELECTOR_LABELS = (
    "nvidia.com/mig.config",
    "nvidia.com/device-plugin.config",
    "nvidia.com/vgpu.config",
    "nvidia.com/gpu.workload.config",
)

CONTROL_PLANE_REPLICAS = 3
#: kubeadm's defaults (kubeadm ``ClusterConfiguration.networking``)
POD_CIDR = "192.168.0.0/16"
SERVICE_CIDR = "10.96.0.0/12"
#: MachineHealthCheck: a Node Ready=False/Unknown this long is unhealthy; remediation stops
#: when more than this share of the pool is unhealthy (a fault storm, not a bad machine)
UNHEALTHY_TIMEOUT_S = 300
MAX_UNHEALTHY = "40%"
#: bare-metal GPU servers take long to boot (firmware, memory training of 1-2 TB hosts)
NODE_STARTUP_TIMEOUT_S = 1800
#: Cluster API drains a Machine's Node before deleting it; NVKE has drained it already
NODE_DRAIN_TIMEOUT_S = 600

GPU_OPERATOR_NAMESPACE = "gpu-operator"
CLUSTER_POLICY_NAME = "cluster-policy"  # the name the GPU Operator chart gives it
DEFAULT_DRIVER_NAME = "nvke-default"
#: GPU Operator chart default ``driver.version`` at NVIDIA/gpu-operator a22dbf6 (values.yaml),
#: recorded in catalog/data/drivers.yaml (R595)
DEFAULT_DRIVER_VERSION = "595.91.07"
#: ConfigMap names the pools' rendered configs use (nodepools.gpu_config)
MIG_PARTED_CONFIGMAP = "nvke-mig-parted-config"
DEVICE_PLUGIN_CONFIGMAP = "nvke-device-plugin-config"
VGPU_CONFIGMAP = "nvke-vgpu-devices-config"


@dataclass(frozen=True)
class Kind:
    """Where a kind lives in the API: ``group`` ("" = core), ``version``, ``plural``."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


CLUSTER = Kind("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters")
MACHINE_DEPLOYMENT = Kind("cluster.x-k8s.io", "v1beta2", "MachineDeployment", "machinedeployments")
MACHINE_HEALTH_CHECK = Kind(
    "cluster.x-k8s.io", "v1beta2", "MachineHealthCheck", "machinehealthchecks"
)
MACHINE = Kind("cluster.x-k8s.io", "v1beta2", "Machine", "machines")
KUBEADM_CONTROL_PLANE = Kind(
    "controlplane.cluster.x-k8s.io", "v1beta2", "KubeadmControlPlane", "kubeadmcontrolplanes"
)
KUBEADM_CONFIG_TEMPLATE = Kind(
    "bootstrap.cluster.x-k8s.io", "v1beta2", "KubeadmConfigTemplate", "kubeadmconfigtemplates"
)
CLUSTER_POLICY = Kind("nvidia.com", "v1", "ClusterPolicy", "clusterpolicies", namespaced=False)
NVIDIA_DRIVER = Kind("nvidia.com", "v1alpha1", "NVIDIADriver", "nvidiadrivers", namespaced=False)
#: NVIDIA DRA driver for GPUs (NVIDIA/k8s-dra-driver-gpu): a pool kept in one NVLink domain
COMPUTE_DOMAIN = Kind("resource.nvidia.com", "v1beta1", "ComputeDomain", "computedomains")
CONFIG_MAP = Kind("", "v1", "ConfigMap", "configmaps")
NAMESPACE = Kind("", "v1", "Namespace", "namespaces", namespaced=False)
CUSTOM_RESOURCE_DEFINITION = Kind(
    "apiextensions.k8s.io",
    "v1",
    "CustomResourceDefinition",
    "customresourcedefinitions",
    namespaced=False,
)
SECRET = Kind("", "v1", "Secret", "secrets")
NODE = Kind("", "v1", "Node", "nodes", namespaced=False)
POD = Kind("", "v1", "Pod", "pods")
SERVICE = Kind("", "v1", "Service", "services")
PERSISTENT_VOLUME_CLAIM = Kind("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims")
POD_DISRUPTION_BUDGET = Kind("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets")

KINDS = {
    (k.api_version, k.kind): k
    for k in (
        CLUSTER,
        MACHINE_DEPLOYMENT,
        MACHINE_HEALTH_CHECK,
        MACHINE,
        KUBEADM_CONTROL_PLANE,
        KUBEADM_CONFIG_TEMPLATE,
        CLUSTER_POLICY,
        NVIDIA_DRIVER,
        COMPUTE_DOMAIN,
        CONFIG_MAP,
        NAMESPACE,
        CUSTOM_RESOURCE_DEFINITION,
        SECRET,
        NODE,
        POD,
        SERVICE,
        PERSISTENT_VOLUME_CLAIM,
        POD_DISRUPTION_BUDGET,
    )
}


def kind_of(obj: Mapping[str, Any]) -> Kind:
    """The :class:`Kind` of a rendered object; an infrastructure kind (``*.cluster.x-k8s.io``
    group NVKE does not list) is namespaced with the plural ``<kind lowercased>s``."""
    key = (obj["apiVersion"], obj["kind"])
    if key in KINDS:
        return KINDS[key]
    group, _, version = obj["apiVersion"].rpartition("/")
    if not group.startswith("infrastructure."):
        raise KeyError(key)
    return Kind(group, version, obj["kind"], f"{obj['kind'].lower()}s")


#: API versions of the infrastructure providers NVKE knows (their CRDs' served version)
INFRASTRUCTURE_VERSIONS = {"Dev": "v1beta2", "Docker": "v1beta2", "Metal3": "v1beta1"}


@dataclass(frozen=True)
class Infrastructure:
    """The infrastructure provider the objects reference: API group, version and kind prefix.

    NVKE creates the infrastructure objects of two providers itself (:func:`render_infrastructure`):
    ``Dev`` (Cluster API's CAPD ``DevCluster`` / ``DevMachineTemplate`` with the in-memory
    backend: SIMULATED machines, for test beds) and ``Metal3`` (a ``Metal3MachineTemplate``
    per node pool whose ``hostSelector`` admits only the BareMetalHosts NVKE reserved, hosts
    labelled ``nvke.io/host-id``). Any other prefix is referenced, never created.
    """

    api_group: str
    prefix: str
    version: str = "v1beta2"

    @classmethod
    def parse(cls, value: str) -> Infrastructure:
        """``"Metal3"`` -> (infrastructure.cluster.x-k8s.io, Metal3, v1beta1);
        ``"infrastructure.example.com/Foo"`` -> (infrastructure.example.com, Foo, v1beta2);
        ``"infrastructure.example.com/v1alpha1/Foo"`` names the version too."""
        parts = value.strip().split("/")
        prefix = parts[-1]
        if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", prefix) or len(parts) > 3:
            raise ValueError(f"infrastructure kind prefix {prefix!r} is not a Kind prefix")
        group = parts[0] if len(parts) > 1 else "infrastructure.cluster.x-k8s.io"
        version = parts[1] if len(parts) == 3 else INFRASTRUCTURE_VERSIONS.get(prefix, "v1beta2")
        return cls(group, prefix, version)

    def ref(self, suffix: str, name: str) -> dict[str, str]:
        return {"apiGroup": self.api_group, "kind": f"{self.prefix}{suffix}", "name": name}

    def kind(self, suffix: str) -> Kind:
        name = f"{self.prefix}{suffix}"
        return Kind(self.api_group, self.version, name, f"{name.lower()}s")

    @property
    def managed(self) -> bool:
        """Whether NVKE creates this provider's infrastructure objects itself."""
        return self.api_group == "infrastructure.cluster.x-k8s.io" and self.prefix in (
            "Dev",
            "Metal3",
        )


# --- names -------------------------------------------------------------------------------------


def _dns_label(text: str, max_len: int) -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:max_len].strip("-")
    return label or "x"


def cluster_name(cluster: ClusterSpec) -> str:
    """The Cluster's name: ``<name, 30 chars at most>-<8 hex of the id>`` (<= 39 characters;
    it is also a label value, max 63, and a prefix of other names)."""
    return f"{_dns_label(cluster.name, 30)}-{cluster.id.hex[:8]}"


def control_plane_name(cluster: ClusterSpec) -> str:
    return f"{cluster_name(cluster)}-control-plane"


def kubeconfig_secret_name(cluster: ClusterSpec) -> str:
    """Cluster API writes the admin kubeconfig to Secret ``<cluster>-kubeconfig``, key ``value``."""
    return f"{cluster_name(cluster)}-kubeconfig"


def machine_deployment_name(pool: NodePoolSpec) -> str:
    """``<cluster>-<pool name, 14 chars at most>-<6 hex of the pool id>`` (<= 61 characters:
    Cluster API puts it in the ``cluster.x-k8s.io/deployment-name`` label, max 63)."""
    return f"{cluster_name(pool.cluster)}-{_dns_label(pool.name, 14)}-{pool.id.hex[:6]}"


def worker_template_name(gpu_model: str) -> str:
    return f"nvke-{gpu_model}"


CONTROL_PLANE_TEMPLATE = "nvke-control-plane"

#: CAPD's in-memory backend (``Dev``): how long its SIMULATED VM, Node, API server and etcd
#: member take to "start" (Go durations; CAPD's own in-memory templates use 10 s and 2 s)
DEV_STARTUP = {"vm": "2s", "node": "1s", "apiServer": "1s", "etcd": "1s"}
#: BareMetalHost label carrying NVKE's host id (fleet ``Host.id``): the operator (or NVKE's
#: inventory sync) labels each host so that a Metal3MachineTemplate can select it
L_HOST_ID = "nvke.io/host-id"


def _dev_machine_spec() -> dict[str, Any]:
    return {
        "backend": {
            "inMemory": {
                part: {"provisioning": {"startupDuration": duration, "startupJitter": "0.2"}}
                for part, duration in DEV_STARTUP.items()
            }
        }
    }


def render_infrastructure_cluster(
    cluster: ClusterSpec, *, namespace: str, infrastructure: Infrastructure
) -> dict[str, Any] | None:
    """The ``<Prefix>Cluster`` NVKE creates (``DevCluster``, in-memory backend); None where
    the operator provides it (``Metal3Cluster`` needs the control-plane endpoint, which only
    the site knows)."""
    if not infrastructure.managed or infrastructure.prefix != "Dev":
        return None
    kind = infrastructure.kind("Cluster")
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        # an annotation is needed: CAPD v1.13.7 writes into metadata.annotations of a
        # DevCluster without creating the map (a panic when there is none)
        "metadata": _meta(
            cluster_name(cluster),
            namespace,
            cluster_labels(cluster),
            annotations={A_CLUSTER_NAME: cluster.name},
        ),
        "spec": {"backend": {"inMemory": {}}},
    }


def render_control_plane_template(
    cluster: ClusterSpec, *, namespace: str, infrastructure: Infrastructure
) -> dict[str, Any] | None:
    """The control plane's ``<Prefix>MachineTemplate`` where NVKE makes it (``Dev``); None:
    the shared ``nvke-control-plane`` the operator made is referenced."""
    if not infrastructure.managed or infrastructure.prefix != "Dev":
        return None
    kind = infrastructure.kind("MachineTemplate")
    spec = {"template": {"spec": _dev_machine_spec()}}
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": _meta(
            f"{control_plane_name(cluster)}-{digest(spec, 8)}", namespace, cluster_labels(cluster)
        ),
        "spec": spec,
    }


def render_worker_template(
    pool: NodePoolSpec,
    *,
    namespace: str,
    infrastructure: Infrastructure,
    host_ids: list[str],
    machine_spec: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The pool's ``<Prefix>MachineTemplate`` where NVKE makes it; None: the shared
    ``nvke-<gpu model>`` is referenced.

    * ``Dev``: the in-memory backend (SIMULATED machines);
    * ``Metal3``: ``machine_spec`` (the site's ``image``, ``dataTemplate`` … from
      ``NVKE_CLUSTERAPI_MACHINE_SPEC``) plus ``hostSelector`` ``nvke.io/host-id in
      (<the hosts NVKE reserved for the pool's nodes>)``: Metal3 may only consume a
      BareMetalHost whose GPUs NVKE reserved for this pool.

    Its name ends with a digest of its spec (templates are immutable; a new host set is a new
    template, which machines created afterwards use: the rollout is ``OnDelete``)."""
    if not infrastructure.managed:
        return None
    if infrastructure.prefix == "Dev":
        spec: dict[str, Any] = {"template": {"spec": _dev_machine_spec()}}
    else:
        machine = json.loads(json.dumps(dict(machine_spec or {})))
        machine["hostSelector"] = {
            "matchExpressions": [
                {"key": L_HOST_ID, "operator": "in", "values": sorted(set(host_ids))}
            ]
        }
        spec = {"template": {"spec": machine}}
    kind = infrastructure.kind("MachineTemplate")
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": _meta(
            f"{machine_deployment_name(pool)}-{digest(spec, 8)}",
            namespace,
            {**cluster_labels(pool.cluster), L_POOL_ID: str(pool.id)},
        ),
        "spec": spec,
    }


def capi_version(kubernetes_version: str) -> str:
    """A Cluster API version (semver with ``v``) for an NVKE one: ``1.36`` -> ``v1.36.0``.

    NVKE's catalog lists minor releases; kubeadm needs a patch release, so a bare minor means
    its ``.0`` (a spec may name a patch: ``1.36.3`` -> ``v1.36.3``).
    """
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?", kubernetes_version.strip())
    if match is None:
        raise ValueError(f"{kubernetes_version!r} is not a Kubernetes version")
    major, minor, patch = match.group(1), match.group(2), match.group(3) or "0"
    return f"v{major}.{minor}.{patch}"


def minor_version(version: str) -> str:
    """``v1.36.2`` -> ``1.36`` ("" for something that is not a version)."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+.*)?", (version or "").strip())
    return f"{match.group(1)}.{match.group(2)}" if match else ""


def version_key(version: str) -> tuple[int, ...]:
    """Orders versions: ``v1.36.2`` -> (1, 36, 2)."""
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def digest(doc: Any, size: int = 10) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:size]


# --- management cluster objects ----------------------------------------------------------------


def _meta(name: str, namespace: str, labels: dict[str, str], **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    meta.update(extra)
    return meta


def cluster_labels(cluster: ClusterSpec) -> dict[str, str]:
    return {
        **MANAGED_BY,
        CAPI_CLUSTER_NAME_LABEL: cluster_name(cluster),
        L_CLUSTER_ID: str(cluster.id),
        L_TENANT_ID: str(cluster.tenant_id),
    }


def render_cluster(
    cluster: ClusterSpec,
    *,
    namespace: str,
    infrastructure: Infrastructure,
    control_plane_replicas: int = CONTROL_PLANE_REPLICAS,
) -> list[dict[str, Any]]:
    """``[Cluster, KubeadmControlPlane]`` of an NVKE cluster, then the infrastructure objects
    NVKE makes for it (``DevCluster`` and the control plane's ``DevMachineTemplate``)."""
    name = cluster_name(cluster)
    infra_cluster = render_infrastructure_cluster(
        cluster, namespace=namespace, infrastructure=infrastructure
    )
    cp_template = render_control_plane_template(
        cluster, namespace=namespace, infrastructure=infrastructure
    )
    labels = cluster_labels(cluster)
    capi_cluster = {
        "apiVersion": CLUSTER.api_version,
        "kind": CLUSTER.kind,
        "metadata": _meta(name, namespace, labels, annotations={A_CLUSTER_NAME: cluster.name}),
        "spec": {
            "clusterNetwork": {
                "pods": {"cidrBlocks": [POD_CIDR]},
                "services": {"cidrBlocks": [SERVICE_CIDR]},
                "serviceDomain": "cluster.local",
            },
            "controlPlaneRef": {
                "apiGroup": KUBEADM_CONTROL_PLANE.group,
                "kind": KUBEADM_CONTROL_PLANE.kind,
                "name": control_plane_name(cluster),
            },
            "infrastructureRef": infrastructure.ref("Cluster", name),
        },
    }
    control_plane = {
        "apiVersion": KUBEADM_CONTROL_PLANE.api_version,
        "kind": KUBEADM_CONTROL_PLANE.kind,
        "metadata": _meta(control_plane_name(cluster), namespace, labels),
        "spec": {
            "replicas": control_plane_replicas,
            "version": capi_version(cluster.kubernetes_version),
            "machineTemplate": {
                "metadata": {"labels": {L_CLUSTER_ID: str(cluster.id)}},
                "spec": {
                    "infrastructureRef": infrastructure.ref(
                        "MachineTemplate",
                        cp_template["metadata"]["name"] if cp_template else CONTROL_PLANE_TEMPLATE,
                    ),
                },
            },
            "rollout": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}},
        },
    }
    return [capi_cluster, control_plane, *(o for o in (infra_cluster, cp_template) if o)]


def node_labels(pool: NodePoolSpec) -> dict[str, str]:
    """The Node labels a pool's machines register with: the pool's GPU config labels
    (``nvidia.com/mig.config``, device-plugin config, product …) plus the pool's id."""
    labels = dict((pool.gpu_config or {}).get("labels") or {})
    labels[L_POOL_ID] = str(pool.id)
    return dict(sorted(labels.items()))


def node_taints(pool: NodePoolSpec) -> list[dict[str, str]]:
    """The pool's taints (``nvidia.com/gpu=present:NoSchedule`` on GPU nodes)."""
    return [
        {k: t[k] for k in ("key", "value", "effect") if t.get(k) not in (None, "")}
        for t in (pool.gpu_config or {}).get("taints") or []
    ]


#: ``kubeletExtraArgs[].value`` maxLength in the KubeadmConfigTemplate v1beta2 CRD
KUBELET_ARG_MAX = 1024
#: GFD writes these itself once the node runs; they are the first to go when the kubelet
#: argument would be too long (``nvidia.com/mig-<profile>.product`` included)
_GFD_LABELS = re.compile(
    r"nvidia\.com/(gpu\.product|gpu\.replicas|gpu\.sharing-strategy|mig\.strategy"
    r"|mig-.*\.product)$"
)


def node_labels_arg(labels: Mapping[str, str]) -> str:
    """kubelet ``--node-labels``: ``k=v,k=v`` (sorted). Over :data:`KUBELET_ARG_MAX`
    characters, the labels GFD writes anyway are left out; ValueError if still too long."""
    text = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    if len(text) > KUBELET_ARG_MAX:
        text = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if not _GFD_LABELS.match(k))
    if len(text) > KUBELET_ARG_MAX:
        raise ValueError(f"node labels need {len(text)} characters, more than {KUBELET_ARG_MAX}")
    return text


def render_kubeadm_config_template(pool: NodePoolSpec, *, namespace: str) -> dict[str, Any]:
    """The bootstrap template: kubelet ``--node-labels`` and the registration taints.

    Its name ends with a digest of its spec: templates are treated as immutable (a changed
    GPU config is a new template, the MachineDeployment points to it)."""
    registration: dict[str, Any] = {
        "kubeletExtraArgs": [{"name": "node-labels", "value": node_labels_arg(node_labels(pool))}],
    }
    taints = node_taints(pool)
    if taints:
        registration["taints"] = taints
    spec = {"template": {"spec": {"joinConfiguration": {"nodeRegistration": registration}}}}
    return {
        "apiVersion": KUBEADM_CONFIG_TEMPLATE.api_version,
        "kind": KUBEADM_CONFIG_TEMPLATE.kind,
        "metadata": _meta(
            f"{machine_deployment_name(pool)}-{digest(spec, 8)}",
            namespace,
            {**cluster_labels(pool.cluster), L_POOL_ID: str(pool.id)},
        ),
        "spec": spec,
    }


def machine_selector(pool: NodePoolSpec) -> dict[str, str]:
    return {CAPI_CLUSTER_NAME_LABEL: cluster_name(pool.cluster), L_POOL_ID: str(pool.id)}


def render_node_pool(
    pool: NodePoolSpec,
    *,
    nodes: Mapping[str, str],
    namespace: str,
    infrastructure: Infrastructure,
    kubernetes_version: str | None = None,
    infrastructure_template: str | None = None,
) -> list[dict[str, Any]]:
    """``[KubeadmConfigTemplate, MachineDeployment, MachineHealthCheck]`` of a node pool.

    ``infrastructure_template``: the name of the pool's machine template (default: the shared
    ``nvke-<gpu model>``; see :func:`render_worker_template`).

    ``nodes``: ``{NVKE node id: hostname NVKE reserved for it}``; ``replicas`` is their count.
    ``kubernetes_version``: the workers' version (default: the cluster's); callers pass the
    control plane's running version so that new machines are never newer than it.
    """
    cluster = pool.cluster
    name = machine_deployment_name(pool)
    template = render_kubeadm_config_template(pool, namespace=namespace)
    selector = machine_selector(pool)
    labels = {**cluster_labels(cluster), L_POOL_ID: str(pool.id)}
    machine_labels = {
        **selector,
        L_CLUSTER_ID: str(cluster.id),
        L_POOL: _dns_label(pool.name, 63),
        L_GPU_MODEL: pool.gpu_model,
    }
    deployment = {
        "apiVersion": MACHINE_DEPLOYMENT.api_version,
        "kind": MACHINE_DEPLOYMENT.kind,
        "metadata": _meta(
            name,
            namespace,
            labels,
            annotations={A_NODES: json.dumps(dict(sorted(nodes.items())), separators=(",", ":"))},
        ),
        "spec": {
            "clusterName": cluster_name(cluster),
            "replicas": len(nodes),
            "selector": {"matchLabels": selector},
            "rollout": {"strategy": {"type": "OnDelete"}},
            "deletion": {"order": "Newest"},
            "template": {
                "metadata": {"labels": machine_labels},
                "spec": {
                    "clusterName": cluster_name(cluster),
                    "version": capi_version(kubernetes_version or cluster.kubernetes_version),
                    "bootstrap": {
                        "configRef": {
                            "apiGroup": KUBEADM_CONFIG_TEMPLATE.group,
                            "kind": KUBEADM_CONFIG_TEMPLATE.kind,
                            "name": template["metadata"]["name"],
                        }
                    },
                    "infrastructureRef": infrastructure.ref(
                        "MachineTemplate",
                        infrastructure_template or worker_template_name(pool.gpu_model),
                    ),
                    "deletion": {"nodeDrainTimeoutSeconds": NODE_DRAIN_TIMEOUT_S},
                },
            },
        },
    }
    health_check = {
        "apiVersion": MACHINE_HEALTH_CHECK.api_version,
        "kind": MACHINE_HEALTH_CHECK.kind,
        "metadata": _meta(name, namespace, labels),
        "spec": {
            "clusterName": cluster_name(cluster),
            "selector": {"matchLabels": selector},
            "checks": {
                "nodeStartupTimeoutSeconds": NODE_STARTUP_TIMEOUT_S,
                "unhealthyNodeConditions": [
                    {"type": "Ready", "status": status, "timeoutSeconds": UNHEALTHY_TIMEOUT_S}
                    for status in ("False", "Unknown")
                ],
            },
            "remediation": {"triggerIf": {"unhealthyLessThanOrEqualTo": MAX_UNHEALTHY}},
        },
    }
    return [template, deployment, health_check]


def nodes_of(deployment: Mapping[str, Any] | None) -> dict[str, str]:
    """The ``{node id: hostname}`` a MachineDeployment was rendered with ({} when absent)."""
    if not deployment:
        return {}
    text = ((deployment.get("metadata") or {}).get("annotations") or {}).get(A_NODES) or "{}"
    try:
        nodes = json.loads(text)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in nodes.items()} if isinstance(nodes, dict) else {}


# --- workload cluster objects (GPU Operator) ---------------------------------------------------


def render_cluster_policy() -> dict[str, Any]:
    """The GPU Operator's ``ClusterPolicy``, wired to the ConfigMaps NVKE renders.

    Drivers are managed by ``NVIDIADriver`` objects (``useNvidiaDriverCRD``): a pool with a
    pinned driver has its own (selecting ``nvke.io/nodepool``), every other node gets
    ``nvke-default``. MIG Manager reads ``nvke-mig-parted-config`` and applies the entry the
    Node's ``nvidia.com/mig.config`` names; the device plugin and GFD read the key named by
    ``nvidia.com/device-plugin.config`` in ``nvke-device-plugin-config`` (its
    ``flags.migStrategy`` decides per node; ``mixed`` is only the fallback).
    """
    gpu_toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    return {
        "apiVersion": CLUSTER_POLICY.api_version,
        "kind": CLUSTER_POLICY.kind,
        "metadata": {"name": CLUSTER_POLICY_NAME, "labels": dict(MANAGED_BY)},
        "spec": {
            "operator": {"defaultRuntime": "containerd"},
            "daemonsets": {"tolerations": [gpu_toleration]},
            "driver": {"enabled": True, "useNvidiaDriverCRD": True},
            "toolkit": {"enabled": True},
            "devicePlugin": {"enabled": True, "config": {"name": DEVICE_PLUGIN_CONFIGMAP}},
            "dcgm": {"enabled": False},
            "dcgmExporter": {"enabled": True},
            "gfd": {"enabled": True},
            "nodeStatusExporter": {"enabled": False},
            "mig": {"strategy": "mixed"},
            "migManager": {
                "enabled": True,
                "config": {"name": MIG_PARTED_CONFIGMAP, "default": "all-disabled"},
            },
            "sandboxWorkloads": {"enabled": True, "defaultWorkload": "container"},
            "vgpuDeviceManager": {"enabled": True, "config": {"name": VGPU_CONFIGMAP}},
        },
    }


def render_default_driver() -> dict[str, Any]:
    """The fallback ``NVIDIADriver`` (``default: true``) for nodes no pinned driver selects."""
    return {
        "apiVersion": NVIDIA_DRIVER.api_version,
        "kind": NVIDIA_DRIVER.kind,
        "metadata": {"name": DEFAULT_DRIVER_NAME, "labels": dict(MANAGED_BY)},
        "spec": {
            "driverType": "gpu",
            "default": True,
            "repository": "nvcr.io/nvidia",
            "image": "driver",
            "version": DEFAULT_DRIVER_VERSION,
        },
    }


def render_gpu_operator(
    pool: NodePoolSpec, existing: Mapping[str, Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """What the workload cluster needs for ``pool``: its ConfigMaps merged into the ones
    already there (``existing``: ``{configmap name: object}`` as read from the cluster; other
    pools' entries are kept), its pinned ``NVIDIADriver`` if any, the fallback driver and the
    ClusterPolicy, in the order they must be applied."""
    manifests = [dict(m) for m in (pool.gpu_config or {}).get("manifests") or []]
    existing = existing or {}
    out: list[dict[str, Any]] = []
    for obj in manifests:
        if obj.get("kind") == "ConfigMap":
            obj = merge_config_map(existing.get(obj["metadata"]["name"]), obj)
        out.append(obj)
    out.sort(key=lambda o: (o["kind"] != "ConfigMap", o["metadata"]["name"]))
    return [*out, render_default_driver(), render_cluster_policy()]


#: the ConfigMap keys holding one YAML document whose top-level map is shared by pools
_SHARED_DOCS = {"config.yaml": ("mig-configs", "vgpu-configs")}


def merge_config_map(current: Mapping[str, Any] | None, mine: Mapping[str, Any]) -> dict[str, Any]:
    """``mine`` (a pool's ConfigMap) merged into ``current`` (the cluster's, or None).

    MIG Manager and the vGPU Device Manager read ONE ``config.yaml`` for every node, so the
    pool's ``mig-configs`` / ``vgpu-configs`` entries are added to those already there (names
    are per pool, or identical wherever they appear: ``all-disabled``, ``all-1g.10gb``); other
    keys (device-plugin configs, one per pool) are set. Only ``data`` is merged; the result
    carries ``mine``'s metadata.
    """

    data = dict((current or {}).get("data") or {})
    for key, text in (mine.get("data") or {}).items():
        sections = _SHARED_DOCS.get(key)
        if sections and data.get(key):
            theirs, ours = yaml.safe_load(data[key]) or {}, yaml.safe_load(text) or {}
            for section in sections:
                if section in ours:
                    theirs.setdefault(section, {}).update(ours[section])
            theirs.setdefault("version", ours.get("version", "v1"))
            data[key] = yaml.safe_dump(theirs, sort_keys=False, default_flow_style=False)
        else:
            data[key] = text
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            k: v for k, v in mine["metadata"].items() if k in ("name", "namespace", "labels")
        },
        "data": dict(sorted(data.items())),
    }
