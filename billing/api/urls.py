from django.urls import path

from .views import ClusterUsageView

app_name = "billing"

urlpatterns = [
    path("clusters/<uuid:cluster_pk>/usage", ClusterUsageView.as_view(), name="cluster-usage"),
]
