"""Shared infrastructure rows: idempotency records for ``Idempotency-Key`` on POST."""

from __future__ import annotations

from django.db import models


class IdempotencyRecord(models.Model):
    """The first response to a POST carrying an ``Idempotency-Key``.

    ``scope`` is a SHA-256 of the caller's credential, the method, the path and the key, so keys
    never collide across callers. ``request_hash`` is the SHA-256 of the body: a retry with the
    same key and body gets the stored response; with another body, 422. ``status`` is null
    while the first request is still running (a concurrent retry gets 409).
    """

    scope = models.CharField(max_length=64, primary_key=True)
    request_hash = models.CharField(max_length=64)
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    content_type = models.CharField(max_length=100, blank=True)
    body = models.BinaryField(null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return f"{self.scope[:12]} -> {self.status}"
