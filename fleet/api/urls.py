from django.urls import path

from nvke.routers import OptionalSlashRouter

from .views import AgentRegisterView, AgentReportView, FragmentationView, HostViewSet

app_name = "fleet"

router = OptionalSlashRouter()
router.register("fleet/hosts", HostViewSet, basename="host")

urlpatterns = [
    path("agent/register", AgentRegisterView.as_view(), name="agent-register"),
    path("agent/reports", AgentReportView.as_view(), name="agent-reports"),
    path("fleet/fragmentation", FragmentationView.as_view(), name="fleet-fragmentation"),
    *router.urls,
]
