"""Tenant use-cases."""

from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from nvke.errors import ApiError, Conflict, InvalidInput, NotFound

from . import audit
from .choices import Role
from .models import ApiKey, Membership, Tenant
from .principal import Principal


def _a(word: str) -> str:
    """``"an admin"``, ``"a member"``."""
    return ("an " if str(word)[:1] in "aeiou" else "a ") + str(word)


#: strength of each role, for "a key may not outrank its creator"
ROLE_RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}


def create_tenant(*, name: str, principal: Principal | None = None) -> Tenant:
    """Create a tenant; Conflict ``duplicate_tenant_name`` when the name is taken."""
    try:
        with transaction.atomic():
            tenant = Tenant.objects.create(name=name)
            if principal is not None:
                audit.record(
                    actor=principal.label,
                    action="tenant.create",
                    target_type="tenant",
                    target_id=tenant.pk,
                    tenant=tenant,
                    after={"name": name},
                )
            return tenant
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


def issue_api_key(
    *,
    principal: Principal,
    tenant: Tenant | None,
    name: str,
    role: Role = Role.ADMIN,
    expiry_date: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Create a key on behalf of ``principal`` (audited). A tenant admin cannot mint a key
    stronger than its own role (403 ``role_too_high``); operator keys need an operator."""
    if tenant is None and not principal.is_operator:
        raise ApiError("operator keys are for operators", code="permission_denied", status_code=403)
    if not principal.is_operator and ROLE_RANK[Role(role)] > ROLE_RANK[principal.role]:
        raise ApiError(
            f"{_a(principal.role)} cannot create {_a(role)} key",
            code="role_too_high",
            field="role",
            status_code=403,
        )
    if expiry_date is not None and expiry_date <= timezone.now():
        raise InvalidInput(
            "expiry_date must be in the future", code="invalid_expiry", field="expiry_date"
        )
    with transaction.atomic():
        if tenant is not None:
            _check_api_key_cap(tenant)
        row, key = create_api_key(tenant=tenant, name=name, role=role, expiry_date=expiry_date)
        audit.record(
            actor=principal.label,
            action="apikey.create",
            target_type="apikey",
            target_id=row.prefix,
            tenant=tenant,
            after={"name": name, "role": role, "operator": tenant is None},
        )
    return row, key


def _check_api_key_cap(tenant: Tenant) -> None:
    """409 ``api_key_limit`` when ``tenant`` holds ``NVKE_MAX_API_KEYS_PER_TENANT`` usable
    keys (neither revoked nor expired). Counted under the tenant's row lock (the caller's
    transaction), so two concurrent creations cannot both pass the cap."""
    from django.conf import settings
    from django.db.models import Q

    limit = settings.NVKE_MAX_API_KEYS_PER_TENANT
    Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
    usable = ApiKey.objects.filter(tenant=tenant, revoked=False).filter(
        Q(expiry_date__isnull=True) | Q(expiry_date__gt=timezone.now())
    )
    if usable.count() >= limit:
        raise ApiError(
            f"a tenant may have at most {limit} API keys (the operator's setting "
            "NVKE_MAX_API_KEYS_PER_TENANT); revoke one first",
            code="api_key_limit",
            status_code=409,
            extra={"setting": "NVKE_MAX_API_KEYS_PER_TENANT", "limit": limit},
        )


def revoke_api_key(*, principal: Principal, tenant: Tenant | None, prefix: str) -> ApiKey:
    """Revoke a key (irreversible, audited). NotFound for a key outside ``tenant``."""
    with transaction.atomic():
        row = ApiKey.objects.select_for_update().filter(tenant=tenant, prefix=prefix).first()
        if row is None:
            raise NotFound()
        if not principal.is_operator and ROLE_RANK[Role(row.role)] > ROLE_RANK[principal.role]:
            raise ApiError(
                f"{_a(principal.role)} cannot revoke {_a(row.role)} key",
                code="role_too_high",
                status_code=403,
            )
        if (
            tenant is not None
            and row.role == Role.OWNER
            and not row.revoked
            and not Membership.objects.filter(tenant=tenant, role=Role.OWNER).exists()
            and ApiKey.objects.filter(tenant=tenant, role=Role.OWNER, revoked=False).count() <= 1
        ):
            raise Conflict(
                "this is the tenant's last owner credential (no owner member, no other owner key)",
                code="last_owner",
            )
        if tenant is None and row.is_operator and not row.revoked:
            # serialise revocations of operator keys: two concurrent revocations of the last
            # two keys would otherwise each see the other one still valid
            others = list(
                ApiKey.objects.select_for_update()
                .filter(is_operator=True, revoked=False)
                .exclude(pk=row.pk)
                .values_list("expiry_date", flat=True)
            )
            now = timezone.now()
            if not [e for e in others if e is None or e > now]:
                raise Conflict(
                    "this is the last valid operator key; create another one first",
                    code="last_operator_key",
                )
        if not row.revoked:
            row.revoked = True
            row.save(update_fields=["revoked"])
            audit.record(
                actor=principal.label,
                action="apikey.revoke",
                target_type="apikey",
                target_id=prefix,
                tenant=tenant,
                before={"revoked": False},
                after={"revoked": True},
            )
    return row
