"""Celery tasks of the reservations app (thin: the work is in :mod:`reservations.lifecycle`)."""

from __future__ import annotations

from celery import shared_task

from .lifecycle import sweep


@shared_task(acks_late=True, ignore_result=True)
def sweep_reservations() -> dict[str, int]:
    """Announce, end and settle reservations (beat, every minute). Safe to run twice."""
    return sweep()
