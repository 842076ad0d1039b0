from __future__ import annotations

from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "GPU fleet"

    def ready(self) -> None:
        from nvke.metrics import register_collector

        from .metrics import COLLECTOR

        register_collector(COLLECTOR)
