"""Node pool use-cases: validate against the catalog and fleet, write the spec, create the
Operation, enqueue the reconciler on commit.

``create_nodepool`` and ``update_isolation`` take ``dry_run``: everything is validated and
rendered as for the real call, nothing is written, and a :class:`DryRun` says what the nodes
would receive and which of them would be drained or repartitioned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from catalog.services import UnknownGpuModel, get_gpu_model
from clusters.choices import GONE_PHASES, OperationType, Phase
from clusters.models import Cluster, Operation, active_operation, cancel_operations
from clusters.operations import Audit, start_operation
from clusters.services import ensure_no_active_operation
from fleet.placement import max_host_gpus
from fleet.shared_hosts import is_shared_policy
from nvke.errors import Conflict, InvalidInput
from nvke.queueing import send_on_commit
from tenants import quotas
from tenants.principal import Principal

from . import nvlink
from .choices import GpuPublishing, NodePhase
from .dra import validate_gpu_publishing
from .gpu_config import config_hash, render_gpu_config
from .isolation import validate_driver, validate_isolation
from .models import NodePool

MAX_NODES_PER_POOL = 1000


def set_pool_setting(principal: Principal, pool: NodePool, field: str, value: Any) -> NodePool:
    """Write one tenant-set setting of ``pool`` (``autoscaling``, ``disruption_hook`` …) under
    the pool's row lock, audited as ``nodepool.<field>`` with its value before and after.

    Returns the locked row (a caller inside its own ``transaction.atomic`` keeps the lock and
    decides on it, as autoscaling does); ``pool`` gets the new value too."""
    from tenants import audit

    with transaction.atomic():
        locked = NodePool.objects.select_for_update().get(pk=pool.pk)
        before = getattr(locked, field)
        setattr(locked, field, value)
        locked.save(update_fields=[field, "updated_at"])
        audit.record(
            actor=principal.label,
            action=f"nodepool.{field}",
            target_type="nodepool",
            target_id=locked.id,
            tenant_id=locked.tenant_id,
            before={field: before},
            after={field: value},
        )
    setattr(pool, field, value)
    return locked


def pool_spec_of(pool: NodePool) -> dict:
    """The spec fields of a node pool, for audit diffs."""
    return {
        "name": pool.name,
        "gpu_model": pool.gpu_model_id,
        "gpus_per_node": pool.gpus_per_node,
        "node_count": pool.node_count,
        "isolation": pool.isolation,
        "driver_version": pool.driver_version,
        "cuda_version": pool.cuda_version,
        "placement": pool.placement,
        "gpu_publishing": pool.gpu_publishing,
        "reservation": str(pool.reservation_id) if pool.reservation_id else None,
    }


def release_pool_quota(pool: NodePool) -> None:
    """Give back the nodes and GPUs a pool's spec reserved (on its deletion request)."""
    quotas.release(
        pool.tenant_id,
        nodes=pool.node_count,
        gpus={pool.gpu_model_id: pool.node_count * pool.gpus_per_node},
    )


def request_deletion(pool: NodePool, reason: str, now: datetime) -> bool:
    """Mark ``pool`` (its row locked by the caller) for deletion: its active operations are
    CANCELLED (``reason``), its quota released, ``deletion_requested_at`` set, phase
    DELETING, generation+1. The one place a pool's deletion starts (its own DELETE, its
    cluster's deletion, or the reconciler that sees the cluster's). Idempotent: a pool
    already marked keeps its timestamp and releases nothing twice. Returns True when this call
    marked it.

    Lock order: operation rows before the tenant's quota row, as everywhere (a reconciler
    holding this pool's operation may be waiting for the quota row: the reverse order
    deadlocks, found by tests/tenants/test_quota_leaks.py's randomised races).
    """
    cancel_operations(pool.id, reason, now)
    first = pool.deletion_requested_at is None
    if first:
        release_pool_quota(pool)
    pool.deletion_requested_at = pool.deletion_requested_at or now
    pool.phase = Phase.DELETING
    pool.generation += 1
    pool.save(update_fields=["deletion_requested_at", "phase", "generation", "updated_at"])
    return first


