"""Node pool endpoints, nested under a cluster (tenant-scoped)."""

from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from clusters.api.accepted import accepted
from clusters.api.serializers import OperationSerializer
from clusters.models import Cluster
from nodepools import services
from nodepools.models import Node, NodePool
from nvke.errors import InvalidInput, refuse_unknown_fields
from nvke.lean_lists import value_columns
from nvke.scoping import get_scoped_or_404
from nvke.sql_lists import Nested, list_response
from nvke.viewsets import SHOW_DELETED, HidesDeletedMixin, TenantScopedMixin

from .serializers import (
    DryRunSerializer,
    GpuConfigSerializer,
    NodePoolCreateSerializer,
    NodePoolSerializer,
    NodePoolUpdateSerializer,
    NodeSerializer,
)

DRY_RUN = OpenApiParameter(
    "dry_run",
    OpenApiTypes.BOOL,
    description="validate and render only: 200 with the GPU config and the disruption",
)


_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


def _dry_run(request) -> bool:
    """``?dry_run=``: absent is False; ``1``/``true``/``yes`` True, ``0``/``false``/``no``
    False (any case). Anything else — empty, another word, the parameter twice — is a 400
    ``invalid_boolean`` naming ``dry_run``: a mistyped dry run must not create a pool."""
    values = request.query_params.getlist("dry_run")
    if not values:
        return False
    if len(values) == 1 and values[0].lower() in _TRUE + _FALSE:
        return values[0].lower() in _TRUE
    raise InvalidInput(
        "dry_run must be given once, as true or false (also 1/0, yes/no)",
        code="invalid_boolean",
        field="dry_run",
    )


def _result(request, result) -> Response:
    if isinstance(result, services.DryRun):
        return Response(result.as_dict(), status=status.HTTP_200_OK)
    return accepted(request, result)


#: the Node columns the pool serializer reads: NodeSerializer's own fields (its ``host`` comes
#: from the joined host row) + the prefetch key. Derived, so a new field cannot cost a query per
#: node (tests/api/test_list_queries.py).
NODE_LIST_FIELDS = (
    *(f for f in NodeSerializer.Meta.fields if f not in ("host", "driver_version")),
    "nodepool_id",
)


def attach_node_rows(pools: list[dict]) -> None:
    """Give each pool row of a list page (a ``.values()`` dict with ``id`` and ``phase``) its
    ``nodes``: the pool's nodes as ``.values()`` dicts of :data:`NODE_LIST_FIELDS` +
    ``host__hostname`` and ``host__driver_version``, in the nodes' model order, from one
    query (none for an empty page);
    the DELETED ones only once the pool itself is DELETED, as ``PoolNodesSerializer`` shows
    them. No ``Node`` or deferred ``Host`` instance is built (a page has 100 nodes)."""
    by_pool: dict = {}
    gone: set = set()
    for pool in pools:
        pool["nodes"] = by_pool[pool["id"]] = []
        if pool["phase"] == "DELETED":
            gone.add(pool["id"])
    if not pools:
        return
    for row in Node.objects.filter(nodepool_id__in=list(by_pool)).values(
        *NODE_LIST_FIELDS, "host__hostname", "host__driver_version"
    ):
        if row["phase"] != "DELETED" or row["nodepool_id"] in gone:
            by_pool[row["nodepool_id"]].append(row)


#: the ``nodes`` of a node pool row as PostgreSQL writes them (nvke/sql_lists.py): the pool's
#: nodes as :class:`NodeSerializer` shows them, in the nodes' model order (created, then
#: name), the DELETED ones only once the pool itself is DELETED (as ``PoolNodesSerializer``)
POOL_NODES = Nested(
    NodeSerializer,
    fk="nodepool",
    ordering=("created_at", "name"),
    where="({row}.phase <> 'DELETED' OR {parent}.phase = 'DELETED')",
)


#: the NodePool columns a list page reads (``nodes`` is attached by :func:`attach_node_rows`)
POOL_LIST_COLUMNS = tuple(c for c in value_columns(NodePoolSerializer) if c != "nodes")


