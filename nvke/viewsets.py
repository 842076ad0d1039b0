"""Base classes for API views: tenant scoping applied in one place."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import viewsets

from nvke.errors import InvalidInput
from nvke.etags import ETagMixin
from nvke.scoping import scope_queryset

#: the ``show_deleted`` query parameter's spellings (as DRF's BooleanField reads them)
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}

SHOW_DELETED = OpenApiParameter(
    "show_deleted",
    OpenApiTypes.BOOL,
    description="Also list DELETED objects (kept for history); hidden by default, as in the "
    "portal and nvkectl. A `phase` filter names the phase it wants and needs no flag.",
)


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


def show_deleted(request) -> bool:
    """The list's ``?show_deleted=`` flag (default False); raises InvalidInput (400, field
    ``show_deleted``) for a value that is not a boolean."""
    raw = (request.query_params.get("show_deleted") or "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise InvalidInput("show_deleted: must be true or false", code="invalid", field="show_deleted")


class HidesDeletedMixin:
    """A list that leaves out rows in phase DELETED (kept for history) unless the request asks
    ``?show_deleted=true`` or filters ``?phase=`` itself: what GKE's and EKS's list calls, the
    portal and nvkectl show. Detail routes still find a DELETED object by id.

    Subclasses are viewsets of a model with a ``phase`` field whose deleted value is
    ``"DELETED"``.
    """

    def get_queryset(self):  # type: ignore[override]
        qs = super().get_queryset()  # type: ignore[misc]
        request = self.request  # type: ignore[attr-defined]
        listing = self.action == "list"  # type: ignore[attr-defined]
        if listing and not request.query_params.get("phase") and not show_deleted(request):
            qs = qs.exclude(phase="DELETED")
        return qs
