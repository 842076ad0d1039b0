"""Fleet API: operator host inventory, agent registration and report ingestion."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet import ingest, services
from fleet.authentication import HostCredentialAuthentication, IsAgent
from fleet.models import Host
from nvke.errors import ApiError, InvalidInput
from tenants.permissions import IsOperator

from .serializers import (
    AgentRegisterSerializer,
    HostCreatedSerializer,
    HostImportSerializer,
    HostSerializer,
)


class HostViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Physical GPU hosts (operators only). POST imports a host from ``nvidia-smi -q -x``."""

    permission_classes = [IsOperator]
    serializer_class = HostSerializer
    queryset = Host.objects.prefetch_related("gpus").order_by("hostname")
    filterset_fields = ["state", "zone", "gpu_model"]
    # JSON per the contract; multipart/form also accepted so that
    # `curl -F nvidia_smi_xml=<report.xml` works without escaping XML into JSON.
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    @extend_schema(request=HostImportSerializer, responses={201: HostCreatedSerializer})
    def create(self, request, *args, **kwargs):
        data = request.data
        if hasattr(data, "getlist"):  # multipart/form: plain values, an uploaded file read as text
            data = {
                k: data.get(k) for k in ("hostname", "zone", "rack", "nvidia_smi_xml") if k in data
            }
            upload = request.FILES.get("nvidia_smi_xml")
            if upload is not None:
                data["nvidia_smi_xml"] = upload.read().decode("utf-8", errors="replace")
        form = HostImportSerializer(data=data)
        form.is_valid(raise_exception=True)
        imported = services.import_host(**form.validated_data)
        host = Host.objects.prefetch_related("gpus").get(pk=imported.host.pk)
        data = HostSerializer(host).data
        data["bootstrap_token"] = imported.bootstrap_token
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: HostCreatedSerializer})
    @action(detail=True, methods=["post"], url_path="bootstrap-token")
    def bootstrap_token(self, request, pk=None):
        """Re-issue the agent's one-time bootstrap token (revokes the current credential)."""
        host = self.get_object()
        token = services.reissue_bootstrap_token(host)
        data = HostSerializer(Host.objects.prefetch_related("gpus").get(pk=host.pk)).data
        data["bootstrap_token"] = token
        return Response(data)


class AgentRegisterView(APIView):
    """Exchange a one-time bootstrap token for a host credential (no API key needed)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(request=AgentRegisterSerializer, responses={201: dict})
    def post(self, request):
        form = AgentRegisterSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            host, credential = services.register_agent(
                bootstrap_token=form.validated_data["bootstrap_token"],
                agent_version=form.validated_data.get("agent_version", ""),
            )
        except services.InvalidBootstrapToken as exc:
            raise ApiError(
                str(exc), code="invalid_bootstrap_token", status_code=401, field="bootstrap_token"
            ) from exc
        return Response(
            {
                "host_id": str(host.id),
                "credential": credential,
                "report_interval_s": settings.NVKE_AGENT_REPORT_INTERVAL_S,
            },
            status=status.HTTP_201_CREATED,
        )


class AgentReportView(APIView):
    """Receive an agent report; idempotent on ``(host, seq)``."""

    authentication_classes = [HostCredentialAuthentication]
    permission_classes = [IsAgent]

    @extend_schema(request=dict, responses={200: dict})
    def post(self, request):
        if not isinstance(request.data, dict):
            raise InvalidInput("the report must be a JSON object", code="invalid_report")
        try:
            ack = ingest.ingest_report(request.user.host, request.data)
        except ingest.InvalidReport as exc:
            raise InvalidInput(str(exc), code="invalid_report", field=exc.field) from exc
        return Response(ack.as_dict())
