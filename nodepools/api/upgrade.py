"""Node upgrades: ``POST …/nodepools/{id}/upgrade`` and ``…/resume-upgrade``."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters.api.accepted import accepted
from clusters.api.serializers import OperationSerializer
from nodepools.host_drivers import DRIVER_UPGRADE_HELP
from nodepools.models import NodePool
from nodepools.upgrades import resume_upgrade, upgrade_nodepool
from nvke.etags import check_if_match
from nvke.scoping import get_scoped_or_404

from .serializers import NodePoolSerializer


class UpgradeSerializer(serializers.Serializer):
    kubernetes_version = serializers.RegexField(
        r"^\d+\.\d+(\.\d+)?$", max_length=16, required=False
    )
    driver_version = serializers.CharField(
        max_length=32, required=False, allow_blank=True, help_text=DRIVER_UPGRADE_HELP
    )
    max_surge = serializers.IntegerField(min_value=0, max_value=100, default=0)
    max_unavailable = serializers.IntegerField(min_value=0, max_value=100, default=1)
    drain_timeout_s = serializers.IntegerField(min_value=0, max_value=86400, default=600)
    force = serializers.BooleanField(default=False)
    urgent = serializers.BooleanField(default=False)


class ResumeSerializer(serializers.Serializer):
    force = serializers.BooleanField(default=False)


def _pool(request, cluster_pk, pk) -> NodePool:
    pool = get_scoped_or_404(NodePool.objects.filter(cluster_id=cluster_pk), request.user, pk=pk)
    check_if_match(request, pool)
    return pool


class NodePoolUpgradeView(APIView):
    """Roll the pool's nodes to a Kubernetes version and/or NVIDIA driver (202 + Operation)."""

    checks_if_match = True  # documented by nvke.openapi (If-Match, 412)

    @extend_schema(request=UpgradeSerializer, responses={202: OperationSerializer})
    def post(self, request, cluster_pk, pk):
        pool = _pool(request, cluster_pk, pk)
        form = UpgradeSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        op = upgrade_nodepool(principal=request.user, pool=pool, **form.validated_data)
        return accepted(request, op)


class NodePoolResumeUpgradeView(APIView):
    """Resume a paused upgrade (``force`` evicts pods that block the drain)."""

    checks_if_match = True  # documented by nvke.openapi (If-Match, 412)

    @extend_schema(request=ResumeSerializer, responses={200: NodePoolSerializer})
    def post(self, request, cluster_pk, pk):
        pool = _pool(request, cluster_pk, pk)
        form = ResumeSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        pool = resume_upgrade(principal=request.user, pool=pool, **form.validated_data)
        return Response(NodePoolSerializer(pool).data)
