"""The Celery application (JSON messages, late acks, queues per kind of work).

Queues: ``reconcile`` (cluster / node pool reconcilers), ``telemetry`` (ingest, rollups,
partitions), ``billing`` and ``default``. Routing lives in ``settings.CELERY_TASK_ROUTES``.
"""

from __future__ import annotations

import os

from celery import Celery, signals
from django_structlog.celery.steps import DjangoStructLogInitStep

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nvke.settings")

app = Celery("nvke")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# JSON logs in workers, with the request_id of the request that queued the task.
app.steps["worker"].add(DjangoStructLogInitStep)


@signals.worker_init.connect
def _refuse_development_secrets(**kwargs) -> None:
    """A worker does not start on development secrets with DEBUG off (nvke/secrets_check.py)."""
    from nvke.secrets_check import require_production_secrets

    require_production_secrets()
