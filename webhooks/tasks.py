"""Celery task: one delivery attempt, requeued with backoff until delivered or past deadline."""

from __future__ import annotations

from celery import shared_task

from . import services


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def deliver_webhook(delivery_id: str) -> None:
    """Attempt ``delivery_id`` (quietly nothing when gone or finished); safe to run twice."""
    wait = services.attempt_delivery(delivery_id)
    if wait is not None:
        deliver_webhook.apply_async((delivery_id,), countdown=wait)
