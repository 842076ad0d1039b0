"""Tenant use-cases."""

from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError, transaction

from nvke.errors import Conflict

from .choices import Role
from .models import ApiKey, Tenant


def create_tenant(*, name: str) -> Tenant:
    """Create a tenant; Conflict ``duplicate_tenant_name`` when the name is taken."""
    try:
        with transaction.atomic():
            return Tenant.objects.create(name=name)
    except IntegrityError as exc:
        raise Conflict(
            f"tenant {name!r} already exists", code="duplicate_tenant_name", field="name"
        ) from exc


def create_api_key(
    *,
    tenant: Tenant | None,
    name: str,
    role: Role = Role.ADMIN,
    expiry_date: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Create an API key; returns ``(row, plain key)`` — the plain key is never stored.

    ``tenant=None`` creates an operator key.
    """
    return ApiKey.objects.create_key(
        tenant=tenant,
        name=name,
        role=role,
        is_operator=tenant is None,
        expiry_date=expiry_date,
    )
