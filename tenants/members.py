"""Membership use-cases: owners invite, remove and re-role members; the last owner stays."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from nvke.errors import Conflict, NotFound

from . import audit
from .choices import Role
from .models import Membership, Tenant
from .principal import Principal


def username_taken(username: str) -> Conflict:
    """The Conflict ``username_taken`` (field ``username``) for ``username``."""
    return Conflict(
        f"the username {username!r} is taken (usernames differ in more than letter case); "
        "choose another",
        code="username_taken",
        field="username",
    )


def check_username_free(username: str) -> None:
    """Usernames are unique whatever their letter case ("Alice" and "alice" would be two
    accounts a person cannot tell apart in a member list or an audit line): Conflict
    ``username_taken`` when a user of that name in any case exists. The unique index
    ``auth_user_username_ci_uniq`` (migration tenants.0005) holds it under concurrency; the
    callers turn its IntegrityError into the same Conflict (:func:`create_user`)."""
    if get_user_model().objects.filter(username__iexact=username).exists():
        raise username_taken(username)


def create_user(username: str, email: str = ""):
    """A new user ``username`` (not saved with a password: the caller sets one or marks it
    unusable and saves), inserted now; Conflict ``username_taken`` when the name exists in
    any letter case, also when a concurrent request inserted it first."""
    check_username_free(username)
    user = get_user_model()(username=username, email=email)
    user.set_unusable_password()
    try:
        with transaction.atomic():  # a savepoint: the caller's transaction stays usable
            user.save()
    except IntegrityError as exc:  # the case-insensitive unique index: a concurrent insert
        raise username_taken(username) from exc
    return user


def add_member(
    *, principal: Principal, tenant: Tenant, username: str, email: str, role: Role
) -> Membership:
    """Create a user in the tenant (without a usable password until they set one).

    Usernames are global and unique whatever their letter case: an existing user is never
    added by another tenant (Conflict ``username_taken``, also for a name that differs from an
    existing one only in case: that needs the user's consent, an invitation flow, and would
    expose the user). Raises Conflict ``already_member``.
    """
    User = get_user_model()
    with transaction.atomic():
        existing = User.objects.filter(username=username).first()
        if (
            existing is not None
            and Membership.objects.filter(user=existing, tenant=tenant).exists()
        ):
            raise Conflict(
                f"{username!r} is already a member", code="already_member", field="username"
            )
        user = create_user(username, email)
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
