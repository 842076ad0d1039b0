from django.urls import path

from nvke.routers import OptionalSlashRouter

from .health_rules import (
    BreakerListView,
    BreakerResumeView,
    HealthRuleDetailView,
    HealthRuleDryRunView,
    HealthRuleListView,
)
from .views import AgentRegisterView, AgentReportView, FragmentationView, HostViewSet

app_name = "fleet"

router = OptionalSlashRouter()
router.register("fleet/hosts", HostViewSet, basename="host")

urlpatterns = [
    path("agent/register", AgentRegisterView.as_view(), name="agent-register"),
    path("agent/reports", AgentReportView.as_view(), name="agent-reports"),
    path("fleet/fragmentation", FragmentationView.as_view(), name="fleet-fragmentation"),
    path("fleet/health-rules", HealthRuleListView.as_view(), name="health-rules"),
    path("fleet/health-rules/dry-run", HealthRuleDryRunView.as_view(), name="health-rules-dry-run"),
    path("fleet/health-rules/<str:key>", HealthRuleDetailView.as_view(), name="health-rule"),
    path("fleet/breakers", BreakerListView.as_view(), name="breakers"),
    path("fleet/breakers/<str:scope>/resume", BreakerResumeView.as_view(), name="breaker-resume"),
    *router.urls,
]
