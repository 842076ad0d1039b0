"""The ``simulated`` provider — a TEST TOOL: SIMULATED INFRASTRUCTURE, no Kubernetes at all.

Clusters on it get no API (their kubeconfig names an unreachable ``*.simulated.nvke.invalid``
endpoint); the default is ``hosted``, which runs real control planes and inherits this
class's simulated machines. The test suite uses it where a test needs no Kubernetes.

It simulates only the infrastructure: a control plane that becomes ready after
``NVKE_SIMULATED_CONTROL_PLANE_DELAY_S`` and machines that boot after
``NVKE_SIMULATED_NODE_DELAY_S`` (0 in tests). Placement is real: machines are placed on the
fleet inventory in the database (:mod:`fleet.placement`), so capacity, regions and GPU UUIDs
are those of real imported hosts. Everything above the provider is the real control plane.

It acts only on SIMULATED HOSTS (:mod:`clusters.providers.simhosts`): a machine that boots
gets its pool's GPU config from MIG Manager (MIG mode, GPU instances at the catalog's
placements) and its kubelet; an isolation change re-applies the mig-parted config; an
upgrade installs the driver and kubelet; a repair reboots the machine. What NVKE then
believes comes from the host's agent (a ``simulated``-source agent process, or the same
source run in-process for hosts with no agent registered), never from this class: it does
not tell NVKE what NVKE told it. Faults are injected on the hosts (``manage.py simulate``).

Kept for tests: GPUs named in ``settings.NVKE_SIMULATED_FAILING_GPUS`` fail their
reconfiguration (MIG Manager reports ``mig.config.state=failed`` and changes nothing): a list
of GPU UUIDs (every config fails), or ``{uuid: [mig.config names]}`` (only those; ``"*"`` =
all); GPUs in ``NVKE_SIMULATED_FAILING_UPGRADES`` lose NVML after a driver install; the
control planes of clusters named in ``NVKE_SIMULATED_CONTROL_PLANE_OUTAGE`` (``"*"``: all) are
behind an infrastructure API that answers 503 (a retryable ``ProviderError``).
"""

from __future__ import annotations

import random
import secrets
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache

from catalog.mig import LayoutDoesNotFit, MigTable, place_layout
from catalog.models import GpuModel
from fleet import placement, shared_hosts

from . import simhosts
from .base import (
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
)
from .fleet_claims import claim_fleet_gpus


