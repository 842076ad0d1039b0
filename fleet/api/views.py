"""Fleet API: operator host inventory and actions, fragmentation, agent registration and
report ingestion. Thin: each view validates, calls one service, serializes."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Prefetch
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet import conf, fragmentation, health, ingest, rollups, services, shared_hosts
from fleet.authentication import HostCredentialAuthentication, IsAgent
from fleet.models import Gpu, GpuHealthInterval, GpuScrub, Host, HostCheck, HostEvent
from nvke.errors import ApiError, InvalidInput
from nvke.parsers import SafeJSONParser
from tenants.permissions import IsOperator

from .parsers import OrjsonParser
from .serializers import (
    AgentRegisterSerializer,
    CordonSerializer,
    DrainSerializer,
    FragmentationQuerySerializer,
    GpuHealthIntervalSerializer,
    GpuScrubSerializer,
    HostCheckSerializer,
    HostCreatedSerializer,
    HostEventSerializer,
    HostImportSerializer,
    HostSerializer,
    MarkHealthyResultSerializer,
    MarkHealthySerializer,
    SliceMapGpuSerializer,
    TelemetryPointSerializer,
    TelemetryQuerySerializer,
    TenancySerializer,
)

IMPORT_FIELDS = (
    "hostname",
    "zone",
    "region",
    "rack",
    "nvidia_smi_xml",
    "nvidia_smi_topo",
    "nvlink_cluster_uuid",
    "nvlink_clique_id",
)


def _actor(request) -> str:
    return getattr(request.user, "label", "") or "operator"


class HostViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Physical GPU hosts (operators only). POST imports a host from ``nvidia-smi -q -x``."""

    permission_classes = [IsOperator]
    serializer_class = HostSerializer
    queryset = Host.objects.prefetch_related(
        Prefetch("gpus", queryset=Gpu.objects.order_by("index"))
    ).order_by("hostname")
    filterset_fields = ["hostname", "state", "zone", "region", "gpu_model", "tenancy"]
    # JSON per the contract; multipart/form also accepted so that
    # `curl -F nvidia_smi_xml=<report.xml` works without escaping XML into JSON.
    parser_classes = [SafeJSONParser, MultiPartParser, FormParser]

    def _host_response(self, host: Host, code: int = status.HTTP_200_OK) -> Response:
        return Response(HostSerializer(self.get_queryset().get(pk=host.pk)).data, status=code)

    @extend_schema(request=HostImportSerializer, responses={201: HostCreatedSerializer})
    def create(self, request, *args, **kwargs):
        data = request.data
        if hasattr(data, "getlist"):  # multipart/form: plain values, uploaded files read as text
            data = {k: data.get(k) for k in IMPORT_FIELDS if k in data}
            for name in ("nvidia_smi_xml", "nvidia_smi_topo"):
                upload = request.FILES.get(name)
                if upload is not None:
                    data[name] = upload.read().decode("utf-8", errors="replace")
        form = HostImportSerializer(data=data)
        form.is_valid(raise_exception=True)
        imported = services.import_host(**form.validated_data, actor=_actor(request))
        body = HostSerializer(self.get_queryset().get(pk=imported.host.pk)).data
        body["bootstrap_token"] = imported.bootstrap_token
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: HostCreatedSerializer})
    @action(detail=True, methods=["post"], url_path="bootstrap-token")
    def bootstrap_token(self, request, pk=None):
        """Re-issue the agent's one-time bootstrap token (revokes the current credential)."""
        host = self.get_object()
        token = services.reissue_bootstrap_token(host, actor=_actor(request))
        body = HostSerializer(self.get_queryset().get(pk=host.pk)).data
        body["bootstrap_token"] = token
        return Response(body)

    @extend_schema(request=CordonSerializer, responses={200: HostSerializer})
    @action(detail=True, methods=["post"])
    def cordon(self, request, pk=None):
        """No new nodes on this host (nodes on it keep running)."""
        form = CordonSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        host = services.cordon_host(
            self.get_object(), actor=_actor(request), reason=form.validated_data["reason"]
        )
        return self._host_response(host)

    @extend_schema(request=None, responses={200: HostSerializer})
    @action(detail=True, methods=["post"])
    def uncordon(self, request, pk=None):
        """Schedulable again (from CORDONED, MAINTENANCE or FAILED; cancels a drain)."""
        return self._host_response(services.uncordon_host(self.get_object(), actor=_actor(request)))

    @extend_schema(request=DrainSerializer, responses={200: HostSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        """Cordon, move the nodes off, then enter ``target`` (CORDONED by default)."""
        form = DrainSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        host = services.drain_host(
            self.get_object(),
            actor=_actor(request),
            target=form.validated_data["target"],
            force=form.validated_data["force"],
        )
        return self._host_response(host)

    @extend_schema(request=None, responses={200: HostSerializer})
    @action(detail=True, methods=["post"])
    def maintenance(self, request, pk=None):
        """Drain into MAINTENANCE (at once when no GPU is held)."""
        return self._host_response(
            services.set_maintenance(self.get_object(), actor=_actor(request))
        )

    @extend_schema(request=None, responses={200: HostSerializer})
    @action(detail=True, methods=["post"])
    def retire(self, request, pk=None):
        """Drain into RETIRED (final; the agent's credential stops working)."""
        return self._host_response(services.retire_host(self.get_object(), actor=_actor(request)))

    @extend_schema(request=TenancySerializer, responses={200: HostSerializer})
    @action(detail=True, methods=["post"])
    def tenancy(self, request, pk=None):
        """Mark the host dedicated or shared (409 while nodes of the other kind hold GPUs)."""
        form = TenancySerializer(data=request.data)
        form.is_valid(raise_exception=True)
        host = shared_hosts.set_host_tenancy(
            self.get_object(), tenancy=form.validated_data["tenancy"], actor=_actor(request)
        )
        return self._host_response(host)

    @extend_schema(request=None, responses={200: SliceMapGpuSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def slices(self, request, pk=None):
        """A shared host's slice map: per GPU, who holds which GPU instance where."""
        host = self.get_object()
        return Response(SliceMapGpuSerializer(shared_hosts.slice_map(host), many=True).data)

    @extend_schema(request=MarkHealthySerializer, responses={200: MarkHealthyResultSerializer})
    @action(detail=True, methods=["post"], url_path="mark-healthy")
    def mark_healthy(self, request, pk=None):
        """The GPUs (all unhealthy ones of the host when none are named) are repaired."""
        form = MarkHealthySerializer(data=request.data)
        form.is_valid(raise_exception=True)
        host = self.get_object()
        uuids = form.validated_data["gpu_uuids"]
        if uuids is not None:
            unknown = sorted(set(uuids) - set(host.gpus.values_list("uuid", flat=True)))
            if unknown:
                raise InvalidInput(
                    f"not GPUs of {host.hostname}: {', '.join(unknown)}",
                    code="unknown_gpu_uuid",
                    field="gpu_uuids",
                )
        closed = health.mark_healthy(host, uuids, actor=_actor(request))
        return Response({"marked_healthy": closed})

    def _page(self, queryset, serializer_class):
        page = self.paginate_queryset(queryset)
        return self.get_paginated_response(serializer_class(page, many=True).data)

    @extend_schema(request=None, responses={200: HostEventSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        """The host's history, newest first: imports, states, actions, checks, scrubs, Xids."""
        return self._page(HostEvent.objects.filter(host=self.get_object()), HostEventSerializer)

    @extend_schema(request=None, responses={200: HostCheckSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def checks(self, request, pk=None):
        """Health checks (onboarding report, agent NVML, DCGM), newest first."""
        return self._page(HostCheck.objects.filter(host=self.get_object()), HostCheckSerializer)

    @extend_schema(request=None, responses={200: GpuScrubSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def scrubs(self, request, pk=None):
        """Scrubs of the host's GPUs after tenants released them, newest first."""
        scrubs = GpuScrub.objects.filter(host=self.get_object()).select_related("gpu")
        return self._page(scrubs, GpuScrubSerializer)

    @extend_schema(request=None, responses={200: GpuHealthIntervalSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def health(self, request, pk=None):
        """Unhealthy intervals of the host's GPUs (by GPU, oldest first)."""
        intervals = GpuHealthInterval.objects.filter(host=self.get_object())
        return self._page(intervals, GpuHealthIntervalSerializer)

    @extend_schema(
        parameters=[
            OpenApiParameter("resolution", str, enum=["1m", "1h"]),
            OpenApiParameter(
                "start", str, description="RFC 3339; default: an hour (1m) or a day (1h) before end"
            ),
            OpenApiParameter("end", str, description="RFC 3339; default: now"),
        ],
        responses={200: TelemetryPointSerializer(many=True)},
    )
    @action(detail=True, methods=["get"])
    def telemetry(self, request, pk=None):
        """Rolled-up telemetry of the host's GPUs (one row per GPU or MIG device per bucket)."""
        form = TelemetryQuerySerializer(data=request.query_params)
        form.is_valid(raise_exception=True)
        resolution = form.validated_data["resolution"]
        end = form.validated_data.get("end") or timezone.now()
        default_span = timedelta(hours=1) if resolution == "1m" else timedelta(days=1)
        start = form.validated_data.get("start") or end - default_span
        if start >= end or end - start > timedelta(days=conf.rollup_1h_retention_days()):
            raise InvalidInput(
                "start must be before end, within the rollup retention",
                code="invalid_time_range",
                field="start",
            )
        host = self.get_object()
        uuids = list(host.gpus.values_list("uuid", flat=True))
        points = rollups.series(uuids, start, end, resolution)
        return Response(TelemetryPointSerializer(points, many=True).data)


class FragmentationView(APIView):
    """GET: free GPUs that cannot serve the common shapes, and moves that free whole hosts.
    The fleet as it physically is: capacity reservations are not deducted (what unreserved
    pools may take is the reservations calendar's ``free``, and a dry run's)."""

    permission_classes = [IsOperator]

    @extend_schema(
        parameters=[FragmentationQuerySerializer],
        responses={200: dict},
    )
    def get(self, request):
        form = FragmentationQuerySerializer(data=request.query_params)
        form.is_valid(raise_exception=True)
        return Response(fragmentation.fragmentation_report(**form.validated_data))


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
                "report_interval_s": conf.report_interval_s(),
                # the highest seq accepted from this host: a re-registered agent (state lost)
                # numbers its reports above it, so they are not taken for duplicates
                "seq_baseline": host.last_report_seq,
            },
            status=status.HTTP_201_CREATED,
        )


class AgentReportView(APIView):
    """Receive an agent report; idempotent on ``(host, seq)``."""

    authentication_classes = [HostCredentialAuthentication]
    permission_classes = [IsAgent]
    parser_classes = [OrjsonParser]

    @extend_schema(request=dict, responses={200: dict})
    def post(self, request):
        if not isinstance(request.data, dict):
            raise InvalidInput("the report must be a JSON object", code="invalid_report")
        try:
            ack = ingest.ingest_report(request.user.host, request.data)
        except ingest.InvalidReport as exc:
            raise InvalidInput(str(exc), code=exc.code, field=exc.field) from exc
        return Response(ack.as_dict())
