from __future__ import annotations

from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "GPU fleet"

    def ready(self) -> None:
        from nvke.celery import app
        from nvke.metrics import register_collector

        from .metrics import COLLECTOR
        from .tasks import BEAT_SCHEDULE

        register_collector(COLLECTOR)
        # The fleet's own periodic tasks (the entries already in settings win).
        for name, entry in BEAT_SCHEDULE.items():
            app.conf.beat_schedule.setdefault(name, entry)
