"""Tenant administration: tenants (operators) and their API keys."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from nvke.errors import ApiError
from tenants import services
from tenants.models import ApiKey, Tenant
from tenants.permissions import IsOperator, IsTenantAdminOrOperator

from .serializers import ApiKeyCreateSerializer, ApiKeySerializer, TenantSerializer


class TenantViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Tenants. Operators create and list all; a tenant principal sees its own tenant only."""

    serializer_class = TenantSerializer

    def get_permissions(self):
        if self.action in ("create",):
            return [IsOperator()]
        if self.action == "api_keys":
            return [IsTenantAdminOrOperator()]
        return super().get_permissions()

    def get_queryset(self):
        principal = self.request.user
        if principal.is_operator:
            return Tenant.objects.all()
        return (
            Tenant.objects.filter(pk=principal.tenant.pk)
            if principal.tenant
            else Tenant.objects.none()
        )

    def create(self, request):
        form = TenantSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        tenant = services.create_tenant(name=form.validated_data["name"])
        return Response(TenantSerializer(tenant).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ApiKeyCreateSerializer, responses={201: ApiKeySerializer})
    @action(detail=True, methods=["get", "post"], url_path="api-keys")
    def api_keys(self, request, pk=None):
        """List the tenant's API keys, or create one (the key is in the response, once)."""
        tenant = self.get_object()
        if request.method == "GET":
            keys = ApiKey.objects.filter(tenant=tenant).order_by("-created")
            return Response(ApiKeySerializer(keys, many=True).data)
        form = ApiKeyCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        role = form.validated_data["role"]
        if not request.user.is_operator and role == "owner" and request.user.role != "owner":
            raise ApiError(
                "only an owner may create an owner key",
                code="role_too_high",
                field="role",
                status_code=403,
            )
        row, key = services.create_api_key(tenant=tenant, **form.validated_data)
        data = ApiKeySerializer(row).data
        data["key"] = key
        return Response(data, status=status.HTTP_201_CREATED)
