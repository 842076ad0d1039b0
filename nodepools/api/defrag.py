"""Defragmentation API (operators only): the dry run of a plan and runs that execute one.

``GET /api/v1/fleet/defrag/plan`` — the dry run (:func:`nodepools.defrag.make_plan`): what the
plan frees, the nodes and tenants it disrupts, GPU-hours, the moves in order. Nothing changes.
``POST /api/v1/fleet/defrag/runs`` — plan now and execute it: 202 with the run (operation
shaped: status, progress, error), ``Location`` the run's URL and ``Retry-After``.
``GET /api/v1/fleet/defrag/runs[/{id}]`` — runs, newest first.
"""

from __future__ import annotations

from django.conf import settings
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants.permissions import IsOperator

from .. import defrag
from ..defrag_models import DefragRun


class DefragQuerySerializer(serializers.Serializer):
    """The plan's filter and bounds (every size bounded)."""

    gpu_model = serializers.CharField(required=False, default="", allow_blank=True, max_length=64)
    zone = serializers.CharField(required=False, default="", allow_blank=True, max_length=64)
    max_steps = serializers.IntegerField(
        required=False, default=100, min_value=1, max_value=defrag.MAX_STEPS
    )
    move_minutes = serializers.FloatField(
        required=False, default=None, min_value=0, max_value=defrag.MAX_MOVE_MINUTES
    )

    def validate_gpu_model(self, value: str) -> str:
        """A catalog slug (or blank: every model), as reservations and quotas take it."""
        from catalog.models import GpuModel

        if value and not GpuModel.objects.filter(slug=value).exists():
            raise serializers.ValidationError(
                f"unknown GPU model {value!r} (a catalog slug, e.g. h100-sxm5-80gb)",
                code="unknown_gpu_model",
            )
        return value


class DefragRunSerializer(serializers.ModelSerializer):
    class Meta:
        model = DefragRun
        fields = [
            "id",
            "status",
            "requested_by",
            "gpu_model",
            "zone",
            "progress",
            "error",
            "step",
            "step_state",
            "freed",
            "plan",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


def _actor(request) -> str:
    return getattr(request.user, "label", "") or "operator"


class DefragPlanView(APIView):
    """GET: the dry run of a defragmentation plan for the fleet as it is now."""

    permission_classes = [IsOperator]

    @extend_schema(parameters=[DefragQuerySerializer], responses={200: dict})
    def get(self, request):
        form = DefragQuerySerializer(data=request.query_params)
        form.is_valid(raise_exception=True)
        return Response(defrag.make_plan(**form.validated_data))


class DefragRunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Defragmentation runs (operators only). POST plans now and executes the plan."""

    permission_classes = [IsOperator]
    serializer_class = DefragRunSerializer
    queryset = DefragRun.objects.order_by("-created_at")

    @extend_schema(request=DefragQuerySerializer, responses={202: DefragRunSerializer})
    def create(self, request):
        form = DefragQuerySerializer(data=request.data)
        form.is_valid(raise_exception=True)
        run = defrag.start_run(actor=_actor(request), **form.validated_data)
        url = reverse("nodepools:defrag-run-detail", args=[run.pk])
        return Response(
            DefragRunSerializer(run).data,
            status=status.HTTP_202_ACCEPTED,
            headers={
                "Location": request.build_absolute_uri(url),
                "Retry-After": str(settings.NVKE_OPERATION_RETRY_AFTER_S),
            },
        )
