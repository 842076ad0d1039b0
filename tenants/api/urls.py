from nvke.routers import OptionalSlashRouter

from .views import TenantViewSet

app_name = "tenants"

router = OptionalSlashRouter()
router.register("tenants", TenantViewSet, basename="tenant")

urlpatterns = router.urls
