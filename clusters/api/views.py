"""Cluster and operation endpoints (tenant-scoped)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.response import Response

from clusters import services
from clusters.models import Cluster, Operation
from nvke.viewsets import TenantScopedMixin

from .serializers import ClusterCreateSerializer, ClusterSerializer, OperationSerializer


class ClusterViewSet(
    TenantScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Clusters of the caller's tenant. Create and delete answer 202 with an Operation."""

    queryset = Cluster.objects.all()
    serializer_class = ClusterSerializer
    filterset_fields = ["phase", "region"]

    @extend_schema(request=ClusterCreateSerializer, responses={202: OperationSerializer})
    def create(self, request):
        form = ClusterCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        op = services.create_cluster(principal=request.user, **form.validated_data)
        return Response(OperationSerializer(op).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: OperationSerializer})
    def destroy(self, request, pk=None):
        cluster = self.get_object()
        op = services.delete_cluster(principal=request.user, cluster=cluster)
        return Response(OperationSerializer(op).data, status=status.HTTP_202_ACCEPTED)


class OperationViewSet(TenantScopedMixin, viewsets.ReadOnlyModelViewSet):
    """Operations of the caller's tenant (filter by ``target_id``, ``cluster``, ``status``)."""

    queryset = Operation.objects.all()
    serializer_class = OperationSerializer
    filterset_fields = ["target_id", "target_type", "cluster", "status", "type"]
