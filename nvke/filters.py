"""django-filter pieces with the edge checks of :mod:`nvke.validation`."""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django_filters.rest_framework import DjangoFilterBackend

from .validation import BadValue, parse_aware_datetime


class BoundedIsoDateTimeFormField(forms.CharField):
    """An RFC 3339 query parameter with an offset, inside the accepted range (UTC)."""

    def to_python(self, value: Any):  # type: ignore[override]
        text = super().to_python(value)
        if not text:
            return None
        try:
            return parse_aware_datetime(text)
        except BadValue as exc:
            raise forms.ValidationError(str(exc), code=exc.code) from exc


class BoundedIsoDateTimeFilter(django_filters.Filter):
    """``IsoDateTimeFilter`` that answers 400 ``datetime_out_of_range`` for year 0001/9999."""

    field_class = BoundedIsoDateTimeFormField


def _filter_names(view: Any) -> tuple[str, ...] | None:
    """The query parameter names a view's filters read (each also as a ``name_`` prefix:
    ``name__gte``, ``name_min``), cached per view class; None when a filter is required (the
    filter set must always run to answer its 400)."""
    cls = type(view)
    if cls in _NAMES:
        return _NAMES[cls]
    filterset_class = getattr(view, "filterset_class", None)
    names: tuple[str, ...] | None
    if filterset_class is not None:
        filters = filterset_class.base_filters
        required = any(flt.extra.get("required") for flt in filters.values())
        names = None if required else tuple(filters)
    else:
        names = tuple(getattr(view, "filterset_fields", None) or ())
    _NAMES[cls] = names
    return names


_NAMES: dict[type, tuple[str, ...] | None] = {}


class QuietFilterBackend(DjangoFilterBackend):
    """django-filter's backend, skipped when a request names none of the view's filters.

    A page without filters (``?limit=50``) would otherwise build a ``FilterSet`` class (for
    ``filterset_fields``), its form and every filter's form field, then filter by nothing: about
    a tenth of a list request's CPU. With no filter parameter every filter receives an empty
    value and returns the queryset unchanged, so skipping gives the same rows; a view with a
    required filter always runs it. Parameters and the OpenAPI schema are django-filter's.
    """

    def filter_queryset(self, request: Any, queryset: Any, view: Any) -> Any:
        names = _filter_names(view)
        if names is not None and not any(
            key == name or key.startswith(name + "_")
            for key in request.query_params
            for name in names
        ):
            return queryset
        return super().filter_queryset(request, queryset, view)
