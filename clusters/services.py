"""Cluster use-cases: write the spec, create the Operation, enqueue the reconciler on commit."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from catalog.services import UnsupportedKubernetesVersion, check_kubernetes_version
from fleet.models import Host
from nvke.errors import Conflict, InvalidInput
from tenants import audit, quotas
from tenants.principal import Principal

from .choices import OperationType, Phase, TargetType
from .models import Cluster, Operation, active_operation, cancel_operations


def _enqueue(cluster_id) -> None:
    from .tasks import reconcile_cluster

    transaction.on_commit(lambda: reconcile_cluster.delay(str(cluster_id)))


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

    Raises InvalidInput (``unsupported_kubernetes_version``, ``unknown_region``,
    ``tenant_required``) or Conflict (``duplicate_cluster_name``).
    """
    if principal.tenant is None:
        raise InvalidInput(
            "clusters belong to a tenant: use a tenant API key", code="tenant_required"
        )
    try:
        version = check_kubernetes_version(kubernetes_version)
    except UnsupportedKubernetesVersion as exc:
        raise InvalidInput(
            str(exc),
            code="unsupported_kubernetes_version",
            field="kubernetes_version",
            extra={"supported_versions": exc.supported},
        ) from exc
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
        op = Operation.objects.create(
            tenant=principal.tenant,
            cluster=cluster,
            type=OperationType.CREATE_CLUSTER,
            target_type=TargetType.CLUSTER,
            target_id=cluster.id,
            requested_by=principal.label,
            progress={"done": 0, "total": 1, "stage": "pending"},
        )
        audit.record(
            actor=principal.label,
            action="cluster.create",
            target_type="cluster",
            target_id=cluster.id,
            tenant=principal.tenant,
            after=spec_of(cluster),
        )
        _enqueue(cluster.id)
    return op


def delete_cluster(*, principal: Principal, cluster: Cluster) -> Operation:
    """Request deletion: phase DELETING, generation+1, a DELETE_CLUSTER operation.

    Idempotent: while a deletion is in progress the same operation is returned. Active
    create/upgrade operations of the cluster are CANCELLED (superseded). Raises Conflict
    ``cluster_deleted`` for a cluster that is already deleted.
    """
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
        if cluster.phase == Phase.DELETED:
            raise Conflict("the cluster is already deleted", code="cluster_deleted")
        if cluster.deletion_requested_at is not None and cluster.phase != Phase.DELETE_FAILED:
            existing = active_operation(cluster.id)
            if existing is not None and existing.type == OperationType.DELETE_CLUSTER:
                return existing
        now = timezone.now()
        previous_phase = cluster.phase
        if cluster.deletion_requested_at is None:
            quotas.release(cluster.tenant_id, clusters=1)
        cancel_operations(cluster.id, "superseded by the cluster's deletion", now)
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
        op = Operation.objects.create(
            tenant=cluster.tenant,
            cluster=cluster,
            type=OperationType.DELETE_CLUSTER,
            target_type=TargetType.CLUSTER,
            target_id=cluster.id,
            requested_by=principal.label,
            progress={"done": 0, "total": 2, "stage": "pending"},
        )
        audit.record(
            actor=principal.label,
            action="cluster.delete",
            target_type="cluster",
            target_id=cluster.id,
            tenant_id=cluster.tenant_id,
            before={"phase": previous_phase},
            after={"phase": Phase.DELETING.value},
        )
        _enqueue(cluster.id)
    return op
