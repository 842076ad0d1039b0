"""Webhook use-cases: register, rotate a secret, emit an event, deliver one attempt, redeliver.

Delivery is at-least-once: a delivery row is written in the transaction of the change that
caused it and its task is enqueued on commit; an attempt that gets no 2xx is retried with
exponential backoff (``NVKE_WEBHOOK_BACKOFF_S`` x 2^(n-1), at most ``NVKE_WEBHOOK_BACKOFF_MAX_S``)
until ``deadline`` (created + ``NVKE_WEBHOOK_DEADLINE_S``), then FAILED. Receivers deduplicate
on ``webhook-id``.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import requests
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from nvke import crypto

from .events import build_event, new_secret, signed_request
from .models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from .targets import check_target

ROTATION_OVERLAP = timedelta(hours=24)


def register_endpoint(
    *, tenant, url: str, event_types: list[str], description: str = ""
) -> tuple[WebhookEndpoint, str]:
    """Create an endpoint; returns it and its secret (shown once). Raises InvalidInput
    ``webhook_target_not_allowed``."""
    check_target(url)
    secret = new_secret()
    endpoint = WebhookEndpoint.objects.create(
        tenant=tenant,
        url=url,
        event_types=sorted(set(event_types)),
        description=description,
        secret_encrypted=crypto.encrypt(secret),
    )
    return endpoint, secret


def rotate_secret(endpoint: WebhookEndpoint) -> str:
    """A new secret (returned, shown once); the old one keeps signing for 24 h."""
    secret = new_secret()
    endpoint.previous_secret_encrypted = endpoint.secret_encrypted
    endpoint.previous_secret_expires_at = timezone.now() + ROTATION_OVERLAP
    endpoint.secret_encrypted = crypto.encrypt(secret)
    endpoint.save()
    return secret


def signing_secrets(endpoint: WebhookEndpoint, now) -> list[str]:
    out = [crypto.decrypt(endpoint.secret_encrypted)]
    expires = endpoint.previous_secret_expires_at
    if endpoint.previous_secret_encrypted and expires and expires > now:
        out.append(crypto.decrypt(endpoint.previous_secret_encrypted))
    return out


def emit(
    *, tenant_id, event_type: str, source: str, subject: str, data: dict[str, Any]
) -> list[WebhookDelivery]:
    """One delivery per endpoint of the tenant subscribed to ``event_type`` (in the caller's
    transaction; tasks enqueued on commit)."""
    endpoints = WebhookEndpoint.objects.filter(tenant_id=tenant_id)
    endpoints = [e for e in endpoints if event_type in e.event_types]
    if not endpoints:
        return []
    data = json.loads(json.dumps(data, cls=DjangoJSONEncoder))  # UUIDs, datetimes, Decimals
    event = build_event(event_type, source=source, subject=subject, data=data)
    deadline = timezone.now() + timedelta(seconds=settings.NVKE_WEBHOOK_DEADLINE_S)
    made = []
    with transaction.atomic():  # a savepoint: a failure here never breaks the caller's tx
        made = _create_deliveries(tenant_id, endpoints, event_type, event, deadline)
    return made


def _create_deliveries(tenant_id, endpoints, event_type, event, deadline):
    from .tasks import deliver_webhook

    made = []
    for endpoint in endpoints:
        delivery = WebhookDelivery.objects.create(
            tenant_id=tenant_id,
            endpoint=endpoint,
            event_id=event["id"],
            event_type=event_type,
            event=event,
            deadline=deadline,
        )
        transaction.on_commit(lambda pk=delivery.pk: deliver_webhook.delay(str(pk)))
        made.append(delivery)
    return made


def backoff_s(attempts: int) -> float:
    """Seconds before attempt ``attempts + 1``: base x 2^(attempts-1), capped."""
    base = settings.NVKE_WEBHOOK_BACKOFF_S
    return min(base * 2 ** max(attempts - 1, 0), settings.NVKE_WEBHOOK_BACKOFF_MAX_S)


def attempt_delivery(delivery_id) -> float | None:
    """One attempt; returns the seconds until the next one, or None when none is due
    (delivered, failed for good, or the row is gone). The row lock makes two workers holding
    the same message (at-least-once) attempt one after the other, never both at once."""
    with transaction.atomic():
        delivery = (
            WebhookDelivery.objects.select_for_update(skip_locked=True)
            .select_related("endpoint")
            .filter(pk=delivery_id, status=DeliveryStatus.PENDING)
            .first()
        )
        if delivery is None:
            return None
        now = timezone.now()
        entry: dict[str, Any] = {"at": now.isoformat(), "status_code": None, "error": ""}
        started = time.monotonic()
        try:
            check_target(delivery.endpoint.url)
            headers, body = signed_request(
                delivery.event, signing_secrets(delivery.endpoint, now), now
            )
            resp = requests.post(
                delivery.endpoint.url,
                data=body,
                headers=headers,
                timeout=settings.NVKE_WEBHOOK_TIMEOUT_S,
                allow_redirects=False,
            )
            entry["status_code"] = resp.status_code
            ok = 200 <= resp.status_code < 300
            if not ok:
                entry["error"] = f"HTTP {resp.status_code}"
        except Exception as exc:  # network errors and refused targets alike: log, retry
            ok = False
            entry["error"] = str(getattr(exc, "detail", exc))[:500]
        entry["duration_ms"] = round((time.monotonic() - started) * 1000)
        delivery.attempts += 1
        delivery.log = [*delivery.log, entry]
        wait = None
        if ok:
            delivery.status = DeliveryStatus.DELIVERED
            delivery.delivered_at = timezone.now()
        else:
            wait = backoff_s(delivery.attempts)
            if now + timedelta(seconds=wait) > delivery.deadline:
                delivery.status = DeliveryStatus.FAILED
                wait = None
        delivery.save(update_fields=["attempts", "log", "status", "delivered_at"])
    return wait


def redeliver(delivery: WebhookDelivery) -> WebhookDelivery:
    """Send the same event (same ``webhook-id``) again as a new delivery with a fresh deadline."""
    from .tasks import deliver_webhook

    with transaction.atomic():
        again = WebhookDelivery.objects.create(
            tenant_id=delivery.tenant_id,
            endpoint=delivery.endpoint,
            event_id=delivery.event_id,
            event_type=delivery.event_type,
            event=delivery.event,
            deadline=timezone.now() + timedelta(seconds=settings.NVKE_WEBHOOK_DEADLINE_S),
        )
        transaction.on_commit(lambda: deliver_webhook.delay(str(again.pk)))
    return again
