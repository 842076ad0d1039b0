"""``Idempotency-Key`` on POST: a retry with the same key and body within 24 h gets the first
response and does no work; the same key with another body answers 422.

Records live in PostgreSQL (:class:`nvke.models.IdempotencyRecord`), keyed per caller (a hash
of the Authorization header or session cookie), method, path and key. Responses of 5xx, 401,
403 and 429 are not kept, so a retry after them runs again. Secrets in a kept body (an API
key, a bootstrap token, a host credential) are redacted: they are shown once.

Crash safety. The view runs inside one transaction with the record of its response, so they
commit together or not at all: a web process killed before the commit leaves nothing (a retry
runs the request), killed after it leaves the response (a retry gets it) — never applied
twice, never applied with its answer lost. Two requests with one key at once are told apart
by a transaction-level advisory lock on the key, held by the request's own database
connection: the second gets 409 ``idempotency_key_in_progress`` (retryable) while the first
runs, and the lock ends with the first's transaction — committed, rolled back, or its
connection closed by a killed process (PostgreSQL ends the backend of a dropped connection),
so a claim can never outlive its request. Before this, the claim was a row committed before
the view ran and never expired: gunicorn SIGKILLed mid-request left keys answering 409 for
24 h, and a retry could not learn whether the first attempt had been applied.

A 5xx answer rolls the view's writes back (an unexpected failure must not half-apply what a
retry will do again). Rows with a null ``status`` (claims of the old scheme) are taken as
never applied.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
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


def _lock_key(scope: str) -> int:
    """The advisory lock id of a scope: its first 8 bytes as a signed 64-bit integer."""
    return int.from_bytes(bytes.fromhex(scope[:16]), "big", signed=True)


class IdempotencyMiddleware:
    """Applies ``Idempotency-Key`` to POSTs under ``/api/`` (see the module docstring)."""

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
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_lock_key(scope)])
                (locked,) = cursor.fetchone()
            if not locked:
                return problem_response(
                    409,
                    "idempotency_key_in_progress",
                    "a request with this Idempotency-Key is still running",
                    retryable=True,
                )
            replay = self._replay(scope, body_hash)
            if replay is not None:
                return replay
            response = self.get_response(request)
            if response.status_code >= 500:
                transaction.set_rollback(True)
            elif response.status_code not in NOT_KEPT:
                IdempotencyRecord.objects.create(
                    scope=scope,
                    request_hash=body_hash,
                    status=response.status_code,
                    content_type=response.get("Content-Type", ""),
                    body=_without_secrets(response),
                    headers={h: response[h] for h in KEPT_HEADERS if response.has_header(h)},
                )
        return response

    def _replay(self, scope: str, body_hash: str) -> HttpResponse | None:
        """The response to send for a key already answered; None to run the request (the
        advisory lock is held: no other request of this key runs or commits meanwhile)."""
        record = IdempotencyRecord.objects.filter(scope=scope).first()
        if record is None:
            return None
        if record.status is None or record.created_at < timezone.now() - TTL:
            record.delete()  # expired, or an old-scheme claim whose request never committed
            return None
        if record.request_hash != body_hash:
            return problem_response(
                422,
                "idempotency_key_reused",
                "this Idempotency-Key was used with a different request body",
                field="Idempotency-Key",
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


def _without_secrets(response) -> bytes:
    """The body to keep: secrets shown once (API keys, bootstrap tokens, credentials) are
    redacted, so a replay never shows them a second time and the table never holds them."""
    from nvke.redaction import REDACTED
    from nvke.redaction import redact_keys as redact

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
