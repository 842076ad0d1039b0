"""Observed-state gates: a node is READY, an isolation change applied, an upgrade done and a
repaired GPU back in service only when its host's agent says so (DESIGN §3).

One verification path for every provider: the reconciler compares what the node must run
(:func:`expectation`, from the pool's rendered GPU config and versions) with the host's
latest agent facts (:func:`fleet.agent_facts.host_facts`), never with what a provider answers:

* the GPUs are the ones placed: each of ``node.gpu_uuids`` exists, is on the node's host and
  is listed by its agent;
* MIG: on a MIG-capable GPU the mode equals the config's (a whole-GPU pool's GPU reports MIG
  *disabled*) and the GPU instances — profile, placement start and size — equal the pool's
  ``mig_layout`` (the catalog's placement table, as planned);
* the driver equals the target (a release ``580.95.05`` exactly; a branch ``R580`` by its
  major number; blank = the GPU Operator's default, not checked) and NVML initialises (the
  agent's ``source_error`` is empty);
* after an action (node created, config applied, upgrade, reboot) a report newer than the
  action is required (``Node.observed_after``: the host's inventory count before it);
* after a repair the GPUs' health checks pass (no pending row remap, no failed check).

A disagreement is never silent: :func:`gate` records it on the node (``observed_problem``,
``observed_since``) and as a host warning, and the caller puts it in a pool condition; after
``NVKE_OBSERVED_STATE_TIMEOUT_S`` the verdict is FAILED and the caller fails or rolls back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings

from catalog.services import driver_matches
from fleet.agent_facts import HostFacts, host_facts
from fleet.host_warnings import OBSERVED_STATE, set_host_warning

from .models import Node, NodePool
from .shared_host_nodes import node_gpu_instances

OK = "ok"
WAITING = "waiting"
FAILED = "failed"


@dataclass(frozen=True)
class Expectation:
    """What a node's host must report. ``mig_enabled`` None: the GPUs have no MIG.
    ``instances``: sorted ``(profile, start, size)`` per GPU. ``driver`` "" = not checked."""

    mig_enabled: bool | None
    instances: tuple[tuple[str, int, int], ...]
    driver: str
    clean: bool = False


def timeout_s() -> float:
    return float(settings.NVKE_OBSERVED_STATE_TIMEOUT_S)


def expectation(pool: NodePool, *, driver: str | None = None, clean: bool = False) -> Expectation:
    """What ``pool.gpu_config`` (and ``driver``, default the pool's) make a node's GPUs run."""
    config = pool.gpu_config or {}
    label = (config.get("labels") or {}).get("nvidia.com/mig.config")
    enabled: bool | None = None
    if label is not None and pool.gpu_model.mig_capable:
        entries = ((config.get("mig_parted_config") or {}).get("mig-configs") or {}).get(label)
        enabled = any(entry.get("mig-enabled") for entry in entries or [])
    elif config.get("tenancy") == "shared":
        enabled = True  # its GPU instances are on MIG GPUs the fleet partitions (no mig-parted)
    # a shared pool's layout is per node, placed by the fleet: those instances are checked
    # through the node's own GPU instances (nodepools.shared_host_nodes.node_gpu_instances),
    # not from here
    instances = tuple(
        sorted(
            (d["profile"], int(d["start"]), int(d["size"])) for d in config.get("mig_layout") or []
        )
        if config.get("tenancy") != "shared"
        else ()
    )
    return Expectation(
        mig_enabled=enabled,
        instances=instances if enabled else (),
        driver=pool.driver_version if driver is None else driver,
        clean=clean,
    )


def _fmt(instances: Any) -> str:
    return "[" + ", ".join(f"{p}@{s}" if s >= 0 else "unknown" for p, s, _ in instances) + "]"


def differences(
    node: Node, expected: Expectation, facts: HostFacts | None, *, after: int | None
) -> list[str]:
    """What the host reports differently from ``expected`` ("expected X, reported Y")."""
    if facts is None:
        return ["the node's host is not in the fleet"]
    host = facts.hostname
    if facts.inventory_at is None:
        return [f"no agent report with a GPU inventory from {host} yet"]
    if after is not None and facts.inventory_count <= after:
        return [f"waiting for {host}'s agent to report after the change"]
    if facts.source_error:
        return [f"NVML does not initialise on {host} (agent: {facts.source_error})"]
    out = []
    own = node_gpu_instances(node, facts)  # a VM node of a shared host: its own GPU instances
    if not driver_matches(expected.driver, facts.driver_version):
        out.append(f"driver expected {expected.driver}, reported {facts.driver_version or 'none'}")
    for gpu_uuid in node.gpu_uuids:
        gpu = facts.gpus.get(gpu_uuid)
        if gpu is None:
            out.append(f"{gpu_uuid} is not in the fleet")
            continue
        if gpu.host_id != facts.host_id:
            out.append(f"{gpu_uuid} is not a GPU of {host}")
            continue
        if gpu.missing:
            out.append(f"{gpu_uuid} is not in {host}'s agent inventory")
            continue
        if own is not None:
            want_own = own.get(gpu_uuid, ())
            reported = set(gpu.instances)
            if gpu.mig_mode != "enabled":
                out.append(f"{gpu_uuid}: MIG mode expected enabled, reported {gpu.mig_mode}")
            elif not set(want_own) <= reported:
                # only the node's own instances are named: the others are other tenants'
                out.append(
                    f"{gpu_uuid}: the node's MIG instances expected {_fmt(want_own)}, "
                    f"missing {_fmt(sorted(set(want_own) - reported))}"
                )
        elif expected.mig_enabled is not None:
            want = "enabled" if expected.mig_enabled else "disabled"
            have = "enabled" if gpu.mig_mode == "enabled" else (gpu.mig_mode or "not reported")
            if want != have:
                out.append(f"{gpu_uuid}: MIG mode expected {want}, reported {have}")
            elif expected.mig_enabled and gpu.instances != expected.instances:
                out.append(
                    f"{gpu_uuid}: MIG instances expected {_fmt(expected.instances)}, "
                    f"reported {_fmt(gpu.instances)}"
                )
        if expected.clean and gpu.failed_checks:
            out.append(f"{gpu_uuid}: health check failed: {'; '.join(gpu.failed_checks)}")
    return out


def start_wait(node: Node, now: datetime) -> None:
    """Before an action on the node's host: the gate that follows needs a newer report and
    its deadline counts from ``now``. Saves the node's observed-state fields."""
    count = host_facts(node.host_id, ()) if node.host_id else None
    node.observed_after = count.inventory_count if count else 0
    node.observed_since = now
    node.observed_problem = ""
    node.save(update_fields=["observed_after", "observed_since", "observed_problem"])


def gate(
    pool: NodePool, node: Node, expected: Expectation, *, what: str, now: datetime
) -> tuple[str, str]:
    """``(OK | WAITING | FAILED, message)`` for ``node`` against its host's latest report.

    WAITING and FAILED name the node and every difference; the node keeps the message in
    ``observed_problem`` and its host gets the warning ``observed state: node N …`` (cleared
    once the host agrees). FAILED once ``observed_since`` is older than the timeout.
    """
    facts = host_facts(node.host_id, node.gpu_uuids) if node.host_id else None
    problems = differences(node, expected, facts, after=node.observed_after)
    prefix = f"{OBSERVED_STATE}{node.name} "
    if not problems:
        if node.observed_problem or node.observed_since or node.observed_after is not None:
            node.observed_problem, node.observed_since, node.observed_after = "", None, None
            node.save(update_fields=["observed_problem", "observed_since", "observed_after"])
        if node.host_id:
            set_host_warning(node.host_id, prefix, None)
        return OK, ""
    message = f"node {node.name} {what}: " + "; ".join(problems)
    since = node.observed_since or now
    if node.observed_problem != message[:500] or node.observed_since != since:
        node.observed_problem, node.observed_since = message[:500], since
        node.save(update_fields=["observed_problem", "observed_since"])
    if node.host_id:
        set_host_warning(node.host_id, prefix, f"{prefix}{what}: {'; '.join(problems)}")
    if (now - since).total_seconds() >= timeout_s():
        return FAILED, message
    return WAITING, f"{message}{waiting_until(since)}"


def waiting_until(since: datetime) -> str:
    """The suffix of a WAITING message: when the wait that began at ``since`` gives up
    (``NVKE_OBSERVED_STATE_TIMEOUT_S`` later, UTC to the second), so a reader knows how long
    a repair, rollout or new node may still take (a fresh-user trial waited 5 minutes with
    the default 300 s where a walk-through started with 30 s said 60 s). Fixed for one wait,
    so the condition carrying it is not rewritten at every poll."""
    deadline = since + timedelta(seconds=timeout_s())
    return (
        f" (waiting until {deadline.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}:"
        f" NVKE_OBSERVED_STATE_TIMEOUT_S {timeout_s():g} s)"
    )
