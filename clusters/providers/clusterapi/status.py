"""Map Cluster API (and GPU Operator) status back to the provider dataclasses (pure functions).

Conditions are read from ``status.conditions`` (``v1beta2``: ``metav1.Condition``: type,
status ``True|False|Unknown``, reason, message) and, where a type is missing there, from
``status.deprecated.v1beta1.conditions`` (the ``v1beta1`` names: ``Ready``,
``ControlPlaneReady``, ``InfrastructureReady``), so a management cluster that still fills the
old conditions reads the same. Condition types and phases: kubernetes-sigs/cluster-api
``api/core/v1beta2`` (cluster_types.go, machine_types.go, machine_phase_types.go).

* control plane ready = Cluster ``InfrastructureReady`` and ``ControlPlaneAvailable``
  (v1beta1 ``ControlPlaneReady``) True, ``spec.controlPlaneEndpoint`` set, and the
  ``KubeadmControlPlane`` running the wanted version on every replica (an upgrade is done
  when ``status.version`` is it and ``upToDateReplicas`` = ``spec.replicas``); the version
  reported is the KubeadmControlPlane's ``status.version`` once every replica is up to date;
* machine ready = Machine phase ``Running`` with a ``nodeRef`` and ``NodeReady`` (v1beta1:
  ``Ready``) True; a Cluster in phase ``Failed`` is a non-retryable error;
* GPU config of a node: MIG Manager's ``nvidia.com/mig.config.state`` (and the vGPU Device
  Manager's ``nvidia.com/vgpu.config.state``), then what GPU Feature Discovery labels the
  node with (``nvidia.com/gpu.count``, ``nvidia.com/mig-<profile>.count``,
  ``nvidia.com/gpu.replicas``, ``nvidia.com/gpu.sharing-strategy``; shared catalog
  ``gpu_operator.md`` §1) is checked against the pool's config.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.utils.dateparse import parse_datetime

from ..base import (
    ControlPlaneStatus,
    MachinePlacement,
    MachineStatus,
    NodeConfigStatus,
    NodePoolSpec,
    NodeSpec,
    ProviderError,
)
from .render import A_NODE_GPU_CONFIG_AT, CAPI_DEPLOYMENT_NAME_LABEL, minor_version, version_key

#: seconds between polls while Cluster API works (bare-metal machines boot in minutes)
CONTROL_PLANE_POLL_S = 5.0
MACHINE_POLL_S = 5.0
GPU_CONFIG_POLL_S = 5.0
#: how long GFD labels may disagree with a config MIG Manager reported applied before NVKE
#: calls it failed (when GFD writes no ``nvidia.com/gfd.timestamp`` to compare with)
GFD_GRACE = timedelta(minutes=10)

_CP_FIELDS = {f.name for f in dataclasses.fields(ControlPlaneStatus)}


def _cp(**fields: Any) -> ControlPlaneStatus:
    """A ControlPlaneStatus; ``version`` is dropped where the dataclass has no such field."""
    return ControlPlaneStatus(**{k: v for k, v in fields.items() if k in _CP_FIELDS})


#: v1beta2 condition -> v1beta1 name it replaced
_V1BETA1_NAMES = {
    "ControlPlaneAvailable": "ControlPlaneReady",
    "Available": "Ready",
    "NodeReady": "Ready",
}


def condition(obj: Mapping[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """The condition ``type_`` of ``obj`` (v1beta2 first, then the deprecated v1beta1 list)."""
    status = (obj or {}).get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    old = ((status.get("deprecated") or {}).get("v1beta1") or {}).get("conditions") or []
    wanted = _V1BETA1_NAMES.get(type_, type_)
    for cond in old:
        if cond.get("type") == wanted:
            return cond
    return None


def is_true(obj: Mapping[str, Any] | None, type_: str) -> bool:
    cond = condition(obj, type_)
    return cond is not None and cond.get("status") == "True"


def describe(obj: Mapping[str, Any] | None, type_: str) -> str:
    """``"<type> is <status> (<reason>): <message>"`` for a message a tenant can read."""
    cond = condition(obj, type_)
    if cond is None:
        return f"{type_} not reported yet"
    text = f"{type_} is {cond.get('status', 'Unknown')}"
    if cond.get("reason"):
        text += f" ({cond['reason']})"
    if cond.get("message"):
        text += f": {cond['message']}"
    return text


def _deleting(obj: Mapping[str, Any] | None) -> bool:
    return bool(((obj or {}).get("metadata") or {}).get("deletionTimestamp"))


def endpoint(cluster: Mapping[str, Any] | None) -> str:
    """``https://host:port`` from ``spec.controlPlaneEndpoint`` ("" while unset)."""
    ep = ((cluster or {}).get("spec") or {}).get("controlPlaneEndpoint") or {}
    if not ep.get("host"):
        return ""
    return f"https://{ep['host']}:{ep.get('port') or 6443}"


