"""Webhook use-cases: register, rotate a secret, emit an event, deliver one attempt, redeliver.

Delivery is at-least-once: a delivery row is written in the transaction of the change that
caused it and its task is enqueued on commit; an attempt that gets no 2xx is retried with
exponential backoff (``NVKE_WEBHOOK_BACKOFF_S`` x 2^(n-1), at most ``NVKE_WEBHOOK_BACKOFF_MAX_S``)
until ``deadline`` (created + ``NVKE_WEBHOOK_DEADLINE_S``), then FAILED. Receivers deduplicate
on ``webhook-id``.

Noisy neighbours: a tenant has at most ``NVKE_MAX_WEBHOOK_ENDPOINTS_PER_TENANT`` endpoints, an
attempt is bounded in time (:mod:`webhooks.transport`), and at most
``NVKE_WEBHOOK_TENANT_CONCURRENCY`` attempts of one tenant run at once (PostgreSQL advisory
locks held by the attempt's transaction, so a killed worker frees its slot with its
connection): a tenant whose endpoints hang holds that many of the ``webhooks`` worker's slots
and its other deliveries wait (:class:`TenantAtShare`), while other tenants' go on.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import structlog
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.utils import timezone

from nvke import crypto
from nvke.errors import ApiError, InvalidInput
from tenants.models import Tenant

from . import transport
from .events import build_event, new_secret, signed_request
from .models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from .targets import check_target

log = structlog.get_logger(__name__)

#: what a tenant reads in a delivery's log when no HTTP answer came (the details, which
#: would describe the operator's network, go to the worker's log only)
CONNECTION_FAILED = "delivery failed (connection)"
TARGET_REFUSED = "delivery failed (target not allowed)"


class TenantAtShare(Exception):
    """The tenant already runs ``NVKE_WEBHOOK_TENANT_CONCURRENCY`` attempts; try later."""


ROTATION_OVERLAP = timedelta(hours=24)


def register_endpoint(
    *, tenant, url: str, event_types: list[str], description: str = ""
) -> tuple[WebhookEndpoint, str]:
    """Create an endpoint; returns it and its secret (shown once). Raises InvalidInput
    ``webhook_target_not_allowed`` and ApiError 409 ``webhook_endpoint_limit`` (the tenant
    has ``NVKE_MAX_WEBHOOK_ENDPOINTS_PER_TENANT`` already; counted under the tenant's row
    lock, so two concurrent registrations cannot both pass the cap)."""
    check_target(url)
    secret = new_secret()
    limit = settings.NVKE_MAX_WEBHOOK_ENDPOINTS_PER_TENANT
    with transaction.atomic():
        Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
        if WebhookEndpoint.objects.filter(tenant=tenant).count() >= limit:
            raise ApiError(
                f"a tenant may have at most {limit} webhook endpoints "
                "(the operator's setting NVKE_MAX_WEBHOOK_ENDPOINTS_PER_TENANT); delete one first",
                code="webhook_endpoint_limit",
                status_code=409,
                extra={"setting": "NVKE_MAX_WEBHOOK_ENDPOINTS_PER_TENANT", "limit": limit},
            )
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
    *,
    tenant_id,
    event_type: str,
    source: str,
    subject: str,
    data: dict[str, Any] | Callable[[], dict[str, Any]],
) -> list[WebhookDelivery]:
    """One delivery per endpoint of the tenant subscribed to ``event_type`` (in the caller's
    transaction; tasks enqueued on commit). ``data`` may be a function that builds it: called
    only when an endpoint is subscribed (every finished operation emits; most tenants have
    no endpoint)."""
    endpoints = WebhookEndpoint.objects.filter(tenant_id=tenant_id)
    endpoints = [e for e in endpoints if event_type in e.event_types]
    if not endpoints:
        return []
    if callable(data):
        data = data()
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


def _slot_key(tenant_id, slot: int) -> int:
    digest = hashlib.blake2b(f"nvke.webhook-slot:{tenant_id}:{slot}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True)


def _take_tenant_slot(tenant_id) -> bool:
    """Take one of the tenant's attempt slots for the current transaction (released at its
    end, or when a killed worker's connection closes)."""
    with connection.cursor() as cursor:
        for slot in range(max(1, settings.NVKE_WEBHOOK_TENANT_CONCURRENCY)):
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_slot_key(tenant_id, slot)])
            if cursor.fetchone()[0]:
                return True
    return False


def attempt_delivery(delivery_id) -> float | None:
    """One attempt; returns the seconds until the next one, or None when none is due
    (delivered, failed for good, or the row is gone). The row lock makes two workers holding
    the same message (at-least-once) attempt one after the other, never both at once.
    Raises :class:`TenantAtShare` (nothing attempted) when the tenant's slots are all taken.

    The log entry a tenant sees says ``HTTP <status>``, :data:`CONNECTION_FAILED` or
    :data:`TARGET_REFUSED`; what went wrong in the network is logged for the operator."""
    with transaction.atomic():
        delivery = (
            WebhookDelivery.objects.select_for_update(skip_locked=True)
            .select_related("endpoint")
            .filter(pk=delivery_id, status=DeliveryStatus.PENDING)
            .first()
        )
        if delivery is None:
            return None
        if not _take_tenant_slot(delivery.tenant_id):
            raise TenantAtShare(str(delivery.tenant_id))
        now = timezone.now()
        entry: dict[str, Any] = {"at": now.isoformat(), "status_code": None, "error": ""}
        started = time.monotonic()
        try:
            target, addresses = check_target(delivery.endpoint.url)
            headers, body = signed_request(
                delivery.event, signing_secrets(delivery.endpoint, now), now
            )
            status_code = transport.post(
                target,
                addresses,
                body,
                headers,
                connect_s=settings.NVKE_WEBHOOK_CONNECT_TIMEOUT_S,
                read_s=settings.NVKE_WEBHOOK_TIMEOUT_S,
                attempt_s=settings.NVKE_WEBHOOK_ATTEMPT_TIMEOUT_S,
            )
            entry["status_code"] = status_code
            ok = 200 <= status_code < 300
            if not ok:
                entry["error"] = f"HTTP {status_code}"
        except InvalidInput as exc:
            ok = False
            entry["error"] = TARGET_REFUSED
            log.info("webhook_target_refused", delivery_id=str(delivery.id), reason=exc.detail)
        except Exception as exc:  # network errors of every kind: log for the operator, retry
            ok = False
            entry["error"] = CONNECTION_FAILED
            log.info("webhook_connection_failed", delivery_id=str(delivery.id), error=repr(exc))
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
