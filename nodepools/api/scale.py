"""``POST /api/v1/clusters/{id}/nodepools/{np_id}/set-size`` (GKE's ``setSize``)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.views import APIView

from clusters.api.accepted import accepted
from clusters.api.serializers import OperationSerializer
from nodepools.api.serializers import DryRunSerializer
from nodepools.api.views import DRY_RUN, _dry_run, _result
from nodepools.models import NodePool
from nodepools.scaling import set_node_pool_size
from nvke.etags import check_if_match
from nvke.scoping import get_scoped_or_404


class SetSizeSerializer(serializers.Serializer):
    node_count = serializers.IntegerField(min_value=0, max_value=1000)


class NodePoolSetSizeView(APIView):
    """Resize a node pool; answers 202 with a SET_NODE_POOL_SIZE operation, or with
    ``?dry_run=true`` 200 and what the resize would do (nothing changed)."""

    checks_if_match = True  # documented by nvke.openapi (If-Match, 412)

    @extend_schema(
        request=SetSizeSerializer,
        parameters=[DRY_RUN],
        responses={202: OperationSerializer, 200: DryRunSerializer},
    )
    def post(self, request, cluster_pk, pk):
        dry_run = _dry_run(request)
        pool = get_scoped_or_404(
            NodePool.objects.filter(cluster_id=cluster_pk), request.user, pk=pk
        )
        check_if_match(request, pool)
        form = SetSizeSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        result = set_node_pool_size(
            principal=request.user,
            pool=pool,
            node_count=form.validated_data["node_count"],
            dry_run=dry_run,
        )
        return _result(request, result)


class AutoscalingSerializer(serializers.Serializer):
    enabled = serializers.BooleanField(default=True)
    min_node_count = serializers.IntegerField(min_value=0, max_value=1000)
    max_node_count = serializers.IntegerField(min_value=0, max_value=1000)


class NodePoolAutoscalingView(APIView):
    """Autoscaling by measured GPU utilization, between min and max nodes (202 + Operation)."""

    checks_if_match = True  # documented by nvke.openapi (If-Match, 412)

    @extend_schema(request=AutoscalingSerializer, responses={202: OperationSerializer})
    def put(self, request, cluster_pk, pk):
        from nodepools.autoscaling import set_autoscaling

        pool = get_scoped_or_404(
            NodePool.objects.filter(cluster_id=cluster_pk), request.user, pk=pk
        )
        check_if_match(request, pool)
        form = AutoscalingSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        op = set_autoscaling(principal=request.user, pool=pool, autoscaling=form.validated_data)
        return accepted(request, op)
