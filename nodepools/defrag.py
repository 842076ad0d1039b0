"""Defragmentation runs: the dry run of a plan (:mod:`fleet.defrag`) and its execution through
the host-drain machinery (:mod:`nodepools.host_moves`), one step after another.

**Dry run** (:func:`dry_run`): the plan for the fleet as it is now, with the names of the
nodes, pools, clusters and tenants it disrupts and when each cluster's maintenance window
allows the move. Only READY nodes that nothing else is changing move (no move, upgrade,
repair or isolation change under way, pool RUNNING and not being deleted, pool not kept in one
NVLink domain); any other holder is pinned, so a host holding one is not emptied.

**Execution** (:func:`start_run`, then :func:`advance_run` called by the task until it answers
None): each step frees one host or one NVLink island, its moves one after another in plan
order, replacement first:

1. *check*: every node of the step is still READY where the plan saw it, the source host
   still schedulable and holding only those nodes; otherwise the run FAILS with
   ``plan_out_of_date`` (make a new plan). Every node's cluster must be inside its
   maintenance window (``clusters.maintenance``); otherwise the run FAILS with
   ``outside_maintenance_window`` naming the node, tenant and when the window opens. Nothing
   was changed by the failed step.
2. *replace*: in one transaction, per move a replacement Node of the same pool is created on
   the planned target GPUs (:func:`fleet.defrag.claim_exact`; the provider's machine claim is
   then idempotent), and the source is handed to the host-drain machinery: a host step drains
   the host (``fleet.services.drain_host`` to CORDONED: the pools get HOST_MAINTENANCE
   operations, their tenants see them), an island step asks the pools to move just those
   nodes (:func:`requested_moves`, read by ``host_moves.mark_moving``). The pool reconciler
   then sees the replacement counted and the old node moving: it waits for the replacement
   to be READY (observed-state gate), drains the old node with the upgrade rules (blocking
   pods waited for ``NVKE_HOST_DRAIN_TIMEOUT_S``) and releases it (ledger closed by
   ``node_released``). The tenant pays one node throughout: billing opens the replacement's
   ledger rows when the moved node's rows close (:func:`replaced_by`, ``billing.receivers``),
   so on the ledger the moved node ends exactly when its replacement begins.
3. *watch*: when a moved node's drain is blocked (``drain-blocked``: a PodDisruptionBudget …)
   the run STOPS: FAILED with ``move_blocked`` naming the node, its tenant and the pods; a
   host step's host stays cordoned with the replacement running (drain it again with force to
   go on, or uncordon it to cancel the move); an island step's move is cancelled (the run no
   longer asks for it: ``host_moves`` puts the node back to READY and scales the surplus
   replacement down, newest first). When every old node is released the step is done: a host
   step's host (CORDONED, empty) is uncordoned back to AVAILABLE, a whole host free.

A step not done within ``NVKE_DEFRAG_STEP_TIMEOUT_S`` FAILS the run with ``move_timed_out``.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Collection
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from clusters.choices import ACTIVE_OPERATION_STATUSES, OperationStatus, Phase
from clusters.maintenance import next_window_start
from clusters.providers import ProviderError, get_provider
from fleet import defrag as planner
from fleet.choices import SCHEDULABLE_HOST_STATES, HostState
from fleet.models import Host
from fleet.services import drain_host, holders_on, uncordon_host
from nvke.conditions import get_condition
from nvke.errors import Conflict

from . import observed_gates
from .choices import Disruption, NodePhase
from .defrag_models import DefragRun
from .gpu_config import config_hash
from .host_moves import DRAIN_BLOCKED, MOVED
from .models import Node, NodePool
from .specs import node_spec, nodepool_spec

#: how often a run in a step looks again (s)
POLL_S = 1.0
#: bounds of a plan an operator may ask for
MAX_STEPS = 500
MAX_MOVE_MINUTES = 24 * 60


def movable_holders(holder_ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    """The holders that are READY nodes nothing else is changing (module docstring). Nodes of
    a pool that keeps all its nodes in one multi-node NVLink domain
    (``placement.same_nvlink_domain``) do not move: the planner does not know domains, and a
    move out of the rack would split the pool's ComputeDomain."""
    return set(
        Node.objects.filter(
            pk__in=list(holder_ids),
            phase=NodePhase.READY,
            disruption="",
            nodepool__phase=Phase.RUNNING,
            nodepool__deletion_requested_at__isnull=True,
        )
        # containment (@>), not a key lookup: a pool without the key must stay movable, and
        # NOT (NULL = true) would drop it
        .exclude(nodepool__placement__contains={"same_nvlink_domain": True})
        .values_list("pk", flat=True)
    )


