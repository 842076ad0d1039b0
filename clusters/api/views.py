"""Cluster and operation endpoints (tenant-scoped)."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from clusters import services
from clusters.api.accepted import accepted
from clusters.choices import GONE_PHASES
from clusters.kubeconfig_names import context_name, rename_kubeconfig
from clusters.models import Cluster, Operation
from nvke import crypto
from nvke.errors import ApiError, Conflict, refuse_unknown_fields
from nvke.lean_lists import value_columns
from nvke.sql_lists import list_response
from nvke.viewsets import SHOW_DELETED, HidesDeletedMixin, TenantScopedMixin
from tenants import audit

from .serializers import (
    ClusterCreateSerializer,
    ClusterSerializer,
    ClusterUpdateSerializer,
    OperationSerializer,
)

UPGRADE_COLUMNS = ClusterSerializer.UPGRADE_COLUMNS


def _values_page(view, serializer_class, method_columns=None) -> Response:
    """The list response of ``view``: rows written by PostgreSQL (nvke/sql_lists.py), or where
    that path cannot serve, the page read as ``.values()`` rows (nvke/lean_lists.py)."""
    columns = tuple(dict.fromkeys(c for cs in (method_columns or {}).values() for c in cs))
    written = list_response(view, serializer_class, method_columns=columns)
    if written is not None:
        return written
    queryset = view.filter_queryset(view.get_queryset())
    rows = queryset.values(*value_columns(serializer_class, method_columns))
    page = view.paginate_queryset(rows)
    if page is None:  # no paginator configured: the whole list
        return Response(view.get_serializer(list(rows), many=True).data)
    return view.get_paginated_response(view.get_serializer(page, many=True).data)


class ClusterViewSet(
    HidesDeletedMixin,
    TenantScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Clusters of the caller's tenant (DELETED ones only with ``?show_deleted=true`` or
    ``?phase=DELETED``). Create and delete answer 202 with an Operation."""

    queryset = Cluster.objects.all()
    serializer_class = ClusterSerializer
    filterset_fields = ["phase", "region"]

    @extend_schema(parameters=[SHOW_DELETED])
    def list(self, request, *args, **kwargs):
        """A page of clusters, written by PostgreSQL but ``available_upgrades`` (computed from
        the catalog once a page)."""
        return _values_page(self, ClusterSerializer, {"available_upgrades": UPGRADE_COLUMNS})

    @extend_schema(request=ClusterCreateSerializer, responses={202: OperationSerializer})
    def create(self, request):
        form = ClusterCreateSerializer(data=request.data)
        refuse_unknown_fields(
            request.data,
            form.fields,
            f"a cluster takes {', '.join(form.fields)}",
            code="unknown_field",
        )
        form.is_valid(raise_exception=True)
        op = services.create_cluster(principal=request.user, **form.validated_data)
        return accepted(request, op)

    @extend_schema(
        responses={
            (200, "application/yaml"): str,
            409: OpenApiResponse(description="No kubeconfig yet, or the cluster is gone."),
        }
    )
    @action(detail=True, methods=["get"])
    def kubeconfig(self, request, pk=None):
        """The cluster's admin kubeconfig (YAML), its cluster, user and context named
        ``nvke_<tenant>_<region>_<cluster>``. Roles that can write only; audited."""
        cluster = self.get_object()
        if not request.user.can_write:
            raise ApiError(
                "viewers cannot download admin credentials",
                code="permission_denied",
                status_code=403,
            )
        if not cluster.kubeconfig_encrypted or cluster.phase in GONE_PHASES:
            raise Conflict(
                f"no kubeconfig: the cluster is {cluster.phase}", code="kubeconfig_unavailable"
            )
        audit.record(
            actor=request.user.label,
            action="cluster.kubeconfig.read",
            target_type="cluster",
            target_id=cluster.id,
            tenant_id=cluster.tenant_id,
        )
        name = context_name(tenant=cluster.tenant.name, region=cluster.region, cluster=cluster.name)
        return HttpResponse(
            rename_kubeconfig(crypto.decrypt(cluster.kubeconfig_encrypted), name),
            content_type="application/yaml",
            headers={"Content-Disposition": f'attachment; filename="{cluster.name}.kubeconfig"'},
        )

    @extend_schema(request=ClusterUpdateSerializer, responses={202: OperationSerializer})
    def partial_update(self, request, pk=None):
        """Upgrade the control plane (``kubernetes_version``) and/or set the maintenance policy."""
        cluster = self.get_object()
        refuse_unknown_fields(
            request.data,
            {"kubernetes_version", "maintenance_policy"},
            "only kubernetes_version and maintenance_policy can be changed here (a cluster's "
            "name and region are fixed; node pools change through their own routes)",
        )
        form = ClusterUpdateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        op = services.update_cluster(principal=request.user, cluster=cluster, **form.validated_data)
        return accepted(request, op)

    @extend_schema(request=None, responses={202: OperationSerializer})
    @action(detail=True, methods=["post"], url_path="rotate-credentials")
    def rotate_credentials(self, request, pk=None):
        """Issue a new admin kubeconfig (ROTATE_CREDENTIALS)."""
        cluster = self.get_object()
        op = services.rotate_credentials(principal=request.user, cluster=cluster)
        return accepted(request, op)

    @extend_schema(request=None, responses={202: OperationSerializer})
    def destroy(self, request, pk=None):
        cluster = self.get_object()
        op = services.delete_cluster(principal=request.user, cluster=cluster)
        return accepted(request, op)


class OperationViewSet(TenantScopedMixin, viewsets.ReadOnlyModelViewSet):
    """Operations of the caller's tenant (filter by ``target_id``, ``cluster``, ``status``)."""

    queryset = Operation.objects.all()
    serializer_class = OperationSerializer
    filterset_fields = ["target_id", "target_type", "cluster", "status", "type"]

    def list(self, request, *args, **kwargs):
        """A page of operations, written by PostgreSQL (nvke/sql_lists.py)."""
        return _values_page(self, OperationSerializer)

    @extend_schema(request=None, responses={200: OperationSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel a PENDING/RUNNING operation (roles that can write)."""
        if not request.user.can_write:
            raise ApiError(
                "your role cannot cancel operations", code="permission_denied", status_code=403
            )
        op = services.cancel_operation(principal=request.user, operation=self.get_object())
        return Response(OperationSerializer(op).data)
