"""The authenticated caller of a request.

Every request has a :class:`Principal`: a tenant principal (tenant + role) or an operator.
Views and services read it from ``request.user``; no view looks at API keys directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from .choices import ADMIN_ROLES, WRITE_ROLES, Role
from .models import Tenant


@dataclass(frozen=True)
class Principal:
    """Who is calling. ``tenant`` is None for operators (who see every tenant)."""

    tenant: Tenant | None
    role: Role
    is_operator: bool
    label: str  # "apikey:<prefix>" / "user:<username>", for audit and logs

    is_authenticated = True
    is_anonymous = False

    @property
    def can_write(self) -> bool:
        """True when the principal may create/change/delete tenant resources."""
        return self.is_operator or self.role in WRITE_ROLES

    @property
    def can_admin(self) -> bool:
        """True when the principal may manage keys and members of its tenant."""
        return self.is_operator or self.role in ADMIN_ROLES
