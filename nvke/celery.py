"""The Celery application (JSON messages, late acks, queues per kind of work).

Queues: ``reconcile`` (cluster / node pool reconcilers), ``telemetry`` (ingest, rollups,
partitions), ``billing`` and ``default``. Routing lives in ``settings.CELERY_TASK_ROUTES``.
Beat is :class:`nvke.beat.ResilientRedBeatScheduler` (``settings.CELERY_BEAT_SCHEDULER``).
"""

from __future__ import annotations

import os

from celery import Celery
from django_structlog.celery.steps import DjangoStructLogInitStep

from . import broker
from .heartbeat import WorkerHeartbeat

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nvke.settings")

app = Celery("nvke")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# JSON logs in workers, with the request_id of the request that queued the task.
app.steps["worker"].add(DjangoStructLogInitStep)
# a heartbeat per worker for operators to alert on (nvke.heartbeat)
app.steps["worker"].add(WorkerHeartbeat)
# survive a broker restart with unacked messages held (kombu work-around, nvke.broker)
broker.install()
