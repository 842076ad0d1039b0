"""The ``simulated`` provider (the embedded default) — SIMULATED INFRASTRUCTURE.

It simulates only the infrastructure: a control plane that becomes ready after
``NVKE_SIMULATED_CONTROL_PLANE_DELAY_S`` and machines that join after
``NVKE_SIMULATED_NODE_DELAY_S`` (0 in tests). Placement is real: machines are placed on the
fleet inventory in the database (:mod:`fleet.placement`), so capacity, regions and GPU UUIDs
are those of real imported hosts. Everything above the provider is the real control plane.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from fleet import placement

from .base import (
    ClusterSpec,
    ControlPlaneStatus,
    InsufficientCapacity,
    MachinePlacement,
    MachineStatus,
    NodePoolSpec,
    NodeSpec,
    Provider,
)


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
        return ControlPlaneStatus(ready=True, endpoint=self._endpoint(cluster))

    def delete_control_plane(self, cluster: ClusterSpec) -> bool:
        return True

    def ensure_machines(self, pool: NodePoolSpec, nodes: list[NodeSpec]) -> list[MachinePlacement]:
        requests = [
            placement.GpuRequest(
                holder_id=node.id,
                tenant_id=pool.cluster.tenant_id,
                gpu_model=pool.gpu_model,
                gpus=pool.gpus_per_node,
                region=pool.cluster.region,
            )
            for node in nodes
        ]
        try:
            placed = placement.claim_gpus(requests)
        except placement.InsufficientCapacity as exc:
            raise InsufficientCapacity(str(exc), retryable=True) from exc
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

    def kubeconfig(self, cluster: ClusterSpec) -> str:
        return (
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: {cluster.name}\n  cluster:\n"
            f"    server: {self._endpoint(cluster)}\n"
            f"contexts:\n- name: {cluster.name}\n  context:\n    cluster: {cluster.name}\n"
            f"    user: {cluster.name}-admin\ncurrent-context: {cluster.name}\n"
            f"users:\n- name: {cluster.name}-admin\n  user: {{}}\n"
        )

    @staticmethod
    def _endpoint(cluster: ClusterSpec) -> str:
        return f"https://{cluster.id}.simulated.nvke.invalid:6443"