def make_plan(
    *,
    gpu_model: str = "",
    zone: str = "",
    max_steps: int = 100,
    move_minutes: float | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The plan for the fleet now, as :meth:`fleet.defrag.Plan.as_dict` with, per move,
    ``node``, ``pool``, ``cluster``, ``tenant`` (names and ids) and ``window`` (``"now"``, the
    ISO time the cluster's maintenance window opens, or None when none opens within 60
    days), ``tenants``: the disruption per tenant by name, and ``scrubbing``: the released
    GPUs not placeable yet (:func:`scrubbing`)."""
    now = now or timezone.now()
    minutes = settings.NVKE_DEFRAG_MOVE_MINUTES if move_minutes is None else move_minutes
    views = planner.load_views(gpu_model=gpu_model or None, zone=zone or None)
    holders = {g.holder for v in views for g in v.gpus if g.holder is not None}
    pinned = holders - movable_holders(holders)
    plan = planner.plan_defrag(
        views, pinned=pinned, move_hours=minutes / 60.0, max_steps=max_steps
    ).as_dict()
    ids = [m["holder_id"] for s in plan["steps"] for m in s["moves"]]
    nodes = {
        str(n.pk): n
        for n in Node.objects.filter(pk__in=ids).select_related("nodepool", "cluster", "tenant")
    }
    tenants: dict[str, dict[str, Any]] = {}
    for step in plan["steps"]:
        for move in step["moves"]:
            node = nodes[move["holder_id"]]
            opens = next_window_start(node.cluster.maintenance_policy, now)
            move.update(
                node=node.name,
                pool={"id": str(node.nodepool_id), "name": node.nodepool.name},
                cluster={"id": str(node.cluster_id), "name": node.cluster.name},
                tenant={"id": str(node.tenant_id), "name": node.tenant.name},
                window="now" if opens == now else (opens.isoformat() if opens else None),
            )
            entry = tenants.setdefault(node.tenant.name, {"nodes": [], "gpus": 0, "gpu_hours": 0.0})
            entry["nodes"].append(node.name)
            entry["gpus"] += move["gpus"]
            entry["gpu_hours"] += move["gpu_hours"]
    plan["tenants"] = tenants
    plan["move_minutes"] = minutes
    plan["scrubbing"] = scrubbing(gpu_model=gpu_model, zone=zone)
    return plan


def scrubbing(*, gpu_model: str = "", zone: str = "") -> dict[str, Any]:
    """The released GPUs of schedulable hosts (of one model / zone) whose scrub the host's
    agent has not confirmed yet: ``{"gpus": int, "hosts": [hostname, …]}``. They are neither
    free nor held, so a plan made right after a scale-down leaves them out (and may be empty)
    until the agent's next report; the dry run says so instead of showing nothing."""
    from fleet.choices import SCHEDULABLE_HOST_STATES, ScrubState
    from fleet.models import Gpu

    gpus = Gpu.objects.filter(
        host__state__in=SCHEDULABLE_HOST_STATES,
        holder_id__isnull=True,
        scrub_state=ScrubState.PENDING,
    )
    if gpu_model:
        gpus = gpus.filter(host__gpu_model_id=gpu_model)
    if zone:
        gpus = gpus.filter(host__zone=zone)
    hosts = sorted(set(gpus.values_list("host__hostname", flat=True)))
    return {"gpus": gpus.count(), "hosts": hosts}


# --- running a plan -------------------------------------------------------------------------------


def start_run(
    *,
    actor: str,
    gpu_model: str = "",
    zone: str = "",
    max_steps: int = 100,
    move_minutes: float | None = None,
) -> DefragRun:
    """Plan now (as the dry run would) and start executing it. Raises Conflict
    ``defrag_run_active`` while another run is PENDING or RUNNING."""
    from .tasks import run_defrag

    busy = Conflict("another defragmentation run is under way", code="defrag_run_active")
    if DefragRun.objects.filter(active=True).exists():
        raise busy
    plan = make_plan(gpu_model=gpu_model, zone=zone, max_steps=max_steps, move_minutes=move_minutes)
    total = len(plan["steps"])
    try:
        with transaction.atomic():
            run = DefragRun.objects.create(
                requested_by=actor[:100],
                gpu_model=gpu_model,
                zone=zone,
                plan=plan,
                progress={"done": 0, "total": total, "stage": f"0 of {total} step(s) done"},
            )
            transaction.on_commit(lambda: run_defrag.delay(str(run.pk)))
    except IntegrityError:  # another run was created meanwhile (the unique ``active`` flag)
        raise busy from None
    return run


def requested_moves(node_ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    """The nodes among ``node_ids`` an active run's island step moves (``host_moves`` moves
    them like nodes of a draining host)."""
    return run_moves(node_ids, kinds=(planner.ISLAND,))


def run_moves(
    node_ids: Collection[uuid.UUID], *, kinds: Collection[str] = (planner.HOST, planner.ISLAND)
) -> set[uuid.UUID]:
    """The nodes among ``node_ids`` that the current step (of a kind in ``kinds``) of an
    active run moves: ``host_moves`` drains them as defragmentation moves (policy
    ``defrag-move``), a host step's nodes included although their host is drained."""
    wanted = {str(n) for n in node_ids}
    out: set[uuid.UUID] = set()
    for run in DefragRun.objects.filter(status=OperationStatus.RUNNING, step_state="moving"):
        steps = run.plan.get("steps") or []
        if run.step < len(steps) and steps[run.step]["kind"] in kinds:
            out.update(
                uuid.UUID(m["holder_id"])
                for m in steps[run.step]["moves"]
                if m["holder_id"] in wanted
            )
    return out


def replaced_by(node_id: uuid.UUID) -> uuid.UUID | None:
    """The replacement a run created for node ``node_id`` (None when it is not moved by a
    run). Billing opens the replacement's ledger rows when the moved node's close."""
    return _linked(node_id, "holder_id", "replacement_id")


def replacing(node_id: uuid.UUID) -> uuid.UUID | None:
    """The node a run's replacement ``node_id`` takes over from (None for any other node)."""
    return _linked(node_id, "replacement_id", "holder_id")


def _linked(node_id: uuid.UUID, key: str, other: str) -> uuid.UUID | None:
    wanted = {"steps": [{"moves": [{key: str(node_id)}]}]}
    for run in DefragRun.objects.filter(plan__contains=wanted):
        for step in run.plan["steps"]:
            for move in step["moves"]:
                if move.get(key) == str(node_id) and move.get(other):
                    return uuid.UUID(move[other])
    return None


def advance_run(run_id: uuid.UUID | str, now: datetime | None = None) -> float | None:
    """One step of a run (module docstring); the delay to come back, or None when it ended."""
    now = now or timezone.now()
    with transaction.atomic():
        run = DefragRun.objects.select_for_update(skip_locked=True).filter(pk=run_id).first()
        if run is None or run.status not in ACTIVE_OPERATION_STATUSES:
            return None
        steps = run.plan.get("steps") or []
        if run.step >= len(steps):
            return _end(run, OperationStatus.DONE, now)
        if run.step_state == "":
            return _start_step(run, steps[run.step], now)
        return _watch_step(run, steps[run.step], now)


def _what(move: dict[str, Any]) -> str:
    return (
        f"node {move.get('node')} of tenant {move['tenant']['name']} "
        f"(cluster {move['cluster']['name']}, pool {move['pool']['name']})"
    )


def _stop(run: DefragRun, code: str, message: str, now: datetime, retryable=False) -> None:
    run.error = {"code": code, "message": message[:1000], "retryable": retryable}
    _end(run, OperationStatus.FAILED, now)


def _end(run: DefragRun, status: str, now: datetime) -> None:
    total = len(run.plan.get("steps") or [])
    freed = ", ".join(run.freed) or "nothing"
    if status == OperationStatus.DONE:
        stage = f"{run.step} of {total} step(s) done; freed {freed}"
    else:
        stage = f"stopped at step {run.step + 1} of {total}: {run.error['message']}"[:300]
    run.status = status
    run.active = None
    run.progress = {"done": run.step, "total": total, "stage": stage}
    run.finished_at = now
    run.save()
    return None


def _start_step(run: DefragRun, step: dict[str, Any], now: datetime) -> float | None:
    moves = step["moves"]
    ids = [m["holder_id"] for m in moves]
    nodes = {
        str(n.pk): n
        for n in Node.objects.filter(pk__in=ids).select_related("nodepool__cluster", "cluster")
    }
    host = Host.objects.filter(pk=step["host_id"]).first()
    if host is None or host.state not in SCHEDULABLE_HOST_STATES or host.drain_target:
        state = host.state if host else "gone"
        return _stop(run, "plan_out_of_date", f"host {step['hostname']} is {state}", now)
    for move in moves:
        node = nodes.get(move["holder_id"])
        if (
            node is None
            or node.phase != NodePhase.READY
            or node.disruption == Disruption.MOVE
            or str(node.host_id) != move["from_host_id"]
        ):
            gone = f"{_what(move)} is no longer READY on {step['hostname']}"
            return _stop(run, "plan_out_of_date", gone, now)
    if step["kind"] == planner.HOST and {str(h) for h in holders_on(host.pk)} != set(ids):
        return _stop(
            run,
            "plan_out_of_date",
            f"host {step['hostname']} holds nodes the plan did not move (make a new plan)",
            now,
        )
    for move in moves:  # tenants' maintenance windows, before anything changes
        cluster = nodes[move["holder_id"]].cluster
        opens = next_window_start(cluster.maintenance_policy, now)
        if opens != now:
            when = f"the next one opens at {opens.isoformat()}" if opens else "none opens soon"
            return _stop(
                run,
                "outside_maintenance_window",
                f"{_what(move)} may only move inside its cluster's maintenance window: {when}",
                now,
                retryable=True,
            )
    pool_ids = sorted({n.nodepool_id for n in nodes.values()})
    locked = list(
        NodePool.objects.select_for_update(skip_locked=True, of=("self",))
        .filter(pk__in=pool_ids)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    if len(locked) != len(pool_ids):
        return POLL_S  # a reconciler is at one of the pools right now: come back
    try:
        replacements: dict[str, str] = {}
        with transaction.atomic():  # savepoint: a failed replacement leaves nothing behind
            for move in moves:
                new = _place_replacement(nodes[move["holder_id"]], move, now)
                replacements[move["holder_id"]] = str(new.pk)
            if step["kind"] == planner.HOST:
                drain_host(host, actor=f"defrag {run.pk}", target=HostState.CORDONED)
    except planner.TargetUnavailable as exc:
        return _stop(run, "plan_out_of_date", f"{_what(move)}: {exc}", now)
    except ProviderError as exc:
        return _stop(run, "provider_error", f"{_what(move)}: {exc}", now, exc.retryable)
    except Conflict as exc:  # the host's drain would break a commitment: never forced here
        return _stop(run, exc.code, f"{_what(move)}: {exc.detail}", now)
    if step["kind"] == planner.ISLAND:
        from .tasks import reconcile_nodepool

        for pool_id in pool_ids:
            transaction.on_commit(lambda pid=pool_id: reconcile_nodepool.delay(str(pid)))
    for move in moves:  # each move's replacement (billing reads it: replaced_by / replacing)
        move["replacement_id"] = replacements[move["holder_id"]]
    run.plan["steps"][run.step] = step
    run.status = OperationStatus.RUNNING
    run.started_at = run.started_at or now
    run.step_state = "moving"
    run.step_started_at = now
    run.progress = _progress(run, step, "moving")
    run.save()
    return POLL_S


def _place_replacement(old: Node, move: dict[str, Any], now: datetime) -> Node:
    """A new Node of ``old``'s pool on the move's target GPUs (as ``reconcile._scale_up``
    creates one, with the GPUs chosen by the plan instead of by placement)."""
    pool = old.nodepool
    new = Node.objects.create(
        tenant_id=pool.tenant_id,
        cluster_id=pool.cluster_id,
        nodepool=pool,
        name=f"{pool.cluster.name}-{pool.name}-{secrets.token_hex(3)}",
        created_at=now,
        kubernetes_version=old.kubernetes_version,
        driver_version=pool.driver_version,
    )
    claimed = planner.claim_exact(
        holder_id=new.pk,
        tenant_id=pool.tenant_id,
        host_id=uuid.UUID(move["to_host_id"]),
        gpu_indexes=tuple(move["to_gpu_indexes"]),
        shares_host=bool(move.get("shares_host")),
        group_id=uuid.UUID(move["group_id"]) if move.get("group_id") else None,
        driver_version=pool.driver_version,
    )
    # the provider creates the machine; its GPU claim finds the GPUs already held (idempotent)
    [placed] = get_provider(pool.cluster.provider).ensure_machines(
        nodepool_spec(pool), [node_spec(new)]
    )
    if tuple(placed.gpu_uuids) != claimed.gpu_uuids:  # pragma: no cover - claim is idempotent
        raise planner.TargetUnavailable("the provider placed the node elsewhere")
    new.host_id = placed.host_id
    new.zone = placed.zone
    new.gpu_uuids = list(placed.gpu_uuids)
    new.applied_config = config_hash(pool.gpu_config)
    new.save(update_fields=["host", "zone", "gpu_uuids", "applied_config"])
    observed_gates.start_wait(new, now)
    return new


def _progress(run: DefragRun, step: dict[str, Any], what: str) -> dict[str, Any]:
    total = len(run.plan.get("steps") or [])
    thing = (
        f"host {step['hostname']}"
        if step["kind"] == planner.HOST
        else f"NVLink island {step['island']} of {step['hostname']}"
    )
    return {
        "done": run.step,
        "total": total,
        "stage": f"step {run.step + 1} of {total}: freeing {thing}: {what}"[:300],
    }


def _watch_step(run: DefragRun, step: dict[str, Any], now: datetime) -> float | None:
    moves = step["moves"]
    old = {str(n.pk): n for n in Node.objects.filter(pk__in=[m["holder_id"] for m in moves])}
    for move in moves:
        node = old.get(move["holder_id"])
        if node is not None and (node.disruption, node.disruption_step) == (
            Disruption.MOVE,
            DRAIN_BLOCKED,
        ):
            pool = NodePool.objects.get(pk=node.nodepool_id)
            cond = get_condition(pool.conditions, "HostDrainBlocked") or {}
            if step["kind"] == planner.HOST:
                then = (
                    f"{step['hostname']} stays cordoned with the replacement running: drain it "
                    "again with force to go on, or uncordon it to cancel the move"
                )
            else:  # the run no longer asks for the move: the node stays, the surplus goes
                then = "the move is cancelled: the node stays and its replacement is scaled down"
            return _stop(
                run,
                "move_blocked",
                f"{_what(move)}: its drain is blocked ({cond.get('message') or 'pods'}); {then}",
                now,
            )
    released = [
        n
        for n in old.values()
        if (n.disruption, n.disruption_step) == (Disruption.MOVE, MOVED)
        or n.phase == NodePhase.DELETED
    ]
    if len(released) < len(moves):
        waited = (now - (run.step_started_at or now)).total_seconds()
        if waited > settings.NVKE_DEFRAG_STEP_TIMEOUT_S:
            return _stop(
                run,
                "move_timed_out",
                f"step not done after {waited:.0f} s: {len(released)} of {len(moves)} node(s) "
                "moved (see the pools' HOST_MAINTENANCE operations)",
                now,
                retryable=True,
            )
        progress = _progress(run, step, f"{len(released)} of {len(moves)} node(s) moved")
        if progress != run.progress:
            run.progress = progress
            run.save(update_fields=["progress"])
        return POLL_S
    if step["kind"] == planner.HOST:
        host = Host.objects.get(pk=step["host_id"])
        if host.drain_target or holders_on(host.pk):
            return POLL_S  # the last release is settling the host
        if host.state == HostState.CORDONED:
            uncordon_host(host, actor=f"defrag {run.pk}")
    run.freed = [*run.freed, _freed_name(step)]
    run.step += 1
    run.step_state = ""
    run.step_started_at = None
    run.progress = _progress(run, step, "done")
    run.save()
    return 0.0


def _freed_name(step: dict[str, Any]) -> str:
    if step["kind"] == planner.HOST:
        return step["hostname"]
    return f"{step['hostname']} island {step['island']}"
