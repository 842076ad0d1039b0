"""Checkpoint-aware disruption: a tenant's disruption hook on a node pool, and the gate of the
one disruption path (:mod:`nodepools.disruption`) that asks before a planned disruption.

A pool's hook is ``NodePool.disruption_hook = {"checkpoint_deadline_s": n}`` (set with
:func:`set_disruption_hook`: ``n`` up to the operator's ``NVKE_CHECKPOINT_DEADLINE_MAX_S``,
:data:`DEFAULT_DEADLINE_S` when the tenant gives none). Before a *planned* drain of one of its
nodes (:data:`PLANNED`: upgrade, isolation change, defragmentation move, host maintenance,
scale-down) :func:`checkpoint_gate`:

1. finds the node's request for this drain, or writes one (:class:`DisruptionRequest`, with
   ``deadline = now + n``) and sends ``disruption_requested`` in the same transaction: the
   webhooks app turns it into the CloudEvent ``nodepool.disruption.requested`` (the request
   id, the nodes, the deadline) through its outbox;
2. keeps the drain WAITING with the reason ``"waiting for checkpoint (deadline <iso>)"`` until
   the request is acknowledged — through the API (:func:`acknowledge`, ``POST …/
   disruption-requests/{id}/ack``) or by a pod on the node annotated
   ``nvke.io/checkpointed: <request id>`` in the tenant's cluster (read through the provider:
   the tenant's real API on a hosted cluster) — or its deadline passed; never through the
   webhook's HTTP answer;
3. then releases it (``released_at``): the drain evicts. The node's drain clock
   (``drain_started_at``, which the pods' drain timeout counts from) restarts then, so the
   checkpoint wait never eats the time a PodDisruptionBudget is given.

Emergencies never wait: ``immediate`` drains (repair of a failing GPU — an Xid 79 fallen off
the bus —, the release of a deleted machine) ask no gate at all.

Which request belongs to a node's current drain: one of its pool naming the node, requested
or released since the node's ``drain_started_at`` (a later drain of the node cordons anew and
asks again). A pool's reconciler runs one step at a time (a task per pool), so two requests
for one drain are not written concurrently; acks are guarded UPDATEs.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from nvke.errors import ApiError, InvalidInput

from .models import DisruptionRequest, Node, NodePool

if TYPE_CHECKING:
    from tenants.principal import Principal

    from .disruption import DrainPolicy

log = logging.getLogger(__name__)

#: the pod annotation a workload sets, with the request id as value, once it checkpointed
ANNOTATION = "nvke.io/checkpointed"
#: a hook's deadline when the tenant names none (capped by NVKE_CHECKPOINT_DEADLINE_MAX_S)
DEFAULT_DEADLINE_S = 600
#: the callers of :data:`nodepools.disruption.POLICIES` whose drains ask first
PLANNED = frozenset(
    {"upgrade", "isolation-change", "defrag-move", "host-maintenance", "scale-down"}
)


def max_deadline_s() -> int:
    return int(settings.NVKE_CHECKPOINT_DEADLINE_MAX_S)


def set_disruption_hook(
    *, principal: Principal, pool: NodePool, checkpoint_deadline_s: int | None
) -> dict[str, Any]:
    """Attach (or change) the pool's disruption hook; returns it. ``checkpoint_deadline_s``
    None: :data:`DEFAULT_DEADLINE_S` (at most the operator's maximum). InvalidInput
    ``checkpoint_deadline_too_long`` above ``NVKE_CHECKPOINT_DEADLINE_MAX_S``. Audited
    (``nodepool.disruption_hook``). Requests already asked keep their deadline."""
    from .services import set_pool_setting

    limit = max_deadline_s()
    if checkpoint_deadline_s is None:
        checkpoint_deadline_s = min(DEFAULT_DEADLINE_S, limit)
    if checkpoint_deadline_s > limit:
        raise InvalidInput(
            f"checkpoint_deadline_s may be at most {limit} s (the operator's setting "
            "NVKE_CHECKPOINT_DEADLINE_MAX_S)",
            code="checkpoint_deadline_too_long",
            field="checkpoint_deadline_s",
        )
    hook = {"checkpoint_deadline_s": int(checkpoint_deadline_s)}
    set_pool_setting(principal, pool, "disruption_hook", hook)
    return hook


def remove_disruption_hook(*, principal: Principal, pool: NodePool) -> None:
    """Detach the pool's hook: planned disruptions stop asking; a drain waiting for a
    checkpoint goes on at its next look (its request is released). Audited."""
    from .services import set_pool_setting

    set_pool_setting(principal, pool, "disruption_hook", {})


def waiting_text(request: DisruptionRequest) -> str:
    """What a drain held by ``request`` says (progress, conditions)."""
    return f"waiting for checkpoint (deadline {request.deadline.isoformat()})"


def current_request(node: Node) -> DisruptionRequest | None:
    """The request of ``node``'s current drain (see the module doc), or None."""
    if node.drain_started_at is None:
        return None
    since = node.drain_started_at
    return (
        DisruptionRequest.objects.filter(nodepool_id=node.nodepool_id, nodes__contains=[node.name])
        .filter(Q(requested_at__gte=since) | Q(released_at__gte=since))
        .order_by("-requested_at")
        .first()
    )


def checkpoint_gate(node: Node, policy: DrainPolicy, now: datetime) -> str | None:
    """The gate of :data:`nodepools.disruption.GATES`: None (go on) unless ``policy`` is a
    planned caller's, the node's pool has a hook and the node's request is neither
    acknowledged nor past its deadline; then :func:`waiting_text`. Asks (writes the request,
    tells the tenant) on the first look; looks for the pod annotation at every look."""
    if policy.caller not in PLANNED:
        return None
    hook = NodePool.objects.filter(pk=node.nodepool_id).values_list("disruption_hook", flat=True)
    deadline_s = (hook.first() or {}).get("checkpoint_deadline_s")
    request = current_request(node)
    if request is None:
        if not deadline_s:
            return None
        request = _ask(node, policy.caller, int(deadline_s), now)
    if request.released_at is not None:
        return None
    if request.acknowledged_at is None and deadline_s:
        by = _annotated(node, request)
        if by:
            acknowledge(request, via="annotation", by=by, now=now)
            request.refresh_from_db()
    if request.acknowledged_at is not None or now >= request.deadline or not deadline_s:
        _release(request, node, now)
        return None
    return waiting_text(request)


def _ask(node: Node, reason: str, deadline_s: int, now: datetime) -> DisruptionRequest:
    """Write the request and tell the tenant (signal ``disruption_requested``, whose webhook
    delivery row commits with it)."""
    from .signals import disruption_requested

    with transaction.atomic():
        request = DisruptionRequest.objects.create(
            tenant_id=node.tenant_id,
            nodepool_id=node.nodepool_id,
            nodes=[node.name],
            reason=reason,
            requested_at=now,
            deadline=now + timedelta(seconds=deadline_s),
        )
        disruption_requested.send_robust(sender=DisruptionRequest, request=request)
    log.info("node %s: %s asks for a checkpoint (request %s)", node.name, reason, request.id)
    return request


def _annotated(node: Node, request: DisruptionRequest) -> str:
    """``namespace/name`` of a pod on the node annotated with the request's id, or ""."""
    from clusters.providers import get_provider

    from .specs import node_spec, nodepool_spec

    pool = NodePool.objects.select_related("cluster").get(pk=node.nodepool_id)
    notes = get_provider(pool.cluster.provider).pod_annotations(
        nodepool_spec(pool), node_spec(node), ANNOTATION
    )
    return next((pod for pod, value in notes.items() if value.strip() == str(request.id)), "")


def _release(request: DisruptionRequest, node: Node, now: datetime) -> None:
    """The drain goes on: ``released_at`` set once; the node's drain clock restarts."""
    with transaction.atomic():
        if DisruptionRequest.objects.filter(pk=request.pk, released_at=None).update(
            released_at=now
        ):
            from .disruption import restart_clock  # disruption asks this module's gate

            restart_clock(node, now)
    request.released_at = request.released_at or now


def acknowledge(
    request: DisruptionRequest, *, via: str, by: str, now: datetime
) -> DisruptionRequest:
    """The tenant checkpointed: ``acknowledged_at/via/by`` set once (a guarded UPDATE; a
    second ack changes nothing) and the pool's reconciler is woken, so the drain goes on at
    once. ApiError 409 ``disruption_request_expired`` once the drain went on at the deadline
    without an answer. Audited (``nodepool.disruption_acknowledged``)."""
    from clusters.operations import enqueue_by_name
    from tenants import audit

    with transaction.atomic():
        done = DisruptionRequest.objects.filter(
            pk=request.pk, acknowledged_at=None, released_at=None
        ).update(acknowledged_at=now, acknowledged_via=via, acknowledged_by=by[:200])
        request.refresh_from_db()
        if not done:
            if request.acknowledged_at is not None:
                return request  # already acknowledged: nothing to do
            raise ApiError(
                f"the deadline {request.deadline.isoformat()} passed and the drain went on "
                f"at {request.released_at.isoformat() if request.released_at else '?'}",
                code="disruption_request_expired",
                status_code=409,
            )
        audit.record(
            actor=by if via == "api" else f"annotation:{by}",
            action="nodepool.disruption_acknowledged",
            target_type="nodepool",
            target_id=request.nodepool_id,
            tenant_id=request.tenant_id,
            after={"request": str(request.id), "nodes": request.nodes, "via": via},
        )
        enqueue_by_name("nodepools.tasks.reconcile_nodepool", request.nodepool_id)
    return request
