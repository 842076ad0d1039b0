"""Portal lists: search, sort, filter choices taken from the rows' real values, pagination.

Built on django-filter (``FilterSet`` for the query-string filters and ``OrderingFilter`` for
the sort) and Django's ``Paginator``. The filter choices are the distinct values the caller's
own rows hold (already scoped by :func:`nvke.scoping.scope_queryset`), so a tenant is offered
only phases, regions or types that occur in its data. Bounds: a page holds :data:`PAGE_SIZE`
rows; the search text is at most :data:`MAX_SEARCH` characters (longer is a form error: the
filter is ignored and the page says why, never a 500). A bad ``?page=`` (not written in the
digits 0-9, below 1, past the last page) or an unknown ``?sort=`` column is refused the same
way: :attr:`Listing.errors` says why and the view answers 400 (:attr:`Listing.status`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import django_filters
from django.core.paginator import Page, Paginator
from django.db.models import Q, QuerySet
from django.http import HttpRequest

PAGE_SIZE = 25
MAX_SEARCH = 100
#: longest bad value quoted back in a message (the rest is cut: a client-supplied size)
_QUOTE_MAX = 40


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


class SortFilter(django_filters.OrderingFilter):
    """``?sort=``: django-filter's ``OrderingFilter`` whose ties keep the list's own order
    (the ordering the view gave the queryset, e.g. newest first), so equal values never come
    back in whatever order PostgreSQL happens to return them."""

    def filter(self, qs: QuerySet, value: Any) -> QuerySet:
        if not value:
            return qs
        chosen = [self.get_ordering_value(param) for param in value]
        keys = {c.lstrip("-") for c in chosen}
        rest = [o for o in qs.query.order_by if str(o).lstrip("-") not in keys]
        return qs.order_by(*chosen, *rest)


def quoted(value: str) -> str:
    """``value`` as a message may quote it: at most :data:`_QUOTE_MAX` characters, control
    characters (NUL …) written as Python escapes (``'a\\x00b'``)."""
    cut = value[:_QUOTE_MAX] + ("…" if len(value) > _QUOTE_MAX else "")
    return f"“{cut}”" if cut.isprintable() else ascii(cut)


def page_number(raw: str | None, num_pages: int) -> tuple[int, str | None]:
    """``(number, None)`` for a valid ``?page=`` (absent or empty: 1), else ``(1, message)``.

    Valid: ASCII digits 0-9 only (``int()`` would also take ``"٣"`` or ``" 3"``), between 1
    and ``num_pages`` (an empty list has one, empty, page).
    """
    if raw is None or raw == "":
        return 1, None
    last = max(num_pages, 1)
    if not (raw.isascii() and raw.isdigit()):
        return 1, f"page {quoted(raw)} is not a whole number written in the digits 0-9"
    if len(raw) > 12 or not 1 <= int(raw) <= last:  # 12 digits: past any last page
        shown = raw if len(raw) <= 12 else quoted(raw)
        plural = "s" if last != 1 else ""
        return 1, f"page {shown} does not exist: this list has {last} page{plural}"
    number = int(raw)
    return number, None


def _sort_error(filterset: django_filters.FilterSet, raw: str) -> str:
    """The message for an unknown ``?sort=``: which columns the list sorts by."""
    names = list(filterset.filters["sort"].param_map)
    return (
        f"sort {quoted(raw)} is not a column of this list; sort by one of: "
        + ", ".join(names)
        + " (a leading - sorts descending)"
    )


@dataclass
class Listing:
    """One page of a filtered, sorted list, with what the template needs to link pages.

    ``errors``: the refusals of ``?sort=`` and ``?page=`` (the filter fields' own errors are
    on ``filterset.form``, shown next to each field); ``status`` is 400 when anything was
    refused, else 200.
    """

    filterset: django_filters.FilterSet
    page: Page
    query: dict[str, str]
    errors: list[str] = field(default_factory=list)

    @property
    def status(self) -> int:
        return 400 if self.errors or self.filterset.errors else 200

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
    """Apply ``filterset`` and cut the page named by ``?page=``.

    Invalid filter input: the unfiltered rows, the form shows the error next to its field; an
    unknown sort or a bad page: page 1, the message in :attr:`Listing.errors`. Either way
    :attr:`Listing.status` is 400 (the view answers with it), never a 500.
    """
    valid = filterset.is_valid()
    rows = filterset.qs if valid else filterset.queryset
    errors = []
    sort_refused = "sort" in filterset.form.errors
    if sort_refused:
        errors.append(_sort_error(filterset, request.GET.get("sort", "")))
        del filterset.form.errors["sort"]  # said once, in the list's own words
    paginator = Paginator(rows, PAGE_SIZE)
    number, page_error = page_number(request.GET.get("page"), paginator.num_pages)
    if page_error:
        errors.append(page_error)
    page = paginator.page(number)
    refused = {"fragment", *(["sort"] if sort_refused else [])}
    refused |= {"page"} if page_error else set()
    query = {k: v for k, v in request.GET.items() if k not in refused}
    return Listing(filterset=filterset, page=page, query=query, errors=errors)
