"""Node pool endpoints, nested under a cluster (tenant-scoped)."""

from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.response import Response

from clusters.api.serializers import OperationSerializer
from clusters.models import Cluster
from nodepools import services
from nodepools.models import Node, NodePool
from nvke.scoping import get_scoped_or_404
from nvke.viewsets import TenantScopedMixin

from .serializers import NodePoolCreateSerializer, NodePoolSerializer


class NodePoolViewSet(
    TenantScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Node pools of one cluster. Create and delete answer 202 with an Operation."""

    queryset = NodePool.objects.select_related("gpu_model").prefetch_related(
        Prefetch("nodes", queryset=Node.objects.select_related("host"))
    )
    serializer_class = NodePoolSerializer

    def get_queryset(self):
        return super().get_queryset().filter(cluster_id=self.kwargs["cluster_pk"])

    def _cluster(self) -> Cluster:
        return get_scoped_or_404(
            Cluster.objects.all(), self.request.user, pk=self.kwargs["cluster_pk"]
        )

    def list(self, request, *args, **kwargs):
        self._cluster()  # another tenant's cluster answers 404, not an empty list
        return super().list(request, *args, **kwargs)

    @extend_schema(request=NodePoolCreateSerializer, responses={202: OperationSerializer})
    def create(self, request, cluster_pk=None):
        cluster = self._cluster()
        form = NodePoolCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        op = services.create_nodepool(
            principal=request.user, cluster=cluster, **form.validated_data
        )
        return Response(OperationSerializer(op).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: OperationSerializer})
    def destroy(self, request, cluster_pk=None, pk=None):
        pool = self.get_object()
        op = services.delete_nodepool(principal=request.user, pool=pool)
        return Response(OperationSerializer(op).data, status=status.HTTP_202_ACCEPTED)
