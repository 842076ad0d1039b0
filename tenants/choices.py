"""Enumerations of the tenants app."""

from django.db import models


class Role(models.TextChoices):
    """Role of a principal inside a tenant (DESIGN §7), strongest first."""

    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


#: Roles that may change a tenant's resources (clusters, node pools).
WRITE_ROLES = frozenset({Role.OWNER, Role.ADMIN, Role.MEMBER})
#: Roles that may manage API keys and members.
ADMIN_ROLES = frozenset({Role.OWNER, Role.ADMIN})
