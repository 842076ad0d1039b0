"""Webhook endpoints of the caller's tenant (admins and owners write) and their deliveries."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from nvke.errors import ApiError
from nvke.scoping import get_scoped_or_404
from nvke.viewsets import TenantScopedMixin
from webhooks import services
from webhooks.models import WebhookDelivery, WebhookEndpoint

from .serializers import (
    SecretSerializer,
    WebhookDeliverySerializer,
    WebhookEndpointCreatedSerializer,
    WebhookEndpointCreateSerializer,
    WebhookEndpointSerializer,
)


def _require_admin(request) -> None:
    if not request.user.can_admin or request.user.tenant is None:
        raise ApiError(
            "only a tenant's owners and admins manage webhooks",
            code="permission_denied",
            status_code=403,
        )


class WebhookEndpointViewSet(
    TenantScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    queryset = WebhookEndpoint.objects.all()
    serializer_class = WebhookEndpointSerializer

    @extend_schema(
        request=WebhookEndpointCreateSerializer, responses={201: WebhookEndpointCreatedSerializer}
    )
    def create(self, request):
        _require_admin(request)
        form = WebhookEndpointCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        endpoint, secret = services.register_endpoint(
            tenant=request.user.tenant, **form.validated_data
        )
        body = {**WebhookEndpointSerializer(endpoint).data, "secret": secret}
        return Response(body, status=status.HTTP_201_CREATED)

    def destroy(self, request, *args, **kwargs):
        _require_admin(request)
        return super().destroy(request, *args, **kwargs)

    @extend_schema(request=None, responses={200: SecretSerializer})
    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request, pk=None):
        _require_admin(request)
        return Response({"secret": services.rotate_secret(self.get_object())})


class WebhookDeliveryViewSet(TenantScopedMixin, viewsets.ReadOnlyModelViewSet):
    """Deliveries of one endpoint, newest first, with every attempt's status code."""

    queryset = WebhookDelivery.objects.all()
    serializer_class = WebhookDeliverySerializer
    filterset_fields = ["status", "event_type"]

    def _endpoint(self) -> WebhookEndpoint:
        return get_scoped_or_404(
            WebhookEndpoint.objects.all(), self.request.user, pk=self.kwargs["endpoint_pk"]
        )

    def get_queryset(self):
        return super().get_queryset().filter(endpoint_id=self.kwargs["endpoint_pk"])

    def list(self, request, *args, **kwargs):
        self._endpoint()
        return super().list(request, *args, **kwargs)

    @extend_schema(request=None, responses={202: WebhookDeliverySerializer})
    @action(detail=True, methods=["post"])
    def redeliver(self, request, endpoint_pk=None, pk=None):
        _require_admin(request)
        again = services.redeliver(self.get_object())
        return Response(WebhookDeliverySerializer(again).data, status=status.HTTP_202_ACCEPTED)
