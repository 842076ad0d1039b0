"""Bringing PROVISIONING nodes to READY once their host's agent agrees, and reading what their
GPUs run (layout, validation).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime

from clusters.providers import ProviderError
from clusters.providers.base import NodePoolSpec, Provider

from .. import observed_gates, shared_host_nodes
from ..choices import NodePhase
from ..models import Node, NodePool
from ..signals import node_ready
from ..specs import node_spec

log = logging.getLogger(__name__)


def _bring_up(
    pool: NodePool, nodes: list[Node], provider: Provider, spec: NodePoolSpec, now: datetime
) -> tuple[list[float], list[str], str | None]:
    """Make READY each PROVISIONING node of ``nodes`` whose machine is ready and whose host's
    agent reports what it must run. Returns ``(waits, unverified, failed)``: the delays (s)
    of the nodes still provisioning, the differences of those waiting for their agent, and
    the problem of the first node past ``NVKE_OBSERVED_STATE_TIMEOUT_S`` (None if none; the
    nodes after it are not looked at)."""
    waits: list[float] = []
    unverified: list[str] = []
    for node in nodes:
        if node.phase != NodePhase.PROVISIONING:
            continue
        status = provider.machine_status(spec, node_spec(node), now)
        if not status.ready:
            waits.append(status.retry_after_s)
            continue
        # READY only when the host's agent reports what the node must run (observed_gates.py)
        verdict, problem = observed_gates.gate(
            pool, node, observed_gates.expectation(pool), what="to become READY", now=now
        )
        if verdict == observed_gates.FAILED:
            return waits, unverified, problem
        if verdict == observed_gates.WAITING:
            unverified.append(problem)
            waits.append(OBSERVED_POLL_S)
            continue
        node.phase = NodePhase.READY
        node.ready_at = now
        try:
            report = provider.node_config_status(spec, node_spec(node), now)
        except ProviderError:  # a provider that cannot report it: sharing stays unknown
            report = None
        node.gpu_layout = observed_layout(
            node, list(report.gpu_layout) if report and report.state == "success" else []
        )
        node.save(update_fields=["phase", "ready_at", "gpu_layout"])
        # a VM node of a shared host bills one ledger row per GPU instance, by fraction
        node_ready.send(sender=Node, node=node, allocations=shared_host_nodes.allocations(node))
    return waits, unverified, None


#: how often a node waiting for its host's agent is looked at again (s)
OBSERVED_POLL_S = 2.0


def _verified(problems: list[str]) -> tuple:
    """The pool condition ``NodesVerified``: False naming every node that waits for its
    host's agent (expected vs reported), True when none does."""
    if problems:
        return ("NodesVerified", False, "ObservedStateMismatch", "; ".join(problems)[:1000])
    return ("NodesVerified", True, "AgentReportsAgree", "")


def observed_layout(node: Node, provider_layout: list[dict]) -> list[dict]:
    """``Node.gpu_layout``: per GPU the MIG devices the host's agent reports (profile,
    start, size) and the sharing / vGPU devices the provider's device plugin config says."""
    from fleet.agent_facts import host_facts

    facts = host_facts(node.host_id, node.gpu_uuids) if node.host_id else None
    by_gpu = {g.get("gpu_uuid"): g for g in provider_layout}
    # shared host: never show other tenants' instances
    own = shared_host_nodes.node_gpu_instances(node, facts)
    out = []
    for gpu_uuid in node.gpu_uuids:
        gpu = facts.gpus.get(gpu_uuid) if facts else None
        if gpu is not None and own is not None:
            gpu = replace(
                gpu, instances=tuple(i for i in gpu.instances if i in own.get(gpu_uuid, ()))
            )
        extra = by_gpu.get(gpu_uuid) or {}
        out.append(
            {
                "gpu_uuid": gpu_uuid,
                "mig_devices": [
                    {"profile": p, "start": st, "size": sz} for p, st, sz in gpu.instances
                ]
                if gpu
                else [],
                "sharing": extra.get("sharing"),
                "vgpu_devices": extra.get("vgpu_devices") or {},
            }
        )
    return out


def validate_layout(pool: NodePool, node: Node, layout: list[dict]) -> str | None:
    """None when ``layout`` (per GPU: the MIG devices the agent reports, the sharing and vGPU
    devices the provider reports) matches the pool's config on every
    GPU of the node: the same MIG instances (profile multiset) at placements valid by the
    catalog's table and not overlapping, the same sharing and vGPU devices; else why not.

    Placements may differ from NVKE's plan (MIG Manager chooses its own); validity is what
    counts.
    """
    from catalog.mig import MigTable

    config = pool.gpu_config
    wanted = sorted(d["profile"] for d in config.get("mig_layout") or [])
    by_gpu = {g.get("gpu_uuid"): g for g in layout}
    table = MigTable.from_gpu_model(pool.gpu_model) if wanted else None
    for gpu_id in node.gpu_uuids:
        gpu = by_gpu.get(gpu_id)
        if gpu is None:
            return f"{gpu_id} is missing from the node's GPU report"
        devices = gpu.get("mig_devices") or []
        if sorted(d["profile"] for d in devices) != wanted:
            return (
                f"{gpu_id} runs MIG devices {sorted(d['profile'] for d in devices)}, "
                f"expected {wanted}"
            )
        used = 0
        for device in devices:
            spec = table.profile(device["profile"]) if table else None
            bits = ((1 << device["size"]) - 1) << device["start"]
            if spec is None or device["start"] not in spec.starts or device["size"] != spec.size:
                where = f"{device['profile']} at start {device['start']}"
                return f"{gpu_id}: {where} is not a valid placement"
            if used & bits:
                return f"{gpu_id}: MIG devices overlap at start {device['start']}"
            used |= bits
        plugin = (config.get("device_plugin_config") or {}).get("sharing") or {}
        expected_sharing = None
        for key, strategy in (("timeSlicing", "time-slicing"), ("mps", "mps")):
            if key in plugin:
                expected_sharing = {
                    "strategy": strategy,
                    "replicas": plugin[key]["resources"][0]["replicas"],
                }
        if gpu.get("sharing") != expected_sharing:
            return f"{gpu_id} shares as {gpu.get('sharing')}, expected {expected_sharing}"
        vgpu = config.get("vgpu_device_manager_config") or {}
        expected_vgpu: dict = {}
        for entries in (vgpu.get("vgpu-configs") or {}).values():
            for entry in entries:
                expected_vgpu.update(entry.get("vgpu-devices") or {})
        if (gpu.get("vgpu_devices") or {}) != expected_vgpu:
            return f"{gpu_id} runs vGPU devices {gpu.get('vgpu_devices')}, expected {expected_vgpu}"
    return None
