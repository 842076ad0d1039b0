"""Checkpoint-aware disruption (:mod:`nodepools.checkpoints`):

* ``PUT / DELETE …/nodepools/{id}/disruption-hook``: attach, change or detach the pool's hook;
* ``GET …/nodepools/{id}/disruption-requests[/{request_id}]``: what was asked, and when;
* ``POST …/nodepools/{id}/disruption-requests/{request_id}/ack``: the tenant checkpointed.
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from nodepools import checkpoints
from nodepools.models import DisruptionRequest, NodePool
from nvke.errors import refuse_unknown_fields
from nvke.etags import check_if_match
from nvke.scoping import get_scoped_or_404
from nvke.viewsets import TenantScopedMixin

from .serializers import DisruptionHookSerializer, DisruptionRequestSerializer


def _pool(request, cluster_pk, pk) -> NodePool:
    return get_scoped_or_404(NodePool.objects.filter(cluster_id=cluster_pk), request.user, pk=pk)


class NodePoolDisruptionHookView(APIView):
    """The pool's disruption hook: ``{"checkpoint_deadline_s": n}``, or ``{}`` for none."""

    checks_if_match = True  # documented by nvke.openapi (If-Match, 412)

    @extend_schema(request=None, responses={200: DisruptionHookSerializer})
    def get(self, request, cluster_pk, pk):
        return Response(_pool(request, cluster_pk, pk).disruption_hook)

    @extend_schema(request=DisruptionHookSerializer, responses={200: DisruptionHookSerializer})
    def put(self, request, cluster_pk, pk):
        """Attach or change the hook (200 with it). ``checkpoint_deadline_s`` defaults to
        600 s; more than the operator's ``NVKE_CHECKPOINT_DEADLINE_MAX_S`` is a 400
        ``checkpoint_deadline_too_long``."""
        pool = _pool(request, cluster_pk, pk)
        check_if_match(request, pool)
        form = DisruptionHookSerializer(data=request.data)
        refuse_unknown_fields(
            request.data, form.fields, "a disruption hook takes only checkpoint_deadline_s"
        )
        form.is_valid(raise_exception=True)
        hook = checkpoints.set_disruption_hook(
            principal=request.user,
            pool=pool,
            checkpoint_deadline_s=form.validated_data.get("checkpoint_deadline_s"),
        )
        return Response(hook)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, cluster_pk, pk):
        """Detach the hook: planned disruptions no longer wait (a waiting drain goes on)."""
        pool = _pool(request, cluster_pk, pk)
        check_if_match(request, pool)
        checkpoints.remove_disruption_hook(principal=request.user, pool=pool)
        return Response(status=204)


class DisruptionRequestViewSet(
    TenantScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """The pool's disruption requests, newest first; ``ack`` acknowledges one."""

    queryset = DisruptionRequest.objects.all()
    serializer_class = DisruptionRequestSerializer

    def get_queryset(self):
        pool, cluster = self.kwargs["pool_pk"], self.kwargs["cluster_pk"]
        return super().get_queryset().filter(nodepool_id=pool, nodepool__cluster_id=cluster)

    def list(self, request, *args, **kwargs):
        _pool(request, kwargs["cluster_pk"], kwargs["pool_pk"])  # another tenant's pool: 404
        return super().list(request, *args, **kwargs)

    @extend_schema(request=None, responses={200: DisruptionRequestSerializer})
    @action(detail=True, methods=["post"])
    def ack(self, request, cluster_pk=None, pool_pk=None, pk=None):
        """The tenant checkpointed: the drain goes on at once (idempotent; 409
        ``disruption_request_expired`` once the deadline passed and the drain went on)."""
        found = self.get_object()
        done = checkpoints.acknowledge(found, via="api", by=request.user.label, now=timezone.now())
        return Response(self.get_serializer(done).data)
