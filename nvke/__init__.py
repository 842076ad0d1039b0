"""NVKE project package: settings, Celery app, root URLs and the shared API bases."""

from .celery import app as celery_app

__all__ = ["celery_app"]
