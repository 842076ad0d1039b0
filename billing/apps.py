from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    verbose_name = "Metering and billing"

    def ready(self) -> None:
        from . import receivers  # noqa: F401  (connects to nodepools.signals)