class NodePoolViewSet(
    HidesDeletedMixin,
    TenantScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Node pools of one cluster (DELETED ones only with ``?show_deleted=true`` or
    ``?phase=DELETED``). Create and delete answer 202 with an Operation."""

    # the nodes with only the columns NodeSerializer shows (a host row carries JSON topology
    # and warnings that a list would decode 100 times a page for one hostname)
    queryset = NodePool.objects.select_related("gpu_model").prefetch_related(
        Prefetch(
            "nodes",
            queryset=Node.objects.select_related("host").only(
                *NODE_LIST_FIELDS, "host__hostname", "host__driver_version"
            ),
        )
    )
    serializer_class = NodePoolSerializer
    filterset_fields = ["phase", "gpu_model"]

    def get_queryset(self):
        qs = super().get_queryset().filter(cluster_id=self.kwargs["cluster_pk"])
        if self.action == "list":  # the serializer reads gpu_model_id only; actions need more
            # and the page's nodes come as .values() rows (attach_node_rows)
            qs = qs.select_related(None).prefetch_related(None)
        return qs

    def _cluster(self) -> Cluster:
        return get_scoped_or_404(
            Cluster.objects.all(), self.request.user, pk=self.kwargs["cluster_pk"]
        )

    @extend_schema(parameters=[SHOW_DELETED])
    def list(self, request, *args, **kwargs):
        """A page of node pools with their nodes, written by PostgreSQL (nvke/sql_lists.py;
        the nodes as :data:`POOL_NODES`); where that path cannot serve, ``.values()`` rows
        of the serializer's columns with their nodes attached (nvke/lean_lists.py)."""

        def check_cluster(pools: list) -> None:
            if not pools:  # pools of the tenant's own cluster prove it is there; none prove
                self._cluster()  # nothing: another tenant's cluster answers 404, not []

        written = list_response(
            self, NodePoolSerializer, nested={"nodes": POOL_NODES}, on_page=check_cluster
        )
        if written is not None:
            return written
        rows = self.filter_queryset(self.get_queryset()).values(*POOL_LIST_COLUMNS)
        page = self.paginate_queryset(rows)
        pools = list(rows) if page is None else page
        check_cluster(pools)
        attach_node_rows(pools)
        data = self.get_serializer(pools, many=True).data
        return Response(data) if page is None else self.get_paginated_response(data)

    @extend_schema(
        request=NodePoolCreateSerializer,
        parameters=[DRY_RUN],
        responses={202: OperationSerializer, 200: DryRunSerializer},
    )
    def create(self, request, cluster_pk=None):
        cluster = self._cluster()
        form = NodePoolCreateSerializer(data=request.data)
        refuse_unknown_fields(
            request.data,
            form.fields,
            f"a node pool takes {', '.join(form.fields)} (its Kubernetes version is the "
            "cluster's until an upgrade)",
            code="unknown_field",
        )
        form.is_valid(raise_exception=True)
        result = services.create_nodepool(
            principal=request.user,
            cluster=cluster,
            dry_run=_dry_run(request),
            **form.validated_data,
        )
        return _result(request, result)

    @extend_schema(
        request=NodePoolUpdateSerializer,
        parameters=[DRY_RUN],
        responses={202: OperationSerializer, 200: DryRunSerializer},
    )
    def partial_update(self, request, cluster_pk=None, pk=None):
        """Change the isolation policy: drains, repartitions and validates node by node."""
        pool = self.get_object()
        refuse_unknown_fields(
            request.data,
            {"isolation"},
            "only isolation can be changed here (set-size changes node_count)",
        )
        form = NodePoolUpdateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        result = services.update_isolation(
            principal=request.user,
            pool=pool,
            isolation=form.validated_data["isolation"],
            dry_run=_dry_run(request),
        )
        return _result(request, result)

    @extend_schema(request=None, responses={200: GpuConfigSerializer})
    @action(detail=True, methods=["get"], url_path="gpu-config")
    def gpu_config(self, request, cluster_pk=None, pk=None):
        """The GPU Operator inputs of the pool and each node's validated per-GPU layout."""
        pool = self.get_object()
        nodes = [
            {
                "name": n.name,
                "phase": n.phase,
                "config_state": n.config_state,
                "gpu_layout": n.gpu_layout,
            }
            for n in pool.nodes.all()
            if n.phase != "DELETED"
        ]
        return Response(
            {
                "nodepool_id": str(pool.id),
                "isolation": pool.isolation,
                "gpu_config": pool.gpu_config,
                "rollout": pool.rollout,
                "nodes": nodes,
            }
        )

    @extend_schema(request=None, responses={202: OperationSerializer})
    def destroy(self, request, cluster_pk=None, pk=None):
        pool = self.get_object()
        op = services.delete_nodepool(principal=request.user, pool=pool)
        return accepted(request, op)
