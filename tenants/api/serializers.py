"""Tenant and API key serializers."""

from __future__ import annotations

from rest_framework import serializers

from tenants.choices import Role
from tenants.models import ApiKey, Tenant


class TenantSerializer(serializers.ModelSerializer):
    name = serializers.RegexField(
        r"^[a-z0-9]([-a-z0-9]{0,98}[a-z0-9])?$",
        max_length=100,
        error_messages={"invalid": "name must be lower-case letters, digits and '-'"},
    )

    class Meta:
        model = Tenant
        fields = ["id", "name", "created_at"]


class ApiKeySerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiKey
        fields = [
            "prefix",
            "name",
            "role",
            "tenant",
            "created",
            "expiry_date",
            "revoked",
            "last_used_at",
        ]
        read_only_fields = fields


class ApiKeyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=50)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.ADMIN)
    expiry_date = serializers.DateTimeField(required=False, allow_null=True)
