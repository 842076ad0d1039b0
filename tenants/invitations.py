"""Invitations: an owner invites a person by a one-time link; the person joins by opening it,
either choosing a username and a password (checked by Django's ``AUTH_PASSWORD_VALIDATORS``)
or, already logged in, by consenting to join with their existing account.

The token is 32 random bytes (``secrets.token_urlsafe``, 43 characters); only its SHA-256 is
stored. A link works once, until it expires (:data:`TTL_CHOICES_H`, at most
:data:`MAX_TTL_H` hours) and unless revoked. Acceptance locks the invitation row
(``SELECT … FOR UPDATE``) so two concurrent uses cannot both succeed. All steps are audited.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from nvke.errors import Conflict, InvalidInput, NotFound

from . import audit, members
from .choices import Role
from .models import Invitation, Membership, Tenant
from .principal import Principal

#: the lifetimes an owner may pick (hours)
TTL_CHOICES_H = (24, 72, 168)
MAX_TTL_H = 168


def token_hash(token: str) -> str:
    """SHA-256 hex digest of a link token (what the database holds)."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Issued:
    """A new invitation and its token (the only time the token exists outside the link)."""

    invitation: Invitation
    token: str


def invite(
    *,
    principal: Principal,
    tenant: Tenant,
    email: str,
    role: Role,
    ttl_hours: int = 72,
    now: datetime | None = None,
) -> Issued:
    """Create an invitation. Raises InvalidInput ``invalid_ttl`` (outside 1..168 h) or
    ``role_too_high`` (an owner-only role is never given by a non-owner: checked by the
    caller's guard; here a principal below owner cannot invite an owner)."""
    now = now or timezone.now()
    if not 1 <= int(ttl_hours) <= MAX_TTL_H:
        raise InvalidInput(
            f"an invitation lives 1 to {MAX_TTL_H} hours", code="invalid_ttl", field="ttl_hours"
        )
    if role == Role.OWNER and not (principal.is_operator or principal.role == Role.OWNER):
        raise InvalidInput("only owners invite owners", code="role_too_high", field="role")
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        invitation = Invitation.objects.create(
            tenant=tenant,
            email=email,
            role=role,
            token_hash=token_hash(token),
            created_by=principal.label[:100],
            expires_at=now + timedelta(hours=int(ttl_hours)),
        )
        audit.record(
            actor=principal.label,
            action="member.invite",
            target_type="invitation",
            target_id=invitation.id,
            tenant=tenant,
            after={"email": email, "role": role, "expires_at": invitation.expires_at.isoformat()},
        )
    return Issued(invitation, token)


def usable(token: str, now: datetime | None = None) -> Invitation:
    """The invitation a token opens. Raises NotFound (unknown token)
    or Conflict ``invitation_used`` / ``invitation_expired`` / ``invitation_revoked``."""
    now = now or timezone.now()
    invitation = (
        Invitation.objects.select_related("tenant").filter(token_hash=token_hash(token)).first()
    )
    if invitation is None:
        raise NotFound("this invitation link is not valid")
    _check_open(invitation, now)
    return invitation


def _check_open(invitation: Invitation, now: datetime) -> None:
    if invitation.accepted_at is not None:
        raise Conflict("this invitation link was already used", code="invitation_used")
    if invitation.revoked_at is not None:
        raise Conflict("this invitation was revoked", code="invitation_revoked")
    if invitation.expires_at <= now:
        raise Conflict("this invitation link has expired", code="invitation_expired")


def accept(
    *,
    token: str,
    user=None,
    username: str = "",
    password: str = "",
    now: datetime | None = None,
) -> Membership:
    """Use the link: join as ``user`` (logged in, consenting) or as a new user ``username``
    with ``password`` (Django's password validators; InvalidInput ``invalid_password`` naming
    ``password``). Raises what :func:`usable` raises, Conflict ``username_taken`` /
    ``already_member``."""
    now = now or timezone.now()
    User = get_user_model()
    with transaction.atomic():
        invitation = (
            Invitation.objects.select_for_update()
            .select_related("tenant")
            .filter(token_hash=token_hash(token))
            .first()
        )
        if invitation is None:
            raise NotFound("this invitation link is not valid")
        _check_open(invitation, now)
        if user is None:
            members.check_username_free(username)
            try:
                validate_password(password, user=User(username=username, email=invitation.email))
            except ValidationError as exc:
                raise InvalidInput(
                    " ".join(exc.messages), code="invalid_password", field="password"
                ) from exc
            user = members.create_user(username, invitation.email)
            user.set_password(password)
            user.save(update_fields=["password"])
        elif Membership.objects.filter(user=user, tenant=invitation.tenant).exists():
            raise Conflict(
                f"you are already a member of {invitation.tenant.name}", code="already_member"
            )
        membership = Membership.objects.create(
            user=user, tenant=invitation.tenant, role=invitation.role
        )
        invitation.accepted_at = now
        invitation.accepted_by = user
        invitation.save(update_fields=["accepted_at", "accepted_by"])
        audit.record(
            actor=f"user:{user.username}",
            action="member.invite.accept",
            target_type="invitation",
            target_id=invitation.id,
            tenant=invitation.tenant,
            after={"username": user.username, "role": invitation.role},
        )
    return membership


def revoke(*, principal: Principal, tenant: Tenant, invitation_id, now=None) -> Invitation:
    """Revoke an open invitation of ``tenant``. Raises NotFound, Conflict ``invitation_used``."""
    now = now or timezone.now()
    with transaction.atomic():
        invitation = (
            Invitation.objects.select_for_update().filter(tenant=tenant, pk=invitation_id).first()
        )
        if invitation is None:
            raise NotFound("no such invitation")
        if invitation.accepted_at is not None:
            raise Conflict("this invitation was already used", code="invitation_used")
        if invitation.revoked_at is None:
            invitation.revoked_at = now
            invitation.save(update_fields=["revoked_at"])
            audit.record(
                actor=principal.label,
                action="member.invite.revoke",
                target_type="invitation",
                target_id=invitation.id,
                tenant=tenant,
                before={"email": invitation.email},
            )
    return invitation
