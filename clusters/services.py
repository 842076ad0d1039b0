"""Cluster use-cases: write the spec, create the Operation, enqueue the reconciler on commit."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet.models import Host
from nvke.errors import Conflict, InvalidInput
from nvke.queueing import send_on_commit
from tenants import audit, quotas
from tenants.principal import Principal

from . import maintenance, versions
from .choices import ACTIVE_OPERATION_STATUSES, GONE_PHASES, OperationType, Phase, TargetType
from .models import Cluster, Operation, active_operation, cancel_operations
from .operations import Audit, start_operation
from .signals import collect_node_versions, operation_cancelled


def _enqueue(cluster_id) -> None:
    from .tasks import reconcile_cluster

    send_on_commit(reconcile_cluster, cluster_id)


def spec_of(cluster: Cluster) -> dict:
    """The spec fields of a cluster, for audit diffs."""
    return {
        "name": cluster.name,
        "kubernetes_version": cluster.kubernetes_version,
        "region": cluster.region,
        "provider": cluster.provider,
    }


def known_regions() -> list[str]:
    """Zones of the fleet (a region is valid when some host's zone equals or starts with it)."""
    return sorted(set(Host.objects.values_list("zone", flat=True)))


def create_cluster(
    *, principal: Principal, name: str, kubernetes_version: str, region: str
) -> Operation:
    """Create a cluster (phase PROVISIONING) and its CREATE_CLUSTER operation.

    Raises InvalidInput (``unsupported_kubernetes_version``: not supported by the catalog, or
    not run by ``NVKE_DEFAULT_PROVIDER``; ``unknown_region``, ``tenant_required``) or Conflict
    (``duplicate_cluster_name``).
    """
    if principal.tenant is None:
        raise InvalidInput(
            "clusters belong to a tenant: use a tenant API key", code="tenant_required"
        )
    # the provider the cluster will have: a version it cannot run is refused here, not left
    # to wait for binaries that never come (issue 33: 1.35 on the hosted provider)
    version = versions.require_supported(kubernetes_version, settings.NVKE_DEFAULT_PROVIDER)
    if not Host.objects.filter(Host.in_region_q(region)).exists():
        raise InvalidInput(
            f"region {region!r} has no GPU hosts",
            code="unknown_region",
            field="region",
            extra={"known_zones": known_regions()},
        )
    with transaction.atomic():
        if (
            Cluster.objects.filter(tenant=principal.tenant, name=name)
            .exclude(phase=Phase.DELETED)
            .exists()
        ):
            raise Conflict(
                f"a cluster named {name!r} already exists",
                code="duplicate_cluster_name",
                field="name",
            )
        quotas.reserve(principal.tenant.pk, clusters=1)
        cluster = Cluster.objects.create(
            tenant=principal.tenant,
            name=name,
            kubernetes_version=kubernetes_version
            if kubernetes_version.count(".") == 2
            else version.version,
            region=region,
            provider=settings.NVKE_DEFAULT_PROVIDER,
        )
        op = _op(
            principal,
            cluster,
            OperationType.CREATE_CLUSTER,
            audit_event=Audit("cluster.create", after=spec_of(cluster)),
        )
    return op


def delete_cluster(*, principal: Principal, cluster: Cluster) -> Operation:
    """Request deletion: phase DELETING, generation+1, a DELETE_CLUSTER operation.

    Idempotent: while a deletion is in progress the same operation is returned. Active
    create/upgrade operations of the cluster are CANCELLED (superseded). Raises Conflict
    ``cluster_deleted`` for a cluster that is already deleted.
    """
    with transaction.atomic():
        # FOR NO KEY UPDATE (as every lock of a cluster row): a cluster row is never deleted
        # nor its key changed, and a plain FOR UPDATE would block the FOR KEY SHARE that
        # inserting a row pointing at the cluster takes — delete_nodepool holding the quota
        # row and inserting its Operation then deadlocked with this function waiting for the
        # quota (tests/tenants/test_quota_leaks.py, seed 50490655)
        cluster = Cluster.objects.select_for_update(no_key=True).get(pk=cluster.pk)
        if cluster.phase == Phase.DELETED:
            raise Conflict("the cluster is already deleted", code="cluster_deleted")
        if cluster.deletion_requested_at is not None and cluster.phase != Phase.DELETE_FAILED:
            existing = active_operation(cluster.id)
            if existing is not None and existing.type == OperationType.DELETE_CLUSTER:
                return existing
        now = timezone.now()
        previous_phase = cluster.phase
        # operation rows before the tenant's quota row (the lock order that avoids a deadlock
        # with a reconciler that holds an operation and waits for the quota)
        cancel_operations(cluster.id, "superseded by the cluster's deletion", now)
        if cluster.deletion_requested_at is None:
            quotas.release(cluster.tenant_id, clusters=1)
        cluster.deletion_requested_at = cluster.deletion_requested_at or now
        cluster.phase = Phase.DELETING
        cluster.generation += 1
        cluster.delete_attempts = 0
        cluster.save(
            update_fields=[
                "deletion_requested_at",
                "phase",
                "generation",
                "delete_attempts",
                "updated_at",
            ]
        )
        op = _op(
            principal,
            cluster,
            OperationType.DELETE_CLUSTER,
            total=2,
            audit_event=Audit(
                "cluster.delete",
                before={"phase": previous_phase},
                after={"phase": Phase.DELETING.value},
            ),
        )
    return op


#: operations the system runs beside the tenant's own: they do not hold the cluster's one
#: mutating operation (an auto-repair waiting hours for capacity locked the cluster, and it
#: cannot be cancelled; found by the hostile trial). The pool-level checks still apply: an
#: isolation change or upgrade needs a RUNNING pool, a deletion supersedes the repair.
BACKGROUND_OPERATION_TYPES = (OperationType.REPAIR_NODES,)


def ensure_no_active_operation(cluster: Cluster) -> None:
    """One mutating operation per cluster at a time (besides
    :data:`BACKGROUND_OPERATION_TYPES`): Conflict ``operation_in_progress`` naming the
    running one. Call with the cluster row locked."""
    running = (
        Operation.objects.filter(cluster=cluster, status__in=ACTIVE_OPERATION_STATUSES)
        .exclude(type__in=BACKGROUND_OPERATION_TYPES)
        .order_by("created_at")
        .first()
    )
    if running is not None:
        raise Conflict(
            f"operation {running.id} ({running.type}) is still {running.status} on this "
            "cluster; wait for it or cancel it",
            code="operation_in_progress",
            retryable=True,
            extra={"operation_id": str(running.id), "operation_type": running.type},
        )


def _op(principal: Principal, cluster: Cluster, type_: str, **fields) -> Operation:
    """:func:`clusters.operations.start_operation` for the cluster itself."""
    return start_operation(
        tenant_id=cluster.tenant_id,
        cluster_id=cluster.id,
        type=type_,
        target_type=TargetType.CLUSTER,
        target_id=cluster.id,
        requested_by=principal.label,
        **fields,
    )


def update_cluster(
    *,
    principal: Principal,
    cluster: Cluster,
    kubernetes_version: str | None = None,
    maintenance_policy: dict | None = None,
) -> Operation:
    """Change a cluster's spec: a control plane upgrade (UPGRADE_CONTROL_PLANE, reconciled) and/or
    its maintenance policy (applied at once: an UPDATE_CLUSTER operation that is DONE).

    Raises InvalidInput (``unsupported_kubernetes_version``, ``invalid_upgrade``,
    ``version_skew``, ``invalid_maintenance_policy``) or Conflict (``cluster_not_active``,
    ``operation_in_progress``).
    """
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update(no_key=True).get(pk=cluster.pk)
        if cluster.phase in GONE_PHASES or cluster.deletion_requested_at is not None:
            raise Conflict(
                f"cluster {cluster.name!r} is {cluster.phase}", code="cluster_not_active"
            )
        ensure_no_active_operation(cluster)
        before = {**spec_of(cluster), "maintenance_policy": cluster.maintenance_policy}
        fields = ["updated_at"]
        if maintenance_policy is not None:
            try:
                cluster.maintenance_policy = maintenance.validate_policy(maintenance_policy)
            except maintenance.InvalidPolicy as exc:
                raise InvalidInput(str(exc), code=exc.code, field=exc.field) from exc
            fields.append("maintenance_policy")
        upgrade = (
            kubernetes_version is not None and kubernetes_version != cluster.kubernetes_version
        )
        if upgrade:
            _check_upgrade(cluster, kubernetes_version)
            cluster.kubernetes_version = kubernetes_version
            cluster.generation += 1
            cluster.phase = Phase.RECONCILING
            fields += ["kubernetes_version", "generation", "phase"]
        cluster.save(update_fields=fields)
        event = Audit(
            "cluster.update",
            before=before,
            after={**spec_of(cluster), "maintenance_policy": cluster.maintenance_policy},
        )
        if upgrade:
            op = _op(principal, cluster, OperationType.UPGRADE_CONTROL_PLANE, audit_event=event)
        else:  # one instant: it started when it was created, not before
            op = _op(
                principal,
                cluster,
                OperationType.UPDATE_CLUSTER,
                audit_event=event,
                done=True,
                now=timezone.now(),
            )
    return op


def _check_upgrade(cluster: Cluster, target: str) -> None:
    versions.require_supported(target, cluster.provider)
    current = cluster.control_plane_version or cluster.kubernetes_version
    problem = versions.control_plane_upgrade_problem(current, target)
    if problem:
        raise InvalidInput(problem, code="invalid_upgrade", field="kubernetes_version")
    for _receiver, pools in collect_node_versions.send(sender=Cluster, cluster=cluster):
        for pool_name, node_version in pools or []:
            skew = versions.node_version_problem(target, node_version)
            if skew:
                raise InvalidInput(
                    f"node pool {pool_name!r} runs {node_version}: upgrade it first ({skew})",
                    code="version_skew",
                    field="kubernetes_version",
                )


def rotate_credentials(*, principal: Principal, cluster: Cluster) -> Operation:
    """Issue a new admin kubeconfig (the old one stops being served). ROTATE_CREDENTIALS."""
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update(no_key=True).get(pk=cluster.pk)
        ensure_no_active_operation(cluster)
        if cluster.phase != Phase.RUNNING:
            raise Conflict(
                f"cluster {cluster.name!r} is {cluster.phase}", code="cluster_not_active"
            )
        cluster.kubeconfig_encrypted = ""
        cluster.generation += 1
        cluster.save(update_fields=["kubeconfig_encrypted", "generation", "updated_at"])
        op = _op(
            principal,
            cluster,
            OperationType.ROTATE_CREDENTIALS,
            audit_event=Audit("cluster.rotate_credentials"),
        )
    return op


def cancel_operation(*, principal: Principal, operation: Operation) -> Operation:
    """Cancel a PENDING/RUNNING operation: it ends CANCELLED and the target's spec is rolled
    back to what is observed (a pool keeps the nodes it has; a control plane stays at the version
    it runs). Creations, deletions and isolation changes cannot be cancelled (409
    ``operation_not_cancellable``); a finished operation is 409 ``operation_finished``."""
    with transaction.atomic():
        op = Operation.objects.select_for_update().get(pk=operation.pk)
        if op.status not in ACTIVE_OPERATION_STATUSES:
            raise Conflict(f"operation is already {op.status}", code="operation_finished")
        if op.type == OperationType.UPGRADE_CONTROL_PLANE:
            cluster = Cluster.objects.select_for_update(no_key=True).get(pk=op.target_id)
            cluster.kubernetes_version = cluster.control_plane_version or cluster.kubernetes_version
            cluster.generation += 1
            cluster.save(update_fields=["kubernetes_version", "generation", "updated_at"])
            _enqueue(cluster.id)
            handled = True
        else:
            handled = any(
                response is True
                for _r, response in operation_cancelled.send(sender=Operation, operation=op)
            )
        if not handled:
            raise Conflict(
                f"{op.type} operations cannot be cancelled", code="operation_not_cancellable"
            )
        now = timezone.now()
        Operation.objects.filter(pk=op.pk).update(
            status="CANCELLED",
            finished_at=now,
            error={
                "code": "cancelled",
                "message": f"cancelled by {principal.label}",
                "retryable": False,
            },
        )
        audit.record(
            actor=principal.label,
            action="operation.cancel",
            target_type="operation",
            target_id=op.id,
            tenant_id=op.tenant_id,
            before={"status": op.status},
            after={"status": "CANCELLED"},
        )
        op.refresh_from_db()
    return op
