from nvke.routers import OptionalSlashRouter

from .views import ClusterViewSet, OperationViewSet

app_name = "clusters"

router = OptionalSlashRouter()
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("operations", OperationViewSet, basename="operation")

urlpatterns = router.urls
