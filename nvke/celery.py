"""The Celery application (JSON messages, late acks, queues per kind of work).

Queues: ``reconcile`` (cluster / node pool reconcilers), ``telemetry`` (ingest, rollups,
partitions), ``billing`` and ``default``. Routing lives in ``settings.CELERY_TASK_ROUTES``.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nvke.settings")

app = Celery("nvke")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
