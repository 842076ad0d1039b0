"""The ``simulated`` provider (the embedded default) — SIMULATED INFRASTRUCTURE.

It simulates only the infrastructure: a control plane that becomes ready after
``NVKE_SIMULATED_CONTROL_PLANE_DELAY_S`` and machines that join after
``NVKE_SIMULATED_NODE_DELAY_S`` (0 in tests). Placement is real: machines are placed on the
fleet inventory in the database (:mod:`fleet.placement`), so capacity, regions and GPU UUIDs
are those of real imported hosts. Everything above the provider is the real control plane.

GPU reconfiguration (an isolation change): draining is immediate; applying a config "creates"
the MIG devices of the config's mig-parted entry with the catalog's placement rules, as MIG
Manager would on the hardware (a layout the rules refuse fails like ``mig.config.state=failed``),
and GPUs named in ``settings.NVKE_SIMULATED_FAILING_GPUS`` fail their reconfiguration, to
exercise rollbacks: a list of GPU UUIDs (every config fails), or ``{uuid: [mig.config names]}``
(only those configs fail; ``"*"`` = all). Default: none.
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
from fleet import placement

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
)
from .fleet_claims import claim_fleet_gpus


class SimulatedProvider(Provider):
    name = "simulated"

    def ensure_control_plane(self, cluster: ClusterSpec, now: datetime) -> ControlPlaneStatus:
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
        high = getattr(settings, "NVKE_SIMULATED_CALL_DELAY_MAX_S", 0.0)
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
        return MachineStatus(node.id, ready=True)

    def delete_machines(self, pool: NodePoolSpec, nodes: list[NodeSpec]) -> None:
        for node in nodes:
            placement.release_gpus(node.id)

    def drain_node(self, pool: NodePoolSpec, node: NodeSpec) -> bool:
        return not self.drain_blockers(pool, node)

    def drain_blockers(self, pool: NodePoolSpec, node: NodeSpec) -> list[str]:
        """SIMULATED workloads: pods registered with :func:`simulate_drain_blockers`."""
        return list(cache.get(_blockers_key(node.id)) or [])

    def upgrade_node(
        self, pool: NodePoolSpec, node: NodeSpec, *, kubernetes_version: str, driver_version: str
    ) -> None:
        # the simulated machine installs the versions at once; failures can be injected
        failing = getattr(settings, "NVKE_SIMULATED_FAILING_UPGRADES", None) or []
        nvml_ok = not any(uuid in failing for uuid in node.gpu_uuids)
        cache.set(
            _versions_key(node.id),
            {"k8s": kubernetes_version, "driver": driver_version, "nvml_ok": nvml_ok},
            timeout=None,
        )

    def node_versions(self, pool: NodePoolSpec, node: NodeSpec) -> NodeVersions:
        state = cache.get(_versions_key(node.id)) or {}
        return NodeVersions(
            kubernetes_version=state.get("k8s", ""),
            driver_version=state.get("driver", ""),
            nvml_ok=bool(state.get("nvml_ok", True)),
        )

    def apply_node_config(self, pool: NodePoolSpec, node: NodeSpec) -> None:
        return None  # the status below is computed from the pool's config when asked

    def node_config_status(
        self, pool: NodePoolSpec, node: NodeSpec, now: datetime
    ) -> NodeConfigStatus:
        config = pool.gpu_config
        failing = getattr(settings, "NVKE_SIMULATED_FAILING_GPUS", None) or {}
        if not isinstance(failing, dict):  # a list of UUIDs: every config fails on them
            failing = {uuid: ["*"] for uuid in failing}
        label = (config.get("labels") or {}).get("nvidia.com/mig.config", "")
        broken = [
            uuid
            for uuid in node.gpu_uuids
            if uuid in failing and ("*" in failing[uuid] or label in failing[uuid])
        ]
        if broken:
            return NodeConfigStatus(
                node.id,
                "failed",
                message=f"MIG Manager reported mig.config.state=failed on {', '.join(broken)} "
                "(simulated failure)",
            )
        devices = _mig_devices(config)
        placements: list[dict] = []
        if devices:
            table = MigTable.from_gpu_model(GpuModel.objects.get(slug=pool.gpu_model))
            try:
                created = place_layout(devices, table)
            except LayoutDoesNotFit as exc:
                return NodeConfigStatus(node.id, "failed", message=f"mig-parted: {exc.reason}")
            placements = [{"profile": p.profile, "start": p.start, "size": p.size} for p in created]
        sharing = _sharing(config)
        vgpu = _vgpu_devices(config)
        layout = tuple(
            {
                "gpu_uuid": uuid,
                "mig_devices": placements,
                "sharing": sharing,
                "vgpu_devices": vgpu,
            }
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


def _versions_key(node_id) -> str:
    return f"simulated:node-versions:{node_id}"


def simulate_drain_blockers(node_id, pods: list[str]) -> None:
    """SIMULATION: pods on a node that cannot be evicted (``[]`` clears them). Kept in the
    Django cache (Redis) so every worker sees them; used by tests and demos."""
    if pods:
        cache.set(_blockers_key(node_id), list(pods), timeout=None)
    else:
        cache.delete(_blockers_key(node_id))