class SimulatedProvider(Provider):
    name = "simulated"

    def ensure_control_plane(self, cluster: ClusterSpec, now: datetime) -> ControlPlaneStatus:
        outage = settings.NVKE_SIMULATED_CONTROL_PLANE_OUTAGE or ()
        if "*" in outage or cluster.name in outage:
            raise ProviderError(
                "the infrastructure API answered 503 Service Unavailable (simulated outage)",
                retryable=True,
                code="infrastructure_unavailable",
            )
        ready_at = cluster.created_at + timedelta(
            seconds=settings.NVKE_SIMULATED_CONTROL_PLANE_DELAY_S
        )
        if now < ready_at:
            return ControlPlaneStatus(
                ready=False,
                message="control plane starting (simulated)",
                retry_after_s=max((ready_at - now).total_seconds(), 0.1),
            )
        # an upgrade of a running control plane completes at once in the simulation
        return ControlPlaneStatus(
            ready=True, endpoint=self._endpoint(cluster), version=cluster.kubernetes_version
        )

    def delete_control_plane(self, cluster: ClusterSpec) -> DeletionStatus:
        return DeletionStatus(gone=True)

    def ensure_machines(self, pool: NodePoolSpec, nodes: list[NodeSpec]) -> list[MachinePlacement]:
        placed = claim_fleet_gpus(pool, nodes)
        low = settings.NVKE_SIMULATED_CALL_DELAY_S
        high = settings.NVKE_SIMULATED_CALL_DELAY_MAX_S
        if high > low:  # a slow infrastructure API with varying latency (fault suite, bench)
            time.sleep(random.uniform(low, high))
        elif low:  # a slow infrastructure API (crash tests)
            time.sleep(low)
        return [
            MachinePlacement(p.holder_id, p.host_id, p.hostname, p.zone, p.gpu_uuids)
            for p in placed
        ]

    def machine_status(self, pool: NodePoolSpec, node: NodeSpec, now: datetime) -> MachineStatus:
        ready_at = node.created_at + timedelta(seconds=settings.NVKE_SIMULATED_NODE_DELAY_S)
        if now < ready_at:
            return MachineStatus(
                node.id,
                ready=False,
                message="machine booting (simulated)",
                retry_after_s=max((ready_at - now).total_seconds(), 0.1),
            )
        host = _host(node)
        if host is not None:
            # first boot: MIG Manager applies the pool's config on the host
            simhosts.change(host, lambda state: _boot(state, pool, node))
            # the host's agent reports at every look while the node waits for READY, not only
            # on its first boot: the boot is on the host (its state file) at once, the report
            # in this step's transaction, so a worker killed between the two lost the report
            # for good and the node waited for it until the observed-state timeout (the
            # SIGKILL fault test, tests/e2e/test_faults.py, hung on it now and then)
            simhosts.report_in_process(host)
        return MachineStatus(node.id, ready=True)

    def delete_machines(self, pool: NodePoolSpec, nodes: list[NodeSpec]) -> None:
        for node in nodes:
            placement.release_gpus(node.id)
            # a VM node of a shared host: its GPU instances are destroyed and their memory
            # cleared on the host; they are FREE once the host's agent reports both
            released = shared_hosts.release_gpu_instances(node.id)
            scrubs = [
                {"gpu_uuid": r.gpu.uuid, "start": r.start, "size": r.size, "scrub_id": r.scrub_id}
                for r in released
            ]
            host = _host(node)
            if host is not None:
                simhosts.change(host, lambda state, n=node, s=scrubs: _forget(state, n, s))
                if scrubs:
                    simhosts.report_in_process(host)

    def drain_node(self, pool: NodePoolSpec, node: NodeSpec) -> bool:
        return not self.drain_blockers(pool, node)

    def drain_blockers(self, pool: NodePoolSpec, node: NodeSpec) -> list[str]:
        """SIMULATED workloads: pods registered with :func:`simulate_drain_blockers`."""
        return list(cache.get(_blockers_key(node.id)) or [])

    def pod_annotations(self, pool: NodePoolSpec, node: NodeSpec, key: str) -> dict[str, str]:
        """SIMULATED workloads: annotations set with :func:`simulate_pod_annotations`."""
        pods = cache.get(_annotations_key(node.id)) or {}
        return {pod: notes[key] for pod, notes in sorted(pods.items()) if key in notes}

    def upgrade_node(
        self, pool: NodePoolSpec, node: NodeSpec, *, kubernetes_version: str, driver_version: str
    ) -> None:
        """The simulated machine installs the driver and the kubelet on its host. The driver is
        the host's, under every node there: the caller checked that no other pool's node is on
        the host where it changes (:mod:`nodepools.host_drivers`)."""
        failing = settings.NVKE_SIMULATED_FAILING_UPGRADES or []
        breaks = any(uuid in failing for uuid in node.gpu_uuids)

        def install(state: dict) -> None:
            simhosts.install_driver(state, driver_version)
            simhosts.set_kubelet(state, node.id, kubernetes_version)
            if breaks:
                state["nvml_error"] = simhosts.NVML_MISMATCH

        host = _host(node)
        if host is not None:
            simhosts.change(host, install)
            simhosts.report_in_process(host)

    def node_versions(self, pool: NodePoolSpec, node: NodeSpec) -> NodeVersions:
        """The kubelet version the node's machine runs (as the Kubernetes Node object would
        say). Driver and NVML are the agent's to report: NVKE reads them from the fleet."""
        host = _host(node)
        state = (simhosts.read(host.id) if host is not None else None) or {}
        return NodeVersions(
            kubernetes_version=(state.get("kubelet") or {}).get(str(node.id), ""),
            driver_version="",
            nvml_ok=True,
        )

    def reboot_node(self, pool: NodePoolSpec, node: NodeSpec) -> None:
        """The machine restarts (its GPUs are reset, unless a fault says otherwise)."""
        host = _host(node)
        if host is not None:
            simhosts.change(host, simhosts.reboot)
            simhosts.report_in_process(host)

    def apply_node_config(self, pool: NodePoolSpec, node: NodeSpec) -> None:
        """MIG Manager / the device plugin apply ``pool.gpu_config`` on the node's host."""
        host = _host(node)
        if host is not None:
            simhosts.change(host, lambda state: _mig_manager(state, pool, node))
            simhosts.report_in_process(host)

    def node_config_status(
        self, pool: NodePoolSpec, node: NodeSpec, now: datetime
    ) -> NodeConfigStatus:
        """What the GPU Operator's labels say (``mig.config.state``) and the sharing / vGPU
        config the device plugin runs. The MIG geometry is NOT taken from here: NVKE reads
        it from the host's agent (a wedged MIG Manager may still say ``success``)."""
        host = _host(node)
        state = (simhosts.read(host.id) if host is not None else None) or {}
        record = (state.get("mig_manager") or {}).get(str(node.id)) or {}
        if record.get("state") == "failed":
            return NodeConfigStatus(node.id, "failed", message=record.get("message", ""))
        config = pool.gpu_config
        layout = tuple(
            {"gpu_uuid": uuid, "sharing": _sharing(config), "vgpu_devices": _vgpu_devices(config)}
            for uuid in node.gpu_uuids
        )
        return NodeConfigStatus(node.id, "success", layout)

    def kubeconfig(self, cluster: ClusterSpec) -> str:
        return (
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: {cluster.name}\n  cluster:\n"
            f"    server: {self._endpoint(cluster)}\n"
            f"contexts:\n- name: {cluster.name}\n  context:\n    cluster: {cluster.name}\n"
            f"    user: {cluster.name}-admin\ncurrent-context: {cluster.name}\n"
            f"users:\n- name: {cluster.name}-admin\n  user:\n"
            f"    token: {secrets.token_urlsafe(32)}\n"  # a new credential on every call
        )

    @staticmethod
    def _endpoint(cluster: ClusterSpec) -> str:
        return f"https://{cluster.id}.simulated.nvke.invalid:6443"