def control_plane_version(control_plane: Mapping[str, Any] | None) -> str:
    """The minor version every control-plane machine runs (``1.36``), "" while rolling.

    ``status.version`` of a KubeadmControlPlane is the lowest version among its machines;
    it counts once ``upToDateReplicas`` reaches ``spec.replicas``.
    """
    if not control_plane:
        return ""
    spec, status = control_plane.get("spec") or {}, control_plane.get("status") or {}
    version = status.get("version") or ""
    wanted = spec.get("replicas")
    up_to_date = status.get("upToDateReplicas")
    if wanted is not None and up_to_date is not None and up_to_date < wanted:
        return ""
    return minor_version(version)


def running_version(control_plane: Mapping[str, Any] | None, fallback: str) -> str:
    """The version new worker machines may run: never newer than the control plane's lowest
    (``status.version``, ``v1.36.0``), else ``fallback``."""
    version = ((control_plane or {}).get("status") or {}).get("version") or ""
    if version and version_key(version) < version_key(fallback):
        return version
    return fallback


def rollout_problem(control_plane: Mapping[str, Any] | None, desired: str) -> str:
    """Why the KubeadmControlPlane does not run ``desired`` (``v1.37.0``) on every replica
    yet ("" once it does, or when there is no such object to judge by)."""
    if not control_plane or not desired:
        return ""
    meta = control_plane.get("metadata") or {}
    spec, state = control_plane.get("spec") or {}, control_plane.get("status") or {}
    generation, observed = meta.get("generation"), state.get("observedGeneration")
    if generation is not None and observed is not None and observed < generation:
        return "Cluster API has not acted on the control plane's new spec yet"
    wanted = spec.get("replicas")
    up_to_date = state.get("upToDateReplicas")
    if (state.get("version") and version_key(state["version"]) != version_key(desired)) or (
        wanted is not None and up_to_date is not None and up_to_date < wanted
    ):
        return (
            f"rolling the control plane to {desired}: "
            f"{up_to_date if up_to_date is not None else '?'} of {wanted} machines up to date"
        )
    return ""


def control_plane_status(
    cluster: Mapping[str, Any] | None,
    control_plane: Mapping[str, Any] | None,
    desired_version: str = "",
) -> ControlPlaneStatus:
    """Whether the cluster's control plane serves ``desired_version`` (``v1.37.0``; "" = any)
    on every replica: an upgrade is not ready until the KubeadmControlPlane has rolled (see
    the module docstring)."""
    if cluster is None:
        return _cp(ready=False, message="the Cluster API objects are being created")
    if (cluster.get("status") or {}).get("phase") == "Failed":
        raise ProviderError(
            f"Cluster API reports the cluster failed: {describe(cluster, 'Available')}",
            retryable=False,
            code="clusterapi_cluster_failed",
        )
    if _deleting(cluster):
        return _cp(ready=False, message="the Cluster API cluster is being deleted")
    version = control_plane_version(control_plane)
    if not is_true(cluster, "InfrastructureReady"):
        return _cp(
            ready=False,
            message=f"waiting for the infrastructure: {describe(cluster, 'InfrastructureReady')}",
            version=version,
            retry_after_s=CONTROL_PLANE_POLL_S,
        )
    if not is_true(cluster, "ControlPlaneAvailable") or not endpoint(cluster):
        return _cp(
            ready=False,
            message=(
                f"waiting for the control plane: {describe(cluster, 'ControlPlaneAvailable')}"
            ),
            version=version,
            retry_after_s=CONTROL_PLANE_POLL_S,
        )
    rolling = rollout_problem(control_plane, desired_version)
    if rolling:
        return _cp(
            ready=False,
            endpoint=endpoint(cluster),
            message=rolling,
            version=version,
            retry_after_s=CONTROL_PLANE_POLL_S,
        )
    return _cp(ready=True, endpoint=endpoint(cluster), version=version)


