"""Webhook endpoints of a tenant and the deliveries of events to them.

An endpoint names a URL, the event types it wants and a Standard Webhooks secret (encrypted
at rest; after a rotation the previous secret also signs until ``previous_secret_expires_at``).
A delivery is one CloudEvent for one endpoint; ``log`` lists every attempt
``[{at, status_code, error, duration_ms}]`` (status_code null when no HTTP answer came).
"""

from __future__ import annotations

import uuid

from django.db import models


class WebhookEndpoint(models.Model):
    tenant_path = "tenant"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    url = models.URLField(max_length=2000)
    event_types = models.JSONField(default=list, help_text="list of EventType values")
    description = models.CharField(max_length=200, blank=True)
    secret_encrypted = models.TextField()
    previous_secret_encrypted = models.TextField(blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return self.url


class DeliveryStatus(models.TextChoices):
    PENDING = "PENDING"
    DELIVERED = "DELIVERED"
    FAILED = "FAILED"


class WebhookDelivery(models.Model):
    tenant_path = "tenant"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    event_id = models.CharField(max_length=64, help_text="CloudEvents id = webhook-id")
    event_type = models.CharField(max_length=64)
    event = models.JSONField(help_text="the CloudEvent (structured JSON) as sent")
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    log = models.JSONField(default=list)
    deadline = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["endpoint", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.event_type} {self.event_id} -> {self.endpoint_id}"
