"""Tenant portal: a cluster's node pools and operations as lists of their own, with search,
filters (choices from the values the cluster's rows hold), sort and pages.

The cluster page shows the newest rows of both tables; these pages hold all of them, through
the same list machinery as the cluster list (:mod:`portal.list_filters`,
:func:`portal.listing.paginate`). A bad filter, sort or page answers 400 with the reason on
the page, never a 500.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from clusters.choices import Phase
from clusters.models import Cluster, Operation
from nodepools.models import NodePool
from nvke.scoping import get_scoped_or_404, scope_queryset
from portal.access import tenant_page
from portal.list_filters import NodePoolFilter, OperationFilter
from portal.listing import paginate

from .clusters import POLL_S, pool_rows


@tenant_page
def nodepool_list(request: HttpRequest, cluster_id) -> HttpResponse:
    """The cluster's node pools (DELETED ones with ``?deleted=1``), newest first unless
    sorted: search name / GPU model / version, filter phase and GPU model."""
    cluster = get_scoped_or_404(Cluster.objects.all(), request.principal, pk=cluster_id)
    show_deleted = request.GET.get("deleted") == "1"
    pools = scope_queryset(NodePool.objects.filter(cluster=cluster), request.principal)
    if not show_deleted:
        pools = pools.exclude(phase=Phase.DELETED)
    pools = (
        pools.select_related("gpu_model").prefetch_related("nodes").order_by("-created_at", "name")
    )
    listing = paginate(request, NodePoolFilter(request.GET, queryset=pools))
    context = {
        "cluster": cluster,
        "listing": listing,
        "pools": pool_rows(listing.page.object_list),
        "keep": {"deleted": "1"} if show_deleted else {},
        "show_deleted": show_deleted,
        "poll_s": POLL_S,
    }
    return render(request, "portal/nodepool_list.html", context, status=listing.status)


@tenant_page
def operation_list(request: HttpRequest, cluster_id) -> HttpResponse:
    """The cluster's operations (its own and its node pools'), newest first unless sorted:
    search type / status / requester, filter type and status."""
    cluster = get_scoped_or_404(Cluster.objects.all(), request.principal, pk=cluster_id)
    operations = scope_queryset(
        Operation.objects.filter(cluster=cluster), request.principal
    ).order_by("-created_at", "id")
    listing = paginate(request, OperationFilter(request.GET, queryset=operations))
    names = {p.id: p.name for p in NodePool.objects.filter(cluster=cluster)}
    names[cluster.id] = cluster.name
    context = {
        "cluster": cluster,
        "listing": listing,
        "operations": [(op, names.get(op.target_id, "")) for op in listing.page.object_list],
        "keep": {},
    }
    return render(request, "portal/operation_list.html", context, status=listing.status)
