"""Portal lists: search, sort, filter choices taken from the rows' real values, pagination.

Built on django-filter (``FilterSet`` for the query-string filters and ``OrderingFilter`` for
the sort) and Django's ``Paginator``. The filter choices are the distinct values the caller's
own rows hold (already scoped by :func:`nvke.scoping.scope_queryset`), so a tenant is offered
only phases, regions or types that occur in its data. Bounds: a page holds :data:`PAGE_SIZE`
rows; the search text is at most :data:`MAX_SEARCH` characters (longer is a form error: the
filter is ignored and the page says why, never a 500).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import django_filters
from django.core.paginator import Page, Paginator
from django.db.models import Q, QuerySet
from django.http import HttpRequest

PAGE_SIZE = 25
MAX_SEARCH = 100


def choices_of(queryset: QuerySet, field: str) -> list[tuple[str, str]]:
    """``[(value, value)]`` of the distinct non-empty values of ``field`` in ``queryset``."""
    values = queryset.order_by().values_list(field, flat=True).distinct()
    return [(v, v) for v in sorted({str(v) for v in values if v not in (None, "")})]


class SearchFilter(django_filters.CharFilter):
    """``q``: case-insensitive substring over several fields (``search_fields``)."""

    def __init__(self, *args: Any, search_fields: tuple[str, ...], **kwargs: Any) -> None:
        kwargs.setdefault("max_length", MAX_SEARCH)
        kwargs.setdefault("label", "Search")
        super().__init__(*args, **kwargs)
        self.search_fields = search_fields

    def filter(self, qs: QuerySet, value: str) -> QuerySet:
        value = (value or "").strip()
        if not value:
            return qs
        query = Q()
        for name in self.search_fields:
            query |= Q(**{f"{name}__icontains": value})
        return qs.filter(query)


@dataclass
class Listing:
    """One page of a filtered, sorted list, with what the template needs to link pages."""

    filterset: django_filters.FilterSet
    page: Page
    query: dict[str, str]

    def url_with(self, **changes: Any) -> str:
        """The current query string with ``changes`` (None removes a key): ``?q=x&page=2``."""
        query = {**self.query, **{k: v for k, v in changes.items() if v is not None}}
        for key, value in changes.items():
            if value is None:
                query.pop(key, None)
        return "?" + urlencode({k: v for k, v in query.items() if v not in ("", None)})

    @property
    def sort(self) -> str:
        return self.query.get("sort", "")

    def sort_url(self, field: str) -> str:
        """Link of a column header: sorts by ``field``, or by ``-field`` when already by it."""
        return self.url_with(sort=("-" + field) if self.sort == field else field, page=None)


def paginate(request: HttpRequest, filterset: django_filters.FilterSet) -> Listing:
    """Apply ``filterset`` (invalid input: the unfiltered rows, the form shows the error) and
    cut the page named by ``?page=`` (out of range: the last page; not a number: the first)."""
    rows = filterset.qs if filterset.is_valid() else filterset.queryset
    paginator = Paginator(rows, PAGE_SIZE)
    page = paginator.get_page(request.GET.get("page"))
    query = {k: v for k, v in request.GET.items() if k not in ("fragment",)}
    return Listing(filterset=filterset, page=page, query=query)
