"""Tenant portal: the activity feed of the tenant, of one cluster, of one node pool."""

from __future__ import annotations

from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from clusters.models import Cluster
from nodepools.models import NodePool
from nvke.scoping import get_scoped_or_404
from portal import activity
from portal.access import tenant_page
from portal.listing import MAX_SEARCH, PAGE_SIZE

from .common import is_htmx

POLL_S = 5


def _render(request: HttpRequest, title: str, entries, context: dict) -> HttpResponse:
    """Filter (``kind``, ``status`` among the statuses the entries hold, ``q`` a substring of
    title, target, reason), then page the feed."""
    kind = request.GET.get("kind", "")
    kind = kind if kind in activity.KINDS else ""
    statuses = sorted({e.status for e in entries})
    status = request.GET.get("status", "")
    status = status if status in statuses else ""
    q = request.GET.get("q", "")[:MAX_SEARCH].strip()
    entries = activity.matching(entries, kind=kind, status=status, text=q)
    page = Paginator(entries, PAGE_SIZE).get_page(request.GET.get("page"))
    query = urlencode({k: v for k, v in (("kind", kind), ("status", status), ("q", q)) if v})
    context.update(
        {
            "title": title,
            "page": page,
            "kinds": activity.KINDS,
            "kind": kind,
            "statuses": statuses,
            "status": status,
            "q": q,
            "query": query + "&" if query else "",
            "poll_s": POLL_S,
        }
    )
    if is_htmx(request) and request.GET.get("fragment") == "feed":
        return render(request, "portal/partials/feed.html", context)
    return render(request, "portal/activity.html", context)


@tenant_page
def tenant_activity(request: HttpRequest) -> HttpResponse:
    """Everything that happened to the tenant's objects, newest first (polls every 5 s)."""
    return _render(request, "Activity", activity.feed(request.principal), {})


@tenant_page
def cluster_activity(request: HttpRequest, cluster_id) -> HttpResponse:
    """The feed of one cluster: its operations, its pools', deliveries about them."""
    cluster = get_scoped_or_404(Cluster.objects.all(), request.principal, pk=cluster_id)
    entries = activity.feed(request.principal, cluster_id=cluster.id)
    return _render(request, f"Activity of cluster {cluster.name}", entries, {"cluster": cluster})


@tenant_page
def nodepool_activity(request: HttpRequest, cluster_id, pool_id) -> HttpResponse:
    """The feed of one node pool: its operations (repairs, host maintenance included)."""
    pool = get_scoped_or_404(
        NodePool.objects.filter(cluster_id=cluster_id).select_related("cluster"),
        request.principal,
        pk=pool_id,
    )
    entries = activity.feed(request.principal, pool_id=pool.id)
    return _render(
        request,
        f"Activity of node pool {pool.name}",
        entries,
        {"cluster": pool.cluster, "pool": pool},
    )
