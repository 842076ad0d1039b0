"""Tenants, memberships and API keys.

A *tenant* is the unit of isolation and billing: every tenant-owned row carries a ``tenant``
foreign key and is only ever read through :func:`nvke.scoping.scope_queryset`.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from rest_framework_api_key.models import AbstractAPIKey, BaseAPIKeyManager

from nvke.public_ids import public_id_field

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


class Quota(models.Model):
    """Per-tenant limits and the reservations counted against them.

    Limits: ``max_clusters``, ``max_nodes`` and ``max_gpus`` (``{catalog slug: GPUs}``; a model
    not listed gets ``settings.NVKE_DEFAULT_MAX_GPUS_PER_MODEL``). ``reserved_*`` count what the
    tenant's live specs ask for (clusters, nodes, GPUs by model); they change only inside the
    transaction that creates, scales or deletes, under this row's lock (see
    :mod:`tenants.quotas`), so two concurrent requests can never both pass.
    """

    tenant = models.OneToOneField(
        Tenant, on_delete=models.CASCADE, primary_key=True, related_name="quota"
    )
    max_clusters = models.PositiveIntegerField()
    max_nodes = models.PositiveIntegerField()
    max_gpus = models.JSONField(default=dict, blank=True)
    reserved_clusters = models.PositiveIntegerField(default=0)
    reserved_nodes = models.PositiveIntegerField(default=0)
    reserved_gpus = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    tenant_path = "tenant"

    def __str__(self) -> str:
        return f"quota of {self.tenant_id}"


class AuditEvent(models.Model):
    """An immutable record of one mutation: who, what, on which target, before/after.

    ``before``/``after`` hold only the changed fields, with secrets redacted. Rows cannot be
    updated or deleted: a database trigger refuses it (see migration ``0003``).
    """

    id = models.BigAutoField(primary_key=True)
    #: what the API and the portal show as the event's ``id`` (:mod:`nvke.public_ids`)
    public_id = public_id_field()
    ts = models.DateTimeField(auto_now_add=True, db_index=True)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    actor = models.CharField(max_length=100)
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=32)
    target_id = models.CharField(max_length=64, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    source_ip = models.GenericIPAddressField(null=True, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    tenant_path = "tenant"

    class Meta:
        ordering = ["-ts", "-id"]
        indexes = [
            models.Index(fields=["tenant", "-ts"]),
            models.Index(fields=["target_type", "target_id"]),
            models.Index(fields=["actor", "-ts"]),
        ]

    def __str__(self) -> str:
        return f"{self.ts} {self.actor} {self.action} {self.target_type}/{self.target_id}"


class Invitation(models.Model):
    """A one-time link that lets a person join a tenant with a role.

    Only the SHA-256 of the link's token is stored (``token_hash``); the token itself is shown
    once to the owner who invited. A link is usable until ``expires_at``, once
    (``accepted_at``), and not after an owner revoked it (``revoked_at``). Every step is an
    :class:`AuditEvent` (``member.invite``, ``member.invite.accept``, ``member.invite.revoke``).
    """

    tenant_path = "tenant"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField(max_length=254)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    token_hash = models.CharField(max_length=64, unique=True)
    created_by = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "-created_at"])]

    def __str__(self) -> str:
        return f"invitation of {self.email} to {self.tenant_id} as {self.role}"
