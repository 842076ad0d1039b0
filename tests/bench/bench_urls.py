"""The list benchmark's URLconf: NVKE's, plus bare Django views that run the same queries as
the API lists (count + one page of 50; the clusters' catalog query of supported versions; the
node pools' nodes with the hosts' names, the scoped cluster for an empty page) and return the
rows as JSON, without authentication, throttling, DRF or serializers: the framework-speed
baseline."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import path

from nvke.urls import handler400, handler403, handler404, handler500, urlpatterns  # noqa: F401

PAGE = 50


def _page(queryset, request: HttpRequest) -> dict:
    limit = int(request.GET.get("limit", PAGE))
    return {"count": queryset.count(), "results": list(queryset[:limit])}


def bare_clusters(request: HttpRequest) -> JsonResponse:
    from catalog.services import supported_kubernetes_versions
    from clusters.models import Cluster

    qs = Cluster.objects.filter(tenant_id=request.GET["tenant"]).values()
    body = _page(qs, request)
    body["supported"] = supported_kubernetes_versions()  # the API's catalog query, once a page
    return JsonResponse(body, json_dumps_params={"default": str})


def bare_nodepools(request: HttpRequest, cluster_pk) -> JsonResponse:
    from clusters.models import Cluster
    from nodepools.models import Node, NodePool

    qs = NodePool.objects.filter(tenant_id=request.GET["tenant"], cluster_id=cluster_pk).values()
    body = _page(qs, request)
    if not body["results"]:  # as the API: the cluster is read only for an empty page
        Cluster.objects.filter(tenant_id=request.GET["tenant"], pk=cluster_pk).get()
    nodes: dict = {}
    for node in Node.objects.filter(nodepool_id__in=[p["id"] for p in body["results"]]).values(
        "id", "name", "phase", "nodepool_id", "host__hostname", "zone", "gpu_uuids"
    ):
        nodes.setdefault(node["nodepool_id"], []).append(node)
    for pool in body["results"]:
        pool["nodes"] = nodes.get(pool["id"], [])
    return JsonResponse(body, json_dumps_params={"default": str})


def bare_operations(request: HttpRequest) -> JsonResponse:
    from clusters.models import Operation

    qs = Operation.objects.filter(tenant_id=request.GET["tenant"]).values()
    return JsonResponse(_page(qs, request), json_dumps_params={"default": str})


urlpatterns = [
    path("bare/clusters", bare_clusters),
    path("bare/clusters/<uuid:cluster_pk>/nodepools", bare_nodepools),
    path("bare/operations", bare_operations),
    *urlpatterns,
]
