"""Membership use-cases: owners invite, remove and re-role members; the last owner stays."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction

from nvke.errors import Conflict, NotFound

from . import audit
from .choices import Role
from .models import Membership, Tenant
from .principal import Principal


def add_member(
    *, principal: Principal, tenant: Tenant, username: str, email: str, role: Role
) -> Membership:
    """Create a user in the tenant (without a usable password until they set one).

    Usernames are global: an existing user is never added by another tenant (Conflict
    ``username_taken``: that needs the user's consent, an invitation flow not built yet, and
    would expose the user). Raises Conflict ``already_member``.
    """
    User = get_user_model()
    with transaction.atomic():
        user, created = User.objects.get_or_create(username=username, defaults={"email": email})
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        elif Membership.objects.filter(user=user, tenant=tenant).exists():
            raise Conflict(
                f"{username!r} is already a member", code="already_member", field="username"
            )
        else:
            raise Conflict(
                f"the username {username!r} is taken; choose another",
                code="username_taken",
                field="username",
            )
        membership = Membership.objects.create(user=user, tenant=tenant, role=role)
        audit.record(
            actor=principal.label,
            action="member.add",
            target_type="member",
            target_id=user.username,
            tenant=tenant,
            after={"username": user.username, "role": role},
        )
    return membership


def _owners_locked(tenant: Tenant) -> int:
    Tenant.objects.select_for_update().get(pk=tenant.pk)  # serialise owner changes per tenant
    return Membership.objects.filter(tenant=tenant, role=Role.OWNER).count()


def change_role(*, principal: Principal, tenant: Tenant, username: str, role: Role) -> Membership:
    """Change a member's role. Raises NotFound, Conflict ``last_owner``."""
    with transaction.atomic():
        owners = _owners_locked(tenant)
        membership = _get(tenant, username)
        if membership.role == Role.OWNER and role != Role.OWNER and owners <= 1:
            raise Conflict("a tenant keeps at least one owner", code="last_owner", field="role")
        before = membership.role
        membership.role = role
        membership.save(update_fields=["role"])
        audit.record(
            actor=principal.label,
            action="member.change_role",
            target_type="member",
            target_id=username,
            tenant=tenant,
            before={"role": before},
            after={"role": role},
        )
    return membership


def remove_member(*, principal: Principal, tenant: Tenant, username: str) -> None:
    """Remove a member. Raises NotFound, Conflict ``last_owner``."""
    with transaction.atomic():
        owners = _owners_locked(tenant)
        membership = _get(tenant, username)
        if membership.role == Role.OWNER and owners <= 1:
            raise Conflict("the last owner cannot be removed", code="last_owner")
        membership.delete()
        audit.record(
            actor=principal.label,
            action="member.remove",
            target_type="member",
            target_id=username,
            tenant=tenant,
            before={"username": username, "role": membership.role},
        )


def _get(tenant: Tenant, username: str) -> Membership:
    membership = (
        Membership.objects.select_related("user")
        .filter(tenant=tenant, user__username=username)
        .first()
    )
    if membership is None:
        raise NotFound()
    return membership
