"""Usage endpoint: ``GET /api/v1/clusters/{id}/usage?start=&end=``."""

from __future__ import annotations

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.usage import cluster_usage
from clusters.models import Cluster
from nvke.errors import InvalidInput
from nvke.scoping import get_scoped_or_404


def _parse_time(value: str | None, name: str):
    if value is None or value == "":
        return None
    parsed = parse_datetime(value.replace(" ", "+"))
    if parsed is None or parsed.tzinfo is None:
        raise InvalidInput(
            f"{name} must be an RFC 3339 timestamp with a UTC offset, e.g. 2026-11-29T10:00:00Z",
            code="invalid_time",
            field=name,
        )
    return parsed


class ClusterUsageView(APIView):
    """GPU-hours (exact, from the allocation ledger) and mean GPU utilization of a cluster.

    ``start`` defaults to the cluster's creation, ``end`` to now; the window is ``[start, end)``.
    """

    @extend_schema(
        parameters=[
            OpenApiParameter("start", str, description="RFC 3339, inclusive"),
            OpenApiParameter("end", str, description="RFC 3339, exclusive"),
        ],
        responses={200: dict},
    )
    def get(self, request, cluster_pk):
        cluster = get_scoped_or_404(Cluster.objects.all(), request.user, pk=cluster_pk)
        now = timezone.now()
        start = _parse_time(request.query_params.get("start"), "start") or cluster.created_at
        end = _parse_time(request.query_params.get("end"), "end") or now
        if end <= start:
            raise InvalidInput("end must be after start", code="invalid_time_range", field="end")
        body = cluster_usage(cluster.id, start, end, now).as_dict()
        body["cluster_id"] = str(cluster.id)
        return Response(body)
