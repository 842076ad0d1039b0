"""Base classes for API views: tenant scoping applied in one place."""

from __future__ import annotations

from rest_framework import viewsets

from nvke.etags import ETagMixin
from nvke.scoping import scope_queryset


class TenantScopedMixin(ETagMixin):
    """``get_queryset`` = the view's ``queryset`` passed through :func:`scope_queryset`.

    Also ``ETag`` on retrieve and ``If-Match`` (412) on changes, from :class:`ETagMixin`.

    Subclasses set ``queryset`` (never filtered by hand); the object lookup of detail routes
    therefore answers 404 for another tenant's object.
    """

    def get_queryset(self):  # type: ignore[override]
        return scope_queryset(super().get_queryset(), self.request.user)  # type: ignore[misc]


class TenantScopedReadOnlyViewSet(TenantScopedMixin, viewsets.ReadOnlyModelViewSet):
    """List + retrieve of a tenant-owned model."""
