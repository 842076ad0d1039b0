"""Tenancy endpoints: tenants, members, API keys, operator keys, quotas, audit events.

Who may do what (DESIGN §7): operators everything; in a tenant, owners manage members;
owners and admins manage API keys; every role reads; viewers never write.
"""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import generics, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from catalog.models import GpuModel
from nvke.errors import ApiError, InvalidInput, NotFound
from nvke.filters import BoundedIsoDateTimeFilter
from nvke.pagination import SafeCursorPagination
from nvke.scoping import scope_queryset
from tenants import audit, members, quotas, services
from tenants.choices import Role
from tenants.models import ApiKey, AuditEvent, Membership, Quota, Tenant
from tenants.permissions import IsOperator, IsTenantAdminOrOperator
from tenants.signals import collect_usage

from .serializers import (
    ApiKeyCreateSerializer,
    ApiKeySerializer,
    AuditEventSerializer,
    MemberCreateSerializer,
    MemberRoleSerializer,
    MemberSerializer,
    QuotaLimitsSerializer,
    QuotaSerializer,
    TenantSerializer,
)


def _tenant_or_404(request, tenant_pk) -> Tenant:
    principal = request.user
    if principal.is_operator:
        qs = Tenant.objects.all()
    elif principal.tenant is not None:
        qs = Tenant.objects.filter(pk=principal.tenant.pk)
    else:
        qs = Tenant.objects.none()
    try:
        return qs.get(pk=tenant_pk)
    except (Tenant.DoesNotExist, ValueError) as exc:
        raise NotFound() from exc


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ApiError(message, code="permission_denied", status_code=403)


class TenantViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Tenants. Operators create and list all; a tenant principal sees its own tenant only."""

    serializer_class = TenantSerializer

    def get_permissions(self):
        if self.action == "create":
            return [IsOperator()]
        return super().get_permissions()

    def get_queryset(self):
        principal = self.request.user
        if getattr(self, "swagger_fake_view", False):
            return Tenant.objects.none()
        if principal.is_operator:
            return Tenant.objects.all()
        if principal.tenant is None:
            return Tenant.objects.none()
        return Tenant.objects.filter(pk=principal.tenant.pk)

    def create(self, request):
        form = TenantSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        tenant = services.create_tenant(name=form.validated_data["name"], principal=request.user)
        return Response(TenantSerializer(tenant).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ApiKeyCreateSerializer, responses={201: ApiKeySerializer})
    @action(detail=True, methods=["get", "post"], url_path="api-keys")
    def api_keys(self, request, pk=None):
        """List the tenant's API keys (owners/admins), or create one (shown once)."""
        tenant = self.get_object()
        _require(request.user.can_admin, "only owners and admins manage API keys")
        if request.method == "GET":
            keys = ApiKey.objects.filter(tenant=tenant).order_by("-created")
            return Response(ApiKeySerializer(keys, many=True).data)
        form = ApiKeyCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        row, key = services.issue_api_key(
            principal=request.user, tenant=tenant, **form.validated_data
        )
        data = ApiKeySerializer(row).data
        data["key"] = key
        return Response(data, status=status.HTTP_201_CREATED)


class ApiKeyRevokeView(APIView):
    """``DELETE /tenants/{id}/api-keys/{prefix}``: revoke (owners/admins, operators)."""

    permission_classes = [IsTenantAdminOrOperator]

    @extend_schema(request=None, responses={200: ApiKeySerializer})
    def delete(self, request, tenant_pk, prefix):
        tenant = _tenant_or_404(request, tenant_pk)
        row = services.revoke_api_key(principal=request.user, tenant=tenant, prefix=prefix)
        return Response(ApiKeySerializer(row).data)


class OperatorKeyViewSet(viewsets.ViewSet):
    """Operator API keys (separate from tenant keys): list, create, revoke."""

    permission_classes = [IsOperator]
    lookup_field = "prefix"
    lookup_value_regex = "[A-Za-z0-9]+"

    @extend_schema(responses={200: ApiKeySerializer(many=True)})
    def list(self, request):
        keys = ApiKey.objects.filter(is_operator=True).order_by("-created")
        return Response(ApiKeySerializer(keys, many=True).data)

    @extend_schema(request=ApiKeyCreateSerializer, responses={201: ApiKeySerializer})
    def create(self, request):
        form = ApiKeyCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        row, key = services.issue_api_key(
            principal=request.user,
            tenant=None,
            name=form.validated_data["name"],
            expiry_date=form.validated_data.get("expiry_date"),
        )
        data = ApiKeySerializer(row).data
        data["key"] = key
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: ApiKeySerializer})
    def destroy(self, request, prefix=None):
        row = services.revoke_api_key(principal=request.user, tenant=None, prefix=prefix)
        return Response(ApiKeySerializer(row).data)


class MemberListView(APIView):
    """``/tenants/{id}/members``: every role lists; owners add (operators too)."""

    @extend_schema(responses={200: MemberSerializer(many=True)})
    def get(self, request, tenant_pk):
        tenant = _tenant_or_404(request, tenant_pk)
        rows = (
            Membership.objects.filter(tenant=tenant)
            .select_related("user")
            .order_by("user__username")
        )
        return Response(MemberSerializer(rows, many=True).data)

    @extend_schema(request=MemberCreateSerializer, responses={201: MemberSerializer})
    def post(self, request, tenant_pk):
        tenant = _tenant_or_404(request, tenant_pk)
        _require(
            request.user.is_operator or request.user.role == Role.OWNER,
            "only owners manage members",
        )
        form = MemberCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        row = members.add_member(principal=request.user, tenant=tenant, **form.validated_data)
        return Response(MemberSerializer(row).data, status=status.HTTP_201_CREATED)