def node_id_of(machine: Mapping[str, Any]) -> str:
    from .render import A_NODE_ID

    return ((machine.get("metadata") or {}).get("annotations") or {}).get(A_NODE_ID, "")


def node_name(machine: Mapping[str, Any] | None) -> str:
    """The workload Node a Machine runs (``status.nodeRef.name``), "" before it joined."""
    return (((machine or {}).get("status") or {}).get("nodeRef") or {}).get("name", "")


def node_ready(node_obj: Mapping[str, Any] | None) -> bool:
    """Whether a workload Node's ``Ready`` condition is True (its kubelet posts it)."""
    return is_true(node_obj, "Ready")


def machine_status(
    node_id: uuid.UUID, machine: Mapping[str, Any] | None, *, deployment: str
) -> MachineStatus:
    """A node's machine as NVKE sees it (None: no Machine is bound to the node yet)."""
    if machine is None:
        return MachineStatus(
            node_id,
            ready=False,
            message=f"waiting for a Machine of MachineDeployment {deployment}",
            retry_after_s=MACHINE_POLL_S,
        )
    name = (machine.get("metadata") or {}).get("name", "")
    phase = (machine.get("status") or {}).get("phase") or "Pending"
    if _deleting(machine) or phase in ("Deleting", "Deleted"):
        return MachineStatus(
            node_id, ready=False, message=f"Machine {name} is being deleted", retry_after_s=30.0
        )
    if phase == "Failed":
        return MachineStatus(
            node_id,
            ready=False,
            message=f"Machine {name} failed: {describe(machine, 'Ready')}",
            retry_after_s=30.0,
        )
    if phase != "Running" or not node_name(machine) or not is_true(machine, "NodeReady"):
        return MachineStatus(
            node_id,
            ready=False,
            message=f"Machine {name} is {phase}: {describe(machine, 'NodeReady')}",
            retry_after_s=MACHINE_POLL_S,
        )
    return MachineStatus(
        node_id, ready=True, message=f"Machine {name} runs node {node_name(machine)}"
    )


def machine_placement(node_id: uuid.UUID, machine: Mapping[str, Any]) -> MachinePlacement:
    """Where Cluster API put a node's machine: the Node name (or the Machine's ``Hostname``
    address) and failure domain. Host and GPUs are NVKE's reservation (fleet inventory);
    Cluster API does not report them, so ``host_id`` is None and ``gpu_uuids`` empty here."""
    status = machine.get("status") or {}
    hostname = node_name(machine) or next(
        (a["address"] for a in status.get("addresses") or [] if a.get("type") == "Hostname"), ""
    )
    zone = (machine.get("spec") or {}).get("failureDomain") or status.get("failureDomain") or ""
    return MachinePlacement(node_id, None, hostname, zone, ())


def machines_by_age(machines: list[dict[str, Any]], deployment: str) -> list[dict[str, Any]]:
    """The Machines of one MachineDeployment, oldest first (then by name)."""
    mine = [
        m
        for m in machines
        if ((m.get("metadata") or {}).get("labels") or {}).get(CAPI_DEPLOYMENT_NAME_LABEL)
        == deployment
    ]
    return sorted(
        mine,
        key=lambda m: (
            (m.get("metadata") or {}).get("creationTimestamp") or "",
            (m.get("metadata") or {}).get("name") or "",
        ),
    )


