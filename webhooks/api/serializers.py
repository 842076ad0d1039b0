"""Webhook endpoint and delivery serializers."""

from __future__ import annotations

from rest_framework import serializers

from webhooks.choices import EventType
from webhooks.models import WebhookDelivery, WebhookEndpoint


class WebhookEndpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "event_types", "description", "created_at", "updated_at"]


class WebhookEndpointCreateSerializer(serializers.Serializer):
    # checked by webhooks.targets alone: a second URL validator is a second parser, and two
    # parsers reading one URL differently is the SSRF this replaced
    url = serializers.CharField(max_length=2000, trim_whitespace=False)
    event_types = serializers.ListField(
        child=serializers.ChoiceField(
            choices=EventType.choices,
            # the refusal lists what is accepted, so nobody has to look it up
            error_messages={
                "invalid_choice": '"{input}" is not an event type; valid: '
                + ", ".join(EventType.values)
            },
        ),
        min_length=1,
        max_length=20,
    )
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)


class WebhookEndpointCreatedSerializer(WebhookEndpointSerializer):
    secret = serializers.CharField(help_text="Standard Webhooks secret (whsec_…), shown once")

    class Meta(WebhookEndpointSerializer.Meta):
        fields = [*WebhookEndpointSerializer.Meta.fields, "secret"]


class SecretSerializer(serializers.Serializer):
    secret = serializers.CharField(help_text="the new secret, shown once; the old one signs 24 h")


class WebhookDeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "endpoint_id",
            "event_id",
            "event_type",
            "status",
            "attempts",
            "log",
            "deadline",
            "created_at",
            "delivered_at",
            "event",
        ]
