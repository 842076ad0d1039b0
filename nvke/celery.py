"""The Celery application (JSON messages, late acks, queues per kind of work).

Queues: ``reconcile`` (cluster / node pool reconcilers), ``telemetry`` (ingest, rollups,
partitions), ``billing`` and ``default``. Routing lives in ``settings.CELERY_TASK_ROUTES``.
Beat is :class:`nvke.beat.ResilientRedBeatScheduler` (``settings.CELERY_BEAT_SCHEDULER``).
"""

from __future__ import annotations

import logging
import os

from celery import Celery, signals
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


@app.on_after_configure.connect
def _redbeat_names(sender: Celery, **kwargs) -> None:
    """Give celery-redbeat its settings under the bare names it looks for.

    ``redbeat.schedulers.RedBeatConfig.is_key_in_conf`` compares the configuration's raw keys,
    which under the ``CELERY`` namespace are ``CELERY_REDBEAT_*``: it reads the right URL but
    believes none was set, so every beat start logged "RedBeat will stop falling back to
    broker_url" (and to broker_transport_options), and 2.5.0 drops that fallback. Options are
    ``{}``, which is what redbeat used for the connection before (it never forwarded the
    broker's transport options to its Redis client)."""
    sender.conf.update(
        redbeat_redis_url=sender.conf.first("redbeat_redis_url"), redbeat_redis_options={}
    )


@signals.worker_process_init.connect
def _tracing(**kwargs) -> None:
    """OpenTelemetry per worker process, after the fork (a no-op unless NVKE_TRACING=1)."""
    from nvke.tracing import setup_tracing

    setup_tracing("nvke-worker")


@signals.task_prerun.connect
@signals.task_postrun.connect
def _close_old_database_connections(**kwargs) -> None:
    """Around each task, close a database connection only when Django would around a request:
    older than ``DB_CONN_MAX_AGE`` s, after an error, or with a transaction left open
    (``django.db.close_old_connections``). Celery's own fix-up, which closes it around every
    task, is held off by ``settings.CELERY_DB_REUSE_MAX``; a connection kept is health-checked
    before its next use (``CONN_HEALTH_CHECKS``). Eager tasks run inside their caller's
    connection and are left alone."""
    task = kwargs.get("task") or kwargs.get("sender")
    if getattr(getattr(task, "request", None), "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()


@signals.worker_init.connect
def _refuse_development_secrets(**kwargs) -> None:
    """A worker does not start on development secrets with DEBUG off (nvke/secrets_check.py)."""
    from nvke.secrets_check import require_production_secrets

    require_production_secrets()


#: loggers writing INFO lines for every task a worker runs: Celery's "received" and
#: "succeeded", django-structlog's task_enqueued / task_started / task_succeeded
PER_TASK_LOGGERS = (
    "celery.worker.strategy",
    "celery.app.trace",
    "django_structlog.celery.receivers",
)


@signals.celeryd_after_setup.connect
def _quiet_per_task_lines_of_the_webhooks_worker(sender=None, instance=None, **kwargs) -> None:
    """A worker consuming only the ``webhooks`` queue writes no per-task INFO lines.

    A delivery whose tenant is at its share of attempts re-queues itself every 1-10 s
    (``webhooks.tasks.deliver_webhook``); under a tarpit that was 27,000 INFO lines in 7
    minutes (five per round, none of them saying anything). Failures (WARNING and up) still
    show, and the delivery's own lines (``webhooks.services``: one per real attempt) too."""
    consumed = set(getattr(instance.app.amqp.queues, "consume_from", None) or ())
    if consumed == {"webhooks"}:
        for name in PER_TASK_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