# --- GPU configuration of a running node --------------------------------------------------------


def expected_gpu_labels(pool: NodePoolSpec) -> dict[str, str]:
    """What GPU Feature Discovery should label a node of ``pool`` with once its GPU config is
    applied: ``nvidia.com/gpu.count`` (physical GPUs; MIG devices under ``single``),
    ``nvidia.com/mig-<profile>.count`` under ``mixed``, ``nvidia.com/gpu.replicas`` and
    ``nvidia.com/gpu.sharing-strategy``. Empty for vGPU nodes (GFD does not run on them)."""
    config = pool.gpu_config or {}
    labels = config.get("labels") or {}
    if labels.get("nvidia.com/gpu.workload.config") == "vm-vgpu":
        return {}
    gpus = pool.gpus_per_node
    devices = mig_devices(config)
    strategy = config.get("mig_strategy") or "none"
    out: dict[str, str] = {}
    if strategy == "mixed":
        for profile, count in devices.items():
            out[f"nvidia.com/mig-{profile.replace('+', '.')}.count"] = str(count * gpus)
    elif strategy == "single":
        out["nvidia.com/gpu.count"] = str(sum(devices.values()) * gpus)
    else:
        out["nvidia.com/gpu.count"] = str(gpus)
    sharing = sharing_of(config)
    out["nvidia.com/gpu.sharing-strategy"] = sharing["strategy"] if sharing else "none"
    out["nvidia.com/gpu.replicas"] = str(sharing["replicas"]) if sharing else "1"
    return out


def mig_devices(config: Mapping[str, Any]) -> dict[str, int]:
    """Per GPU, the MIG devices of the mig-parted entry the node's label names ({}: MIG off)."""
    name = (config.get("labels") or {}).get("nvidia.com/mig.config")
    parted = config.get("mig_parted_config") or {}
    devices: dict[str, int] = {}
    for entry in (parted.get("mig-configs") or {}).get(name) or []:
        if entry.get("mig-enabled"):
            for profile, count in (entry.get("mig-devices") or {}).items():
                devices[profile] = devices.get(profile, 0) + int(count)
    return devices


def sharing_of(config: Mapping[str, Any]) -> dict[str, Any] | None:
    sharing = (config.get("device_plugin_config") or {}).get("sharing") or {}
    for key, strategy in (("timeSlicing", "time-slicing"), ("mps", "mps")):
        if key in sharing:
            return {"strategy": strategy, "replicas": int(sharing[key]["resources"][0]["replicas"])}
    return None


def vgpu_devices(config: Mapping[str, Any]) -> dict[str, int]:
    name = (config.get("labels") or {}).get("nvidia.com/vgpu.config")
    vgpu = config.get("vgpu_device_manager_config") or {}
    devices: dict[str, int] = {}
    for entry in (vgpu.get("vgpu-configs") or {}).get(name) or []:
        devices.update(entry.get("vgpu-devices") or {})
    return devices


def _applied_at(node_obj: Mapping[str, Any]) -> datetime | None:
    meta = node_obj.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(A_NODE_GPU_CONFIG_AT) or meta.get(
        "creationTimestamp"
    )
    return parse_datetime(text) if text else None


