"""``Idempotency-Key`` on POST: a retry with the same key and body within 24 h gets the first
response and does no work; the same key with another body answers 422.

Records live in PostgreSQL (:class:`nvke.models.IdempotencyRecord`), keyed per caller (a hash
of the Authorization header or session cookie), method, path and key. The first request claims
the key by inserting the row (a unique primary key, so two concurrent first requests cannot
both run: the second gets 409 ``idempotency_key_in_progress``, retryable). Responses of 5xx,
401, 403 and 429 are not kept, so a retry after them runs again. Secrets in a kept body
(an API key, a bootstrap token, a host credential) are redacted: they are shown once.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import HttpResponse
from django.utils import timezone

from .http import problem_response
from .models import IdempotencyRecord

TTL = timedelta(hours=24)
NOT_KEPT = {401, 403, 429}
KEPT_HEADERS = ("Location", "ETag")


def _sha(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()


class IdempotencyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        key = request.headers.get("Idempotency-Key")
        if request.method != "POST" or key is None or not request.path.startswith("/api/"):
            return self.get_response(request)
        if not 1 <= len(key) <= 255:
            return problem_response(
                400,
                "invalid_idempotency_key",
                "Idempotency-Key must be 1 to 255 characters",
                field="Idempotency-Key",
            )
        caller = request.headers.get("Authorization") or request.COOKIES.get(
            settings.SESSION_COOKIE_NAME, ""
        )
        scope = _sha(caller.encode(), request.method.encode(), request.path.encode(), key.encode())
        body_hash = _sha(request.body)
        replay = self._claim(scope, body_hash)
        if replay is not None:
            return replay
        try:
            response = self.get_response(request)
        except Exception:
            IdempotencyRecord.objects.filter(scope=scope, status__isnull=True).delete()
            raise
        if response.status_code >= 500 or response.status_code in NOT_KEPT:
            IdempotencyRecord.objects.filter(scope=scope).delete()
        else:
            IdempotencyRecord.objects.filter(scope=scope).update(
                status=response.status_code,
                content_type=response.get("Content-Type", ""),
                body=_without_secrets(response),
                headers={h: response[h] for h in KEPT_HEADERS if response.has_header(h)},
            )
        return response

    def _claim(self, scope: str, body_hash: str) -> HttpResponse | None:
        """None when this request owns the key now; otherwise the response to send."""
        for _ in range(2):
            try:
                with transaction.atomic():
                    IdempotencyRecord.objects.create(scope=scope, request_hash=body_hash)
                return None
            except IntegrityError:
                record = IdempotencyRecord.objects.filter(scope=scope).first()
                if record is None:
                    continue  # deleted in between: claim again
                if record.created_at < timezone.now() - TTL:
                    IdempotencyRecord.objects.filter(scope=scope).delete()
                    continue
                if record.request_hash != body_hash:
                    return problem_response(
                        422,
                        "idempotency_key_reused",
                        "this Idempotency-Key was used with a different request body",
                        field="Idempotency-Key",
                    )
                if record.status is None:
                    return problem_response(
                        409,
                        "idempotency_key_in_progress",
                        "a request with this Idempotency-Key is still running",
                        retryable=True,
                    )
                response = HttpResponse(
                    bytes(record.body or b""),
                    status=record.status,
                    content_type=record.content_type or "application/json",
                )
                for name, value in record.headers.items():
                    response[name] = value
                response["Idempotent-Replayed"] = "true"
                return response
        return problem_response(409, "idempotency_key_in_progress", "try again", retryable=True)


def _without_secrets(response) -> bytes:
    """The body to keep: secrets shown once (API keys, bootstrap tokens, credentials) are
    redacted, so a replay never shows them a second time and the table never holds them."""
    from tenants.audit import REDACTED, redact

    body = bytes(response.content)
    if not response.get("Content-Type", "").startswith(("application/json", "application/problem")):
        return body
    try:
        data = json.loads(body or b"null")
    except ValueError:
        return body
    cleaned = redact(data)
    if cleaned == data:
        return body
    if isinstance(cleaned, dict):
        cleaned["secrets_redacted"] = f"secret fields are shown once; a replay shows {REDACTED}"
    return json.dumps(cleaned).encode()
