from rest_framework.routers import SimpleRouter

from .views import ClusterViewSet, OperationViewSet

app_name = "clusters"

router = SimpleRouter(trailing_slash="/?")
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("operations", OperationViewSet, basename="operation")

urlpatterns = router.urls
