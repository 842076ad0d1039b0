"""Enqueue a reconcile task for an object at most once per pending delay.

Reconcilers requeue themselves and the beat resync re-enqueues unconverged objects; without a
guard, duplicate messages for one object would pile up. ``enqueue_once`` takes a short Redis
key (``cache.add`` is an atomic SET NX) for the object; the task drops the key when it starts,
so a later change can enqueue again. Losing the key (Redis restart) only allows a duplicate,
which the reconcilers tolerate (idempotent, one-at-a-time by row lock).
"""

from __future__ import annotations

from typing import Any

from django.core.cache import cache


def _key(task_name: str, object_id: Any) -> str:
    return f"enqueued:{task_name}:{object_id}"


def enqueue_once(task: Any, object_id: Any, countdown: float = 0.0) -> bool:
    """Send ``task(object_id)`` after ``countdown`` seconds unless one is already pending.

    Returns True when a message was sent.
    """
    ttl = int(countdown) + 30
    if not cache.add(_key(task.name, object_id), 1, timeout=ttl):
        return False
    task.apply_async((str(object_id),), countdown=countdown)
    return True


def clear_pending(task_name: str, object_id: Any) -> None:
    """Called by a task when it starts: allow the next enqueue for this object."""
    cache.delete(_key(task_name, object_id))