class MemberDetailView(APIView):
    """``/tenants/{id}/members/{username}``: owners change the role or remove."""

    def _guard(self, request, tenant_pk) -> Tenant:
        tenant = _tenant_or_404(request, tenant_pk)
        _require(
            request.user.is_operator or request.user.role == Role.OWNER,
            "only owners manage members",
        )
        return tenant

    @extend_schema(request=MemberRoleSerializer, responses={200: MemberSerializer})
    def patch(self, request, tenant_pk, username):
        tenant = self._guard(request, tenant_pk)
        form = MemberRoleSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        row = members.change_role(
            principal=request.user,
            tenant=tenant,
            username=username,
            role=form.validated_data["role"],
        )
        return Response(MemberSerializer(row).data)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, tenant_pk, username):
        tenant = self._guard(request, tenant_pk)
        members.remove_member(principal=request.user, tenant=tenant, username=username)
        return Response(status=status.HTTP_204_NO_CONTENT)


def quota_body(quota: Quota) -> dict:
    """Limits, reservations and what is actually held now, per resource."""
    usage: dict = {"clusters": 0, "nodes": 0, "gpus": {}}
    for _receiver, response in collect_usage.send(sender=Quota, tenant_id=quota.tenant_id):
        if isinstance(response, dict):
            usage["clusters"] += response.get("clusters", 0)
            usage["nodes"] += response.get("nodes", 0)
            for model, count in response.get("gpus", {}).items():
                usage["gpus"][model] = usage["gpus"].get(model, 0) + count
    models = sorted(set(quota.max_gpus) | set(quota.reserved_gpus) | set(usage["gpus"]))
    return {
        "tenant": str(quota.tenant_id),
        "clusters": {
            "limit": quota.max_clusters,
            "reserved": quota.reserved_clusters,
            "in_use": usage["clusters"],
        },
        "nodes": {
            "limit": quota.max_nodes,
            "reserved": quota.reserved_nodes,
            "in_use": usage["nodes"],
        },
        "gpus": {
            model: {
                "limit": quotas.gpu_limit(quota, model),
                "reserved": quota.reserved_gpus.get(model, 0),
                "in_use": usage["gpus"].get(model, 0),
            }
            for model in models
        },
        "default_gpu_limit_per_model": quotas.gpu_limit(quota, "\0"),
    }


class QuotaListView(APIView):
    """``GET /quotas``: the caller's tenant quota (operators: every tenant's)."""

    @extend_schema(responses={200: QuotaSerializer(many=True)})
    def get(self, request):
        if request.user.is_operator:
            tenants = Tenant.objects.order_by("name")
        elif request.user.tenant is not None:
            tenants = [request.user.tenant]
        else:
            tenants = []
        return Response([quota_body(quotas.quota_for(t.pk, lock=False)) for t in tenants])


class QuotaDetailView(APIView):
    """``GET /quotas/{tenant}``; ``PUT`` sets limits (operators only)."""

    @extend_schema(responses={200: QuotaSerializer})
    def get(self, request, tenant_pk):
        tenant = _tenant_or_404(request, tenant_pk)
        return Response(quota_body(quotas.quota_for(tenant.pk, lock=False)))

    @extend_schema(request=QuotaLimitsSerializer, responses={200: QuotaSerializer})
    def put(self, request, tenant_pk):
        tenant = _tenant_or_404(request, tenant_pk)
        _require(request.user.is_operator, "only operators set quotas")
        form = QuotaLimitsSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        unknown = sorted(
            set(form.validated_data.get("max_gpus", {}))
            - set(GpuModel.objects.values_list("slug", flat=True))
        )
        if unknown:
            raise InvalidInput(
                f"unknown GPU model(s): {', '.join(unknown)}",
                code="unknown_gpu_model",
                field="max_gpus",
            )
        before = quota_body(quotas.quota_for(tenant.pk, lock=False))
        quota = quotas.set_limits(tenant, **form.validated_data)
        audit.record(
            actor=request.user.label,
            action="quota.set",
            target_type="quota",
            target_id=tenant.pk,
            tenant=tenant,
            before={k: before[k]["limit"] for k in ("clusters", "nodes")}
            | {"max_gpus": quota.max_gpus},
            after={
                "clusters": quota.max_clusters,
                "nodes": quota.max_nodes,
                "max_gpus": form.validated_data.get("max_gpus", quota.max_gpus),
            },
        )
        return Response(quota_body(quota))


class AuditFilter(django_filters.FilterSet):
    since = BoundedIsoDateTimeFilter(field_name="ts", lookup_expr="gte")
    until = BoundedIsoDateTimeFilter(field_name="ts", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["actor", "action", "target_type", "target_id", "tenant"]


class AuditCursorPagination(SafeCursorPagination):
    ordering = ("-ts", "-id")
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500


class AuditEventListView(generics.ListAPIView):
    """Audit events: tenant owners/admins see their tenant's, operators everything.
    Filters: ``since``, ``until`` (RFC 3339), ``actor``, ``action``, ``target_type``,
    ``target_id``; cursor-paginated."""

    serializer_class = AuditEventSerializer
    permission_classes = [IsTenantAdminOrOperator]
    pagination_class = AuditCursorPagination
    filterset_class = AuditFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # drf-spectacular reading the schema
            return AuditEvent.objects.none()
        return scope_queryset(AuditEvent.objects.all(), self.request.user)
