from django.apps import AppConfig


class NodepoolsConfig(AppConfig):
    name = "nodepools"
    verbose_name = "Node pools and nodes"

    def ready(self) -> None:
        from fleet import host_driver

        from . import receivers  # noqa: F401  (connects to clusters.signals)
        from .host_drivers import node_pins

        if node_pins not in host_driver.HOLDER_PINS:
            host_driver.HOLDER_PINS.append(node_pins)
