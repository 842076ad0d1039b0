"""The one tenant-scoping helper (DESIGN §7).

Every queryset of a tenant-owned model is reached through :func:`scope_queryset`. A model opts
in by declaring ``tenant_path`` (the lookup from the model to its ``Tenant``, e.g. ``"tenant"``).
Operators see every tenant; a tenant principal sees its own rows only, so another tenant's
object answers 404 exactly like a missing one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.db import models

if TYPE_CHECKING:  # a type only: the helper reads ``is_operator`` and ``tenant`` (DESIGN §2)
    from tenants.principal import Principal

M = TypeVar("M", bound=models.Model)


def scope_queryset(queryset: models.QuerySet[M], principal: Principal) -> models.QuerySet[M]:
    """Filter ``queryset`` to what ``principal`` may see.

    Raises ImproperlyConfigured when the model has no ``tenant_path`` (it is not tenant-owned
    and must not be served through a tenant-scoped view).
    """
    path = getattr(queryset.model, "tenant_path", None)
    if path is None:
        raise ImproperlyConfigured(f"{queryset.model.__name__} declares no tenant_path")
    if principal.is_operator:
        return queryset
    if principal.tenant is None:
        return queryset.none()
    return queryset.filter(**{path: principal.tenant})


def get_scoped_or_404(queryset: models.QuerySet[M], principal: Principal, **lookup) -> M:
    """Fetch one object through the scope; missing and foreign objects both raise 404."""
    from nvke.errors import NotFound

    try:
        return scope_queryset(queryset, principal).get(**lookup)
    except (queryset.model.DoesNotExist, ValueError, models.ObjectDoesNotExist) as exc:
        raise NotFound() from exc
