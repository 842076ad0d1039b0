"""Enqueue reconcile tasks: at most once per pending delay, and never failing a request or a
step because the broker is away.

Reconcilers requeue themselves and the beat resync re-enqueues unconverged objects; without a
guard, duplicate messages for one object would pile up. ``enqueue_once`` takes a short Redis
key (``cache.add`` is an atomic SET NX) for the object; the task drops the key when it starts,
so a later change can enqueue again. Losing the key (Redis restart) only allows a duplicate,
which the reconcilers tolerate (idempotent, one-at-a-time by row lock).

Broker down: the spec is already committed in PostgreSQL, and every committed change leaves the
object unconverged (``observed_generation < generation`` or a transitional phase), which the
beat resync re-enqueues once the broker is back (``NVKE_RESYNC_INTERVAL_S``). So a message that
cannot be sent is logged and counted (``nvke_enqueue_failures_total{task}``) and the caller goes
on: the API answers 202 with the PENDING operation instead of a 500
(docs/operator/outages-and-observability.md).

Countdowns are capped at ``MAX_COUNTDOWN_S`` (below the broker's visibility timeout): a delayed
message waits in the worker as *unacked*, and one older than the visibility timeout is handed
out again by Redis (a harmless duplicate, but a wasted step).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from kombu.exceptions import OperationalError
from prometheus_client import Counter
from redis import RedisError

log = logging.getLogger(__name__)

#: what a broker (or the Redis behind the pending keys) raises when it cannot be reached
BROKER_ERRORS: tuple[type[BaseException], ...] = (OperationalError, RedisError, ConnectionError)

ENQUEUE_FAILURES = Counter(
    "nvke_enqueue_failures",
    "Task messages not sent because the broker was unavailable (the resync sends them later)",
    ["task"],
)


def max_countdown_s() -> float:
    """The longest countdown sent: half the visibility timeout, at most 60 s."""
    visibility = float(settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("visibility_timeout", 3600))
    return max(min(visibility / 2, 60.0), 1.0)


def _key(task_name: str, object_id: Any) -> str:
    return f"enqueued:{task_name}:{object_id}"


def send(task: Any, object_id: Any, countdown: float = 0.0) -> bool:
    """``task.apply_async((str(object_id),), countdown=…)``; False (logged, counted) when the
    broker cannot be reached."""
    try:
        task.apply_async((str(object_id),), countdown=min(countdown, max_countdown_s()) or None)
    except BROKER_ERRORS as exc:
        ENQUEUE_FAILURES.labels(task.name).inc()
        log.warning(
            "broker unavailable: %s(%s) not sent, the resync will send it (%s)",
            task.name,
            object_id,
            exc,
        )
        return False
    return True


def send_on_commit(task: Any, object_id: Any) -> None:
    """Send ``task(object_id)`` once the current transaction commits (never before)."""
    transaction.on_commit(lambda: send(task, object_id))


def enqueue_once(task: Any, object_id: Any, countdown: float = 0.0) -> bool:
    """Send ``task(object_id)`` after ``countdown`` seconds unless one is already pending.

    Returns True when a message was sent (False when one is pending or the broker is away).
    """
    countdown = min(countdown, max_countdown_s())
    ttl = int(countdown) + 30
    try:
        if not cache.add(_key(task.name, object_id), 1, timeout=ttl):
            return False
    except BROKER_ERRORS as exc:
        ENQUEUE_FAILURES.labels(task.name).inc()
        log.warning("broker unavailable: %s(%s) not sent (%s)", task.name, object_id, exc)
        return False
    if send(task, object_id, countdown):
        return True
    clear_pending(task.name, object_id)  # let the resync send it as soon as it can
    return False


def clear_pending(task_name: str, object_id: Any) -> None:
    """Called by a task when it starts: allow the next enqueue for this object."""
    with contextlib.suppress(BROKER_ERRORS):  # else the key expires by itself
        cache.delete(_key(task_name, object_id))
