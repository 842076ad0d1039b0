"""A Celery worker keeps its PostgreSQL connection from task to task (nvke/celery.py).

Celery's Django fix-up (``celery.fixups.django.DjangoWorkerFixup``) closed the connection
before and after every task: a new PostgreSQL backend per reconcile step (2,400 connects in
the reconcile benchmark's profile, 83.7 -> 61.3 / 55.3 s once kept, docs/development/
benchmarks.md). These tests run the fix-up's own handlers and NVKE's around a task, as a worker
does, and read the backend's pid from PostgreSQL.
"""

from __future__ import annotations

import time

import pytest
from celery import signals
from celery.fixups.django import DjangoWorkerFixup
from django.db import connection

from nodepools.tasks import reconcile_nodepool
from nvke.celery import app

pytestmark = pytest.mark.django_db(transaction=True)


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _run_task_hooks(fixup: DjangoWorkerFixup, task) -> None:
    """What a worker does around one task: prerun handlers, the task, postrun handlers."""
    fixup.on_task_prerun(sender=task)
    signals.task_prerun.send(sender=task, task_id="t", task=task, args=(), kwargs={})
    _backend_pid()  # the task's queries
    fixup.on_task_postrun(sender=task)
    signals.task_postrun.send(sender=task, task_id="t", task=task, args=(), kwargs={})


def test_the_connection_is_kept_across_tasks_and_closed_once_older_than_its_max_age():
    fixup = DjangoWorkerFixup(app)
    task = reconcile_nodepool
    first = _backend_pid()
    for _ in range(3):
        _run_task_hooks(fixup, task)
    assert _backend_pid() == first  # one backend for three tasks

    connection.close_at = time.monotonic() - 1  # DB_CONN_MAX_AGE has passed
    _run_task_hooks(fixup, task)
    assert _backend_pid() != first


def test_a_connection_left_in_a_transaction_is_closed_after_the_task():
    fixup = DjangoWorkerFixup(app)
    task = reconcile_nodepool
    first = _backend_pid()
    connection.set_autocommit(False)  # a task that died inside a transaction
    fixup.on_task_postrun(sender=task)
    signals.task_postrun.send(sender=task, task_id="t", task=task, args=(), kwargs={})
    assert connection.connection is None
    assert _backend_pid() != first