def _host(node: NodeSpec):
    from fleet.models import Host

    return Host.objects.filter(pk=node.host_id).first() if node.host_id else None


def _boot(state: dict, pool: NodePoolSpec, node: NodeSpec) -> bool:
    """First boot of the node's machine on the host: the driver container installs the
    node's pinned driver (placement put a pinned node only where that changes no other node's
    driver: :mod:`fleet.host_driver`; no pin installs nothing), MIG Manager applies the pool's
    config, the kubelet starts. False when it had booted already."""
    if str(node.id) in state["kubelet"]:
        return False
    state["kubelet"][str(node.id)] = node.kubernetes_version or pool.cluster.kubernetes_version
    simhosts.install_driver(state, node.driver_version)
    _mig_manager(state, pool, node)
    return True


def _shared_instances(node: NodeSpec) -> list[dict] | None:
    """The GPU instances NVKE placed for a VM node of a shared host, or None for other nodes."""
    rows = shared_hosts.instances_of(node.id)
    if not rows:
        return None
    return [
        {"gpu_uuid": r.gpu.uuid, "profile": r.profile, "start": r.start, "size": r.size}
        for r in rows
    ]


def _forget(state: dict, node: NodeSpec, scrubs: list[dict] | None = None) -> None:
    if scrubs:
        simhosts.scrub_instances(state, scrubs)
    state["kubelet"].pop(str(node.id), None)
    (state.get("mig_manager") or {}).pop(str(node.id), None)


