"""django-filter pieces with the edge checks of :mod:`nvke.validation`."""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms

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
