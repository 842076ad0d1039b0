from django.apps import AppConfig


class ClustersConfig(AppConfig):
    name = "clusters"
    verbose_name = "Clusters and operations"

    def ready(self) -> None:
        from . import receivers  # noqa: F401  (connects to tenants' and catalog's signals)
