"""CloudEvents (structured JSON, the ``cloudevents`` library) signed per Standard Webhooks
(the ``standardwebhooks`` library): headers ``webhook-id`` (the event id), ``webhook-timestamp``
(Unix seconds) and ``webhook-signature`` (``v1,<base64 HMAC-SHA256>``, one per valid secret,
space-separated, so a receiver holding either secret verifies during a rotation)."""

from __future__ import annotations

import base64
import secrets
import uuid
from datetime import datetime
from typing import Any

from cloudevents.v1.conversion import to_structured
from cloudevents.v1.http import CloudEvent
from standardwebhooks.webhooks import Webhook

from .choices import CLOUDEVENT_TYPE_PREFIX


def new_secret() -> str:
    """``whsec_`` + base64 of 32 random bytes (the Standard Webhooks secret format)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def build_event(event_type: str, *, source: str, subject: str, data: dict[str, Any]) -> dict:
    """The CloudEvent as its structured JSON object (``specversion``, ``id``, ``type`` …)."""
    import json

    event = CloudEvent(
        {
            "type": CLOUDEVENT_TYPE_PREFIX + event_type,
            "source": source,
            "subject": subject,
            "id": str(uuid.uuid4()),
        },
        data,
    )
    _headers, body = to_structured(event)
    return json.loads(body)


def signed_request(event: dict, secrets_: list[str], at: datetime) -> tuple[dict, bytes]:
    """(headers, body) of one delivery attempt of ``event`` signed with each secret."""
    import json

    body = json.dumps(event, separators=(",", ":"), sort_keys=True).encode()
    signatures = [Webhook(s).sign(event["id"], at, body.decode()) for s in secrets_]
    headers = {
        "Content-Type": "application/cloudevents+json",
        "webhook-id": event["id"],
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": " ".join(signatures),
        "User-Agent": "nvke-webhooks/1",
    }
    return headers, body