def node_config_status(
    pool: NodePoolSpec,
    node: NodeSpec,
    node_obj: Mapping[str, Any] | None,
    now: datetime,
    *,
    mig_placements: list[dict[str, Any]] | None = None,
) -> NodeConfigStatus:
    """Whether the workload Node runs ``pool.gpu_config`` (see the module docstring).

    ``pending`` while the selector labels are not on the Node yet, MIG Manager / vGPU Device
    Manager report ``pending`` / ``rebooting`` or GFD has not caught up; ``failed`` when a
    manager reports ``failed`` or GFD still disagrees after it relabelled (its
    ``nvidia.com/gfd.timestamp`` is newer than NVKE's change) or after :data:`GFD_GRACE`.
    ``gpu_layout`` (on success): per GPU, the MIG devices of the config at
    ``mig_placements`` (computed from the catalog's placement rules: neither MIG Manager nor
    GFD reports start slices), the sharing GFD reports and the vGPU devices of the config.
    """
    if node_obj is None:
        return NodeConfigStatus(
            node.id, "pending", message="the node has not joined", retry_after_s=GPU_CONFIG_POLL_S
        )
    config = pool.gpu_config or {}
    want = config.get("labels") or {}
    have = (node_obj.get("metadata") or {}).get("labels") or {}
    name = (node_obj.get("metadata") or {}).get("name", "")

    def pending(message: str) -> NodeConfigStatus:
        return NodeConfigStatus(
            node.id, "pending", message=f"{name}: {message}", retry_after_s=GPU_CONFIG_POLL_S
        )

    def failed(message: str) -> NodeConfigStatus:
        return NodeConfigStatus(node.id, "failed", message=f"{name}: {message}")

    for key in (
        "nvidia.com/mig.config",
        "nvidia.com/device-plugin.config",
        "nvidia.com/vgpu.config",
    ):
        if key in want and have.get(key) != want[key]:
            return pending(f"label {key} is {have.get(key)!r}, not {want[key]!r} yet")
    for key, manager in (
        ("nvidia.com/mig.config", "MIG Manager"),
        ("nvidia.com/vgpu.config", "vGPU Device Manager"),
    ):
        if key not in want:
            continue
        state = have.get(f"{key}.state", "")
        if state == "failed":
            return failed(f"{manager} reported {key}.state=failed for {want[key]!r}")
        if state != "success":
            return pending(f"{manager} reports {key}.state={state or 'unset'}")
    expected = expected_gpu_labels(pool)
    wrong = {k: have.get(k) for k, v in expected.items() if have.get(k) != v}
    if wrong:
        text = ", ".join(f"{k}={wrong[k]!r} (expected {expected[k]!r})" for k in sorted(wrong))
        if all(v is None for v in wrong.values()) and not any(
            k.startswith("nvidia.com/gfd") for k in have
        ):
            return pending(f"GPU Feature Discovery has not labelled the node yet ({text})")
        applied = _applied_at(node_obj)
        stamp = have.get("nvidia.com/gfd.timestamp")
        relabelled = (
            stamp is not None
            and stamp.isdigit()
            and applied is not None
            and int(stamp) >= applied.timestamp()
        )
        if relabelled or (applied is not None and now - applied > GFD_GRACE):
            return failed(f"GPU Feature Discovery reports {text}")
        return pending(f"waiting for GPU Feature Discovery: {text}")
    sharing = None
    if expected and have.get("nvidia.com/gpu.sharing-strategy", "none") != "none":
        sharing = {
            "strategy": have["nvidia.com/gpu.sharing-strategy"],
            "replicas": int(have.get("nvidia.com/gpu.replicas", "1")),
        }
    elif not expected:
        sharing = sharing_of(config)
    layout = tuple(
        {
            "gpu_uuid": gpu,
            "mig_devices": list(mig_placements or []),
            "sharing": sharing,
            "vgpu_devices": vgpu_devices(config),
        }
        for gpu in node.gpu_uuids
    )
    return NodeConfigStatus(node.id, "success", layout)


def selects(selector_owner: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether the label selector in ``spec.selector`` (a PodDisruptionBudget's) selects
    ``labels``: ``matchLabels`` and ``matchExpressions`` (In, NotIn, Exists, DoesNotExist);
    an empty selector selects everything (policy/v1)."""
    selector = (selector_owner.get("spec") or {}).get("selector") or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def remediation_reason(machine: Mapping[str, Any]) -> str:
    """Why Cluster API deleted a Machine, in words: its ``HealthCheckSucceeded`` condition
    (set by the MachineHealthCheck) when false, else that it was deleted."""
    name = (machine.get("metadata") or {}).get("name", "")
    cond = condition(machine, "HealthCheckSucceeded")
    if cond is not None and cond.get("status") == "False":
        why = describe(machine, "HealthCheckSucceeded")
        return f"MachineHealthCheck remediated Machine {name}: {why}"
    return f"Machine {name} was deleted by Cluster API"
