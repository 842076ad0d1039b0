from django.urls import path

from .checkpoints import DisruptionRequestViewSet, NodePoolDisruptionHookView
from .defrag import DefragPlanView, DefragRunViewSet
from .scale import NodePoolAutoscalingView, NodePoolSetSizeView
from .upgrade import NodePoolResumeUpgradeView, NodePoolUpgradeView
from .views import NodePoolViewSet

app_name = "nodepools"

pool_list = NodePoolViewSet.as_view({"get": "list", "post": "create"})
pool_detail = NodePoolViewSet.as_view(
    {"get": "retrieve", "delete": "destroy", "patch": "partial_update"}
)
pool_gpu_config = NodePoolViewSet.as_view({"get": "gpu_config"})

requests_prefix = "clusters/<uuid:cluster_pk>/nodepools/<uuid:pool_pk>/disruption-requests"

urlpatterns = [
    path("fleet/defrag/plan", DefragPlanView.as_view(), name="defrag-plan"),
    path(
        "fleet/defrag/runs",
        DefragRunViewSet.as_view({"get": "list", "post": "create"}),
        name="defrag-run-list",
    ),
    path(
        "fleet/defrag/runs/<uuid:pk>",
        DefragRunViewSet.as_view({"get": "retrieve"}),
        name="defrag-run-detail",
    ),
    path("clusters/<uuid:cluster_pk>/nodepools", pool_list, name="nodepool-list"),
    path("clusters/<uuid:cluster_pk>/nodepools/<uuid:pk>", pool_detail, name="nodepool-detail"),
    path(
        "clusters/<uuid:cluster_pk>/nodepools/<uuid:pk>/gpu-config",
        pool_gpu_config,
        name="nodepool-gpu-config",
    ),
    path(
        "clusters/<uuid:cluster_pk>/nodepools/<uuid:pk>/set-size",
        NodePoolSetSizeView.as_view(),
        name="nodepool-set-size",
    ),
    path(
        "clusters/<uuid:cluster_pk>/nodepools/<uuid:pk>/autoscaling",
        NodePoolAutoscalingView.as_view(),
        name="nodepool-autoscaling",
    ),
    path(
        "clusters/<uuid:cluster_pk>/nodepools/<uuid:pk>/upgrade",
        NodePoolUpgradeView.as_view(),
        name="nodepool-upgrade",
    ),
    path(
        "clusters/<uuid:cluster_pk>/nodepools/<uuid:pk>/resume-upgrade",
        NodePoolResumeUpgradeView.as_view(),
        name="nodepool-resume-upgrade",
    ),
    path(
        "clusters/<uuid:cluster_pk>/nodepools/<uuid:pk>/disruption-hook",
        NodePoolDisruptionHookView.as_view(),
        name="nodepool-disruption-hook",
    ),
    path(
        requests_prefix,
        DisruptionRequestViewSet.as_view({"get": "list"}),
        name="nodepool-disruption-request-list",
    ),
    path(
        f"{requests_prefix}/<uuid:pk>",
        DisruptionRequestViewSet.as_view({"get": "retrieve"}),
        name="nodepool-disruption-request-detail",
    ),
    path(
        f"{requests_prefix}/<uuid:pk>/ack",
        DisruptionRequestViewSet.as_view({"post": "ack"}),
        name="nodepool-disruption-request-ack",
    ),
]
