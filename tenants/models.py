"""Tenants, memberships and API keys.

A *tenant* is the unit of isolation and billing: every tenant-owned row carries a ``tenant``
foreign key and is only ever read through :func:`nvke.scoping.scope_queryset`.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from rest_framework_api_key.models import AbstractAPIKey, BaseAPIKeyManager

from .choices import Role


class Tenant(models.Model):
    """A customer of the GPU cloud (an AI team, a company)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A user's role in a tenant (a user may belong to several tenants)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_user_tenant_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.user_id}@{self.tenant_id}:{self.role}"


class ApiKeyManager(BaseAPIKeyManager):
    """Key lookups fetch the tenant in the same query."""

    def get_usable_keys(self):
        return self.filter(revoked=False).select_related("tenant")


class ApiKey(AbstractAPIKey):
    """An API key (``Authorization: Bearer <prefix>.<secret>``), stored hashed (SHA-512).

    Hashing and the ``prefix.secret`` format come from djangorestframework-api-key. A tenant
    key has a ``tenant`` and a ``role``; an operator key has ``is_operator=True`` and no
    tenant. The plain key is returned once, at creation.
    """

    objects = ApiKeyManager()

    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="api_keys"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.ADMIN)
    is_operator = models.BooleanField(default=False)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "API key"
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(is_operator=True, tenant__isnull=True)
                    | models.Q(is_operator=False, tenant__isnull=False)
                ),
                name="apikey_operator_xor_tenant",
            )
        ]