def enqueue_reconcile(pool_id) -> None:
    from .tasks import reconcile_nodepool

    send_on_commit(reconcile_nodepool, pool_id)


@dataclass
class DryRun:
    """What a create/update would do: ``isolation`` (normalised), ``gpu_config`` (rendered),
    ``disruption``: ``{"nodes": [{"name", "drain", "repartition", "gpus"}], "drain": n,
    "repartition": n, "max_unavailable": 1}`` (an update changes one node at a time).

    A create also answers ``capacity``, ``quota`` and ``cost``
    (:mod:`nodepools.capacity_check`); None for an isolation change. A resize answers
    ``node_count`` too (:func:`nodepools.scaling.size_dry_run`)."""

    isolation: dict[str, Any]
    gpu_config: dict[str, Any]
    disruption: dict[str, Any] = field(default_factory=dict)
    capacity: dict[str, Any] | None = None
    quota: dict[str, Any] | None = None
    cost: dict[str, Any] | None = None
    #: why ``cost`` is None: billing's ``missing_price`` body (as the usage API's cost_error),
    #: or the create's ``reservation_exhausted`` 409 body on a reservation without room
    cost_error: dict[str, Any] | None = None
    #: a resize's ``{"from", "to"}`` (:func:`nodepools.scaling.size_dry_run`), else None
    node_count: dict[str, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {
            "dry_run": True,
            "isolation": self.isolation,
            "gpu_config": self.gpu_config,
            "disruption": self.disruption,
            "capacity": self.capacity,
            "quota": self.quota,
            "cost": self.cost,
        }
        if self.cost_error is not None:
            out["cost_error"] = self.cost_error
        if self.node_count is not None:
            out["node_count"] = self.node_count
        return out


def resolve_reservation(cluster: Cluster, gpu_model: str, reservation_id: Any):
    """The cluster's tenant's reservation ``reservation_id`` for a pool of ``gpu_model``, or
    None when no id is given. InvalidInput (field ``reservation``): ``unknown_reservation``
    (missing or another tenant's: the same answer), ``reservation_mismatch`` (another model
    or region than the pool's)."""
    if reservation_id in (None, ""):
        return None
    from reservations.models import Reservation

    try:
        found = Reservation.objects.filter(pk=reservation_id, tenant_id=cluster.tenant_id).first()
    except (ValueError, TypeError, ValidationError):
        found = None
    if found is None:
        raise InvalidInput(
            f"no reservation {reservation_id}", code="unknown_reservation", field="reservation"
        )
    if found.gpu_model_id != gpu_model or found.region != cluster.region:
        raise InvalidInput(
            f"reservation {found.id} is for {found.gpu_model_id} in {found.region}; the pool "
            f"is {gpu_model} in {cluster.region}",
            code="reservation_mismatch",
            field="reservation",
        )
    return found


def _check_reservation_room(reservation, needed: int) -> None:
    """Under the reservation's row lock: it is ACTIVE and has ``needed`` GPUs left after its
    other pools. Conflict ``reservation_not_active`` / ``reservation_exhausted``."""
    from reservations.models import Reservation

    reservation = Reservation.objects.select_for_update().get(pk=reservation.pk)
    state = reservation.state_at(timezone.now())
    if state != "ACTIVE":
        raise Conflict(
            f"reservation {reservation.label} is {state} (from {reservation.start.isoformat()})",
            code="reservation_not_active",
            field="reservation",
            extra={"start": reservation.start.isoformat(), "state": state},
        )
    check_reservation_left(reservation, needed)


def check_reservation_left(reservation, needed: int, *, pool_id=None) -> None:
    """Conflict ``reservation_exhausted`` when the live pools drawing from ``reservation``
    other than ``pool_id`` plan so many GPUs that ``needed`` more do not fit in its size: a
    pool is created, or resized to ``needed`` GPUs, only within its reservation (the cost of
    its GPUs beyond it would not be covered, nor its nodes placed on it)."""
    from .capacity_check import planned_gpus

    planned = planned_gpus(reservation, exclude_pool=pool_id)
    if planned + needed > reservation.gpus:
        raise Conflict(
            f"reservation {reservation.label} holds {reservation.gpus} GPU(s), {planned} are "
            f"planned by its other pools; this pool needs {needed}",
            code="reservation_exhausted",
            field="node_count",
            extra={"reserved": reservation.gpus, "planned": planned, "needed": needed},
        )


def _check_reserved_pressure(
    tenant_id, model: str, region: str, gpus_per_node: int, node_count: int
) -> None:
    """Conflict ``capacity_reserved`` when the pool's ``node_count`` x ``gpus_per_node`` GPUs
    would fit on-demand without the reservations but do not with them — reserved GPUs free or
    held by reservation pools (:func:`reservations.capacity.reserved_block`; the binding check
    is placement's, :mod:`reservations.guard`; this one answers at once instead of after the
    reconciler's retries)."""
    from reservations import capacity

    from .capacity_check import new_node_requests

    needed = gpus_per_node * node_count
    now = timezone.now()
    requests = new_node_requests(tenant_id, model, region, "", gpus_per_node, node_count)
    block = capacity.reserved_block(requests, now)
    if block is None:
        return
    own = [
        str(r)
        for r in capacity.live_reservations(model, region, now)
        .filter(tenant_id=tenant_id)
        .values_list("id", flat=True)
    ]
    raise Conflict(
        block.message(model, region)
        + (f"; create the pool with reservation={own[0]}" if own else ""),
        code="capacity_reserved",
        extra={
            "capacity": block.capacity,
            "on_demand": block.on_demand,
            "reserved": block.reserved,
            "held_by_reservations": block.held_by_reservations,
            "free_on_demand": block.free_on_demand,
            "needed": needed,
            "placeable_from": block.until.isoformat() if block.until else None,
            "own_reservations": own,
        },
    )


def create_nodepool(
    *,
    principal: Principal,
    cluster: Cluster,
    name: str,
    gpu_model: str,
    gpus_per_node: int,
    node_count: int,
    isolation: Any,
    driver_version: str = "",
    cuda_version: str = "",
    placement: Any = None,
    reservation: Any = None,
    gpu_publishing: str = GpuPublishing.DEVICE_PLUGIN,
    dry_run: bool = False,
) -> Operation | DryRun:
    """Create a node pool (phase PROVISIONING) and its CREATE_NODE_POOL operation.

    ``placement`` ``{"same_nvlink_domain": true}`` keeps every node in one NVLink domain
    (:mod:`nodepools.nvlink`: 400 ``nvlink_domain_unsupported`` / ``nvlink_domain_too_small``
    / ``invalid_placement``, 409 ``nvlink_domain_full`` naming the largest free domain).
    ``reservation`` (an id of the tenant's reservation) makes the pool draw from it: its
    nodes are placed on the reserved GPUs, which unreserved pools cannot take.
    ``gpu_publishing`` ``dra`` publishes the GPUs as DRA devices instead of ``nvidia.com/gpu``
    (:mod:`nodepools.dra`: 400 ``invalid_gpu_publishing``, ``dra_isolation_not_supported``).

    Raises InvalidInput (``unknown_gpu_model``, ``gpus_per_node_too_large``, isolation and
    driver codes, see :mod:`nodepools.isolation`; ``unknown_reservation``,
    ``reservation_mismatch``) or Conflict (``cluster_not_active``,
    ``duplicate_nodepool_name``, ``reservation_not_active``, ``reservation_exhausted``,
    ``capacity_reserved``, ``quota_exceeded``). Nothing is written when a check fails, or with
    ``dry_run`` (then a :class:`DryRun`: new nodes are provisioned, none is drained, and the
    capacity / quota / cost answers of :mod:`nodepools.capacity_check`).
    """
    try:
        model = get_gpu_model(gpu_model)
    except UnknownGpuModel as exc:
        raise InvalidInput(
            f"unknown GPU model {gpu_model!r}",
            code="unknown_gpu_model",
            field="gpu_model",
            extra={"valid_gpu_models": list(exc.valid)},
        ) from exc
    policy = validate_isolation(model, isolation)
    validate_gpu_publishing(gpu_publishing, policy)
    validate_driver(
        model,
        driver_version=driver_version or None,
        cuda_version=cuda_version or None,
        policy=policy,
    )
    largest = max_host_gpus(model.slug)
    # a shared pool's node is a VM holding gpus_per_node GPU instances of one host's GPUs
    per_gpu = (model.max_mig_instances or 1) if is_shared_policy(policy) else 1
    if largest and gpus_per_node > largest * per_gpu:
        each = f" of at most {per_gpu} GPU instances each" if per_gpu > 1 else ""
        raise InvalidInput(
            f"gpus_per_node={gpus_per_node} but the largest {model.slug} host has {largest} "
            f"GPUs{each}",
            code="gpus_per_node_too_large",
            field="gpus_per_node",
            extra={"max_gpus_per_node": largest * per_gpu},
        )
    placement = nvlink.validate_placement(
        model, placement, gpus_per_node=gpus_per_node, node_count=node_count
    )
    gpu_config = render_gpu_config(
        gpu_model=model,
        gpus_per_node=gpus_per_node,
        isolation=policy,
        pool_name=name,
        driver_version=driver_version or None,
        placement=placement,
        gpu_publishing=gpu_publishing,
    )
    with transaction.atomic():
        clusters = Cluster.objects.all()
        if not dry_run:  # a dry run writes nothing: it takes no lock and waits for no one
            clusters = clusters.select_for_update(of=("self",), no_key=True)
        cluster = clusters.get(pk=cluster.pk)
        if cluster.phase in GONE_PHASES or cluster.deletion_requested_at is not None:
            raise Conflict(
                f"cluster {cluster.name!r} is {cluster.phase}", code="cluster_not_active"
            )
        if not dry_run:  # the cluster's one-operation lock is for changes, never for a look
            ensure_no_active_operation(cluster)
        if (
            NodePool.objects.filter(cluster=cluster, name=name)
            .exclude(phase=Phase.DELETED)
            .exists()
        ):
            raise Conflict(
                f"node pool {name!r} already exists in cluster {cluster.name!r}",
                code="duplicate_nodepool_name",
                field="name",
            )
        found = resolve_reservation(cluster, model.slug, reservation)
        if nvlink.wants_one_domain(placement):
            nvlink.check_room(
                gpu_model=model.slug,
                region=cluster.region,
                tenant_id=cluster.tenant_id,
                gpus_per_node=gpus_per_node,
                nodes=node_count,
                reservation=found,
            )
        needed = node_count * gpus_per_node
        if dry_run:
            from .capacity_check import capacity_answer, cost_fields, quota_answer

            costs: dict[str, Any] | None = None
            if found is not None:
                try:
                    check_reservation_left(found, needed)
                except Conflict as exc:
                    # the create answers this 409: no cost is quoted as "covered by the
                    # reservation" for GPUs it has no room for (a fresh-user trial read 4
                    # GPU-h per hour covered by a reservation of 2); nothing is priced
                    body = {"code": exc.code, "detail": str(exc.detail), **exc.extra}
                    costs = {"cost": None, "cost_error": body}
            if costs is None:
                costs = cost_fields(
                    tenant_id=cluster.tenant_id,
                    gpu_model=model.slug,
                    gpus=needed,
                    reservation=found,
                    isolation=policy,
                )
            return DryRun(
                policy,
                gpu_config,
                {"nodes": [], "drain": 0, "repartition": 0, "provision": node_count},
                capacity=capacity_answer(
                    tenant_id=cluster.tenant_id,
                    gpu_model=model.slug,
                    region=cluster.region,
                    gpus_per_node=gpus_per_node,
                    node_count=node_count,
                    reservation=found,
                    isolation=policy,
                    driver_version=driver_version,
                ),
                quota=quota_answer(
                    tenant_id=cluster.tenant_id,
                    gpu_model=model.slug,
                    gpus=needed,
                    nodes=node_count,
                ),
                **costs,
            )
        if found is not None:
            _check_reservation_room(found, needed)
        elif not is_shared_policy(policy):  # a shared pool takes no (reservable) whole GPU
            _check_reserved_pressure(
                cluster.tenant_id, model.slug, cluster.region, gpus_per_node, node_count
            )
        quotas.reserve(
            cluster.tenant_id,
            nodes=node_count,
            gpus={model.slug: node_count * gpus_per_node},
        )
        pool = NodePool.objects.create(
            tenant=cluster.tenant,
            cluster=cluster,
            name=name,
            gpu_model=model,
            gpus_per_node=gpus_per_node,
            node_count=node_count,
            isolation=policy,
            driver_version=driver_version,
            cuda_version=cuda_version,
            placement=placement,
            reservation=found,
            gpu_publishing=gpu_publishing,
            gpu_config=gpu_config,
            kubernetes_version=cluster.control_plane_version or cluster.kubernetes_version,
        )
        op = start_operation(
            **pool.operation_target(),
            type=OperationType.CREATE_NODE_POOL,
            requested_by=principal.label,
            total=node_count,
            audit_event=Audit("nodepool.create", after=pool_spec_of(pool)),
        )
    return op


def delete_nodepool(*, principal: Principal, pool: NodePool) -> Operation:
    """Request deletion of a node pool (its nodes are drained and released by the reconciler).

    Idempotent while the deletion runs. Raises Conflict ``nodepool_deleted``.
    """
    with transaction.atomic():
        pool = NodePool.objects.select_for_update().get(pk=pool.pk)
        if pool.phase == Phase.DELETED:
            raise Conflict("the node pool is already deleted", code="nodepool_deleted")
        if pool.deletion_requested_at is not None and pool.phase != Phase.DELETE_FAILED:
            existing = active_operation(pool.id)
            if existing is not None and existing.type == OperationType.DELETE_NODE_POOL:
                return existing
        previous_phase = pool.phase
        request_deletion(pool, "superseded by the node pool's deletion", timezone.now())
        op = start_operation(
            **pool.operation_target(),
            type=OperationType.DELETE_NODE_POOL,
            requested_by=principal.label,
            total=pool.nodes.exclude(phase=NodePhase.DELETED).count(),
            audit_event=Audit(
                "nodepool.delete", before={"phase": previous_phase}, after={"phase": pool.phase}
            ),
        )
    return op


def disruption(pool: NodePool, new_config: dict[str, Any]) -> dict[str, Any]:
    """Which live nodes a change to ``new_config`` drains and repartitions.

    A node whose GPU config differs is drained (its GPU pods evicted) before the change;
    it is repartitioned when its MIG geometry (mig-parted config) changes too. Nodes are
    changed one at a time (``max_unavailable`` 1).
    """
    new_hash = config_hash(new_config)
    new_mig = (new_config.get("mig_strategy"), new_config.get("mig_layout"))
    old_mig = (pool.gpu_config.get("mig_strategy"), pool.gpu_config.get("mig_layout"))
    nodes = []
    for node in pool.nodes.live().order_by("created_at", "name"):
        current = node.applied_config or config_hash(pool.gpu_config)
        drain = current != new_hash
        nodes.append(
            {
                "name": node.name,
                "drain": drain,
                "repartition": drain and new_mig != old_mig,
                "gpus": len(node.gpu_uuids),
            }
        )
    return {
        "nodes": nodes,
        "drain": sum(n["drain"] for n in nodes),
        "repartition": sum(n["repartition"] for n in nodes),
        "max_unavailable": 1,
    }


def update_isolation(
    *, principal: Principal, pool: NodePool, isolation: Any, dry_run: bool = False
) -> Operation | DryRun:
    """Change a pool's isolation: an UPDATE_ISOLATION operation that drains, repartitions and
    validates the nodes one at a time (:mod:`nodepools.reconcile`), rolling back if a node
    fails validation.

    Raises InvalidInput (isolation / driver codes; ``dra_isolation_not_supported`` for a DRA
    pool), Conflict ``nodepool_not_running`` (the pool
    is being created, deleted, or has another operation running), ``isolation_unchanged`` or
    ``isolation_change_not_supported`` (a shared pool, from or to: not built).
    ``dry_run`` returns a :class:`DryRun` and writes nothing.
    """
    model = pool.gpu_model
    policy = validate_isolation(model, isolation)
    validate_gpu_publishing(pool.gpu_publishing, policy)
    if is_shared_policy(pool.isolation) or is_shared_policy(policy):
        # not built (README "Shared hosts"): refused before anything is touched, dry run too
        raise Conflict(
            "isolation changes of shared (tenancy: shared) MIG or vGPU pools are not supported "
            "yet; create a new pool with the isolation you want and delete this one",
            code="isolation_change_not_supported",
            field="isolation",
        )
    validate_driver(
        model,
        driver_version=pool.driver_version or None,
        cuda_version=pool.cuda_version or None,
        policy=policy,
    )
    new_config = render_gpu_config(
        gpu_model=model,
        gpus_per_node=pool.gpus_per_node,
        isolation=policy,
        pool_name=pool.name,
        driver_version=pool.driver_version or None,
        placement=pool.placement,
        gpu_publishing=pool.gpu_publishing,
    )
    with transaction.atomic():
        pools = NodePool.objects.all()
        if not dry_run:  # a dry run writes nothing: it takes no lock and waits for no one
            pools = pools.select_for_update(of=("self",))
        pool = pools.get(pk=pool.pk)
        if pool.phase != Phase.RUNNING or pool.deletion_requested_at is not None:
            raise Conflict(
                f"the node pool is {pool.phase}; its isolation can change when it is RUNNING",
                code="nodepool_not_running",
            )
        if not dry_run:  # the cluster's one-operation lock is for changes, never for a look
            ensure_no_active_operation(
                Cluster.objects.select_for_update(no_key=True).get(pk=pool.cluster_id)
            )
        busy = None if dry_run else active_operation(pool.id)
        if not dry_run and (busy is not None or pool.rollout):
            raise Conflict(
                "another operation is running on this node pool"
                + (f" ({busy.type} {busy.id})" if busy else ""),
                code="nodepool_not_running",
            )
        if policy == pool.isolation:
            raise Conflict("the node pool already has this isolation", code="isolation_unchanged")
        plan = disruption(pool, new_config)
        if dry_run:
            return DryRun(policy, new_config, plan)
        before = {"isolation": pool.isolation}
        # nodes created before applied_config existed run the pool's current config
        pool.nodes.filter(applied_config="").update(applied_config=config_hash(pool.gpu_config))
        op = start_operation(
            **pool.operation_target(),
            type=OperationType.UPDATE_ISOLATION,
            requested_by=principal.label,
            total=plan["drain"],
            audit_event=Audit(
                "nodepool.update_isolation", before=before, after={"isolation": policy}
            ),
        )
        pool.rollout = {
            "operation": str(op.id),
            "state": "rolling",
            "from_isolation": pool.isolation,
            "from_gpu_config": pool.gpu_config,
        }
        pool.isolation = policy
        pool.gpu_config = new_config
        pool.generation += 1
        pool.phase = Phase.RECONCILING
        pool.save(
            update_fields=[
                "rollout",
                "isolation",
                "gpu_config",
                "generation",
                "phase",
                "updated_at",
            ]
        )
    return op
