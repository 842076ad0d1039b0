"""Celery task: one delivery attempt, requeued with backoff until delivered or past deadline.

Routed to the ``webhooks`` queue (``CELERY_TASK_ROUTES``), which its own worker consumes (under
``make run`` too), so slow endpoints never hold a reconcile, telemetry or billing slot.
"""

from __future__ import annotations

import random

from celery import shared_task
from django.conf import settings

from . import services


def busy_countdown_s(busy_rounds: int) -> float:
    """Seconds before a delivery whose tenant was at its share is tried again: the base
    ``NVKE_WEBHOOK_BUSY_RETRY_S`` doubling per round, at most ``NVKE_WEBHOOK_BUSY_RETRY_MAX_S``,
    plus up to 50 % jitter so a tenant's backlog does not come back in one burst."""
    base = settings.NVKE_WEBHOOK_BUSY_RETRY_S
    wait = min(base * 2**busy_rounds, settings.NVKE_WEBHOOK_BUSY_RETRY_MAX_S)
    return wait * (1 + random.random() / 2)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def deliver_webhook(delivery_id: str, busy_rounds: int = 0) -> None:
    """Attempt ``delivery_id`` (quietly nothing when gone or finished); safe to run twice.
    ``busy_rounds``: how many times in a row its tenant was at its share of attempts."""
    try:
        wait = services.attempt_delivery(delivery_id)
    except services.TenantAtShare:
        deliver_webhook.apply_async(
            (delivery_id, busy_rounds + 1), countdown=busy_countdown_s(busy_rounds)
        )
        return
    if wait is not None:
        deliver_webhook.apply_async((delivery_id,), countdown=wait)
