"""The webhooks worker's log under a tarpit (issue 26 leftover): 27,000 INFO lines in 7 minutes,
five per busy round of each delivery (Celery's received/succeeded, django-structlog's
enqueued/started/succeeded). A worker consuming only ``webhooks`` keeps those loggers at
WARNING; any other worker is left as it is."""

from __future__ import annotations

import logging
import weakref
from types import SimpleNamespace

import pytest

from nvke.celery import PER_TASK_LOGGERS, _quiet_per_task_lines_of_the_webhooks_worker


@pytest.fixture
def levels():
    before = {name: logging.getLogger(name).level for name in PER_TASK_LOGGERS}
    yield lambda: {name: logging.getLogger(name).level for name in PER_TASK_LOGGERS}
    for name, level in before.items():
        logging.getLogger(name).setLevel(level)


def worker(*queues: str) -> SimpleNamespace:
    return SimpleNamespace(
        app=SimpleNamespace(
            amqp=SimpleNamespace(queues=SimpleNamespace(consume_from=dict.fromkeys(queues)))
        )
    )


def test_only_the_webhooks_worker_drops_its_per_task_info_lines(levels):
    from celery import signals

    connected = [
        r() if isinstance(r, weakref.ref) else r for _, r in signals.celeryd_after_setup.receivers
    ]
    assert _quiet_per_task_lines_of_the_webhooks_worker in connected
    for queues in (("reconcile", "telemetry", "billing", "default"), ("webhooks", "default")):
        _quiet_per_task_lines_of_the_webhooks_worker(sender="w@h", instance=worker(*queues))
        assert set(levels().values()) == {logging.NOTSET}, queues  # as configured: LOG_LEVEL
    _quiet_per_task_lines_of_the_webhooks_worker(sender="webhooks@h", instance=worker("webhooks"))
    assert set(levels().values()) == {logging.WARNING}
    trace = logging.getLogger("celery.app.trace")
    assert not trace.isEnabledFor(logging.INFO) and trace.isEnabledFor(logging.ERROR)
