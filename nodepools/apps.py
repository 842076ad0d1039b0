from django.apps import AppConfig


class NodepoolsConfig(AppConfig):
    name = "nodepools"
    verbose_name = "Node pools and nodes"

    def ready(self) -> None:
        from . import receivers  # noqa: F401  (connects to clusters.signals)
