from rest_framework.routers import SimpleRouter

from .views import TenantViewSet

app_name = "tenants"

router = SimpleRouter(trailing_slash="/?")
router.register("tenants", TenantViewSet, basename="tenant")

urlpatterns = router.urls
