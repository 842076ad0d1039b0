"""Tenant, member, API key, quota and audit serializers."""

from __future__ import annotations

from rest_framework import serializers

from nvke.validation import BoundedDateTimeField
from tenants.choices import Role
from tenants.models import ApiKey, AuditEvent, Membership, Tenant

NAME = r"^[a-z0-9]([-a-z0-9]{0,98}[a-z0-9])?$"


class TenantSerializer(serializers.ModelSerializer):
    name = serializers.RegexField(
        NAME,
        max_length=100,
        error_messages={"invalid": "name must be lower-case letters, digits and '-'"},
    )

    class Meta:
        model = Tenant
        fields = ["id", "name", "created_at"]


class ApiKeySerializer(serializers.ModelSerializer):
    tenant = serializers.UUIDField(source="tenant_id", read_only=True, allow_null=True)

    class Meta:
        model = ApiKey
        fields = [
            "prefix",
            "name",
            "role",
            "tenant",
            "is_operator",
            "created",
            "expiry_date",
            "revoked",
            "last_used_at",
        ]
        read_only_fields = fields


class ApiKeyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=50)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.ADMIN)
    expiry_date = BoundedDateTimeField(required=False, allow_null=True)


class MemberSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)
    email = serializers.CharField(source="user.email", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "email", "role", "created_at"]


class MemberCreateSerializer(serializers.Serializer):
    username = serializers.RegexField(r"^[\w.@+-]{1,150}$", max_length=150)
    email = serializers.EmailField(required=False, allow_blank=True, default="")
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class MemberRoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class QuotaLimitsSerializer(serializers.Serializer):
    max_clusters = serializers.IntegerField(min_value=0, max_value=100_000, required=False)
    max_nodes = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False)
    max_gpus = serializers.DictField(
        child=serializers.IntegerField(min_value=0, max_value=10_000_000), required=False
    )


class AuditEventSerializer(serializers.ModelSerializer):
    """An audit event; ``id`` is its public UUID, never the serial (:mod:`nvke.public_ids`)."""

    id = serializers.UUIDField(source="public_id", read_only=True)
    tenant = serializers.UUIDField(source="tenant_id", read_only=True, allow_null=True)

    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "ts",
            "tenant",
            "actor",
            "action",
            "target_type",
            "target_id",
            "request_id",
            "source_ip",
            "before",
            "after",
        ]


class QuotaResourceSerializer(serializers.Serializer):
    """One resource of a quota: the limit, what live specs reserve, what is held now."""

    limit = serializers.IntegerField()
    reserved = serializers.IntegerField()
    in_use = serializers.IntegerField()


class QuotaSerializer(serializers.Serializer):
    """Shape of ``GET /quotas`` entries (documentation only: views build the dict)."""

    tenant = serializers.UUIDField()
    clusters = QuotaResourceSerializer()
    nodes = QuotaResourceSerializer()
    gpus = serializers.DictField(child=QuotaResourceSerializer())
    default_gpu_limit_per_model = serializers.IntegerField()