def _mig_manager(state: dict, pool: NodePoolSpec, node: NodeSpec) -> None:
    """MIG Manager on the host applies the mig-parted entry the node's label names to the
    node's GPUs (placements by the catalog's table, as mig-parted creates them), and records
    the ``mig.config.state`` it would label the node with. A VM node of a shared host instead
    gets exactly the GPU instances NVKE placed for it, beside the other tenants' (the host's
    MIG layout is NVKE's, not one node's mig-parted entry)."""
    config = pool.gpu_config
    shared = _shared_instances(node)
    if shared is not None:
        simhosts.create_instances(state, node.id, shared)
        state.setdefault("mig_manager", {})[str(node.id)] = {"state": "success", "shared": True}
        return
    label = (config.get("labels") or {}).get("nvidia.com/mig.config", "")
    failing = settings.NVKE_SIMULATED_FAILING_GPUS or {}
    if not isinstance(failing, dict):  # a list of UUIDs: every config fails on them
        failing = {uuid: ["*"] for uuid in failing}
    broken = [
        uuid
        for uuid in node.gpu_uuids
        if uuid in failing and ("*" in failing[uuid] or label in failing[uuid])
    ]
    records = state.setdefault("mig_manager", {})
    if broken:
        records[str(node.id)] = {
            "state": "failed",
            "message": f"MIG Manager reported mig.config.state=failed on {', '.join(broken)} "
            "(simulated failure)",
        }
        return
    if not label:  # a GPU without MIG: nothing for MIG Manager to do
        records[str(node.id)] = {"state": "success"}
        return
    devices = _mig_devices(config)
    placements: list[dict] = []
    if devices:
        table = MigTable.from_gpu_model(GpuModel.objects.get(slug=pool.gpu_model))
        try:
            created = place_layout(devices, table)
        except LayoutDoesNotFit as exc:
            records[str(node.id)] = {"state": "failed", "message": f"mig-parted: {exc.reason}"}
            return
        placements = [{"profile": p.profile, "start": p.start, "size": p.size} for p in created]
    simhosts.apply_mig(state, node.gpu_uuids, bool(devices), placements)
    records[str(node.id)] = {"state": "success", "label": label}


def _mig_devices(config: dict) -> dict[str, int]:
    """The ``mig-devices`` of the mig-parted entry the node's label names ({} = MIG off)."""
    parted = config.get("mig_parted_config") or {}
    name = (config.get("labels") or {}).get("nvidia.com/mig.config")
    entries = (parted.get("mig-configs") or {}).get(name) or []
    devices: dict[str, int] = {}
    for entry in entries:
        if entry.get("mig-enabled"):
            for profile, count in (entry.get("mig-devices") or {}).items():
                devices[profile] = devices.get(profile, 0) + count
    return devices


def _sharing(config: dict) -> dict | None:
    sharing = (config.get("device_plugin_config") or {}).get("sharing") or {}
    for key, strategy in (("timeSlicing", "time-slicing"), ("mps", "mps")):
        if key in sharing:
            return {"strategy": strategy, "replicas": sharing[key]["resources"][0]["replicas"]}
    return None


def _vgpu_devices(config: dict) -> dict[str, int]:
    vgpu = config.get("vgpu_device_manager_config") or {}
    name = (config.get("labels") or {}).get("nvidia.com/vgpu.config")
    devices: dict[str, int] = {}
    for entry in (vgpu.get("vgpu-configs") or {}).get(name) or []:
        devices.update(entry.get("vgpu-devices") or {})
    return devices


def _blockers_key(node_id) -> str:
    return f"simulated:drain-blockers:{node_id}"


def simulate_drain_blockers(node_id, pods: list[str]) -> None:
    """SIMULATION: pods on a node that cannot be evicted (``[]`` clears them). Kept in the
    Django cache (Redis) so every worker sees them; used by tests and demos."""
    if pods:
        cache.set(_blockers_key(node_id), list(pods), timeout=None)
    else:
        cache.delete(_blockers_key(node_id))


def _annotations_key(node_id) -> str:
    return f"nvke:sim:pod-annotations:{node_id}"


def simulate_pod_annotations(node_id, pods: dict[str, dict[str, str]]) -> None:
    """SIMULATION: the annotations of pods on a node (``{"namespace/name": {key: value}}``;
    ``{}`` clears them), as a workload in the tenant's cluster would set them. Kept in the
    Django cache (Redis) so every worker sees them."""
    if pods:
        cache.set(_annotations_key(node_id), dict(pods), timeout=None)
    else:
        cache.delete(_annotations_key(node_id))
