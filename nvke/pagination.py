"""List pagination.

* Default: ``?limit=&offset=`` (limit 1..500, default 50; offset 0..1,000,000),
  ``{count, next, previous, results}``. A limit or offset that is not an ASCII integer in range
  is a 400 ``invalid_number`` / ``number_out_of_range`` naming ``limit`` or ``offset`` (DRF would
  silently fall back, and an offset past PostgreSQL's bigint was a 500).
* :class:`SafeCursorPagination`: DRF's cursor pagination, but a forged cursor (not base64, a
  position that is not a value of the ordering field, NUL bytes) is a 400 ``invalid_cursor``
  naming ``cursor`` instead of reaching the database.
"""

from __future__ import annotations

from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination, LimitOffsetPagination

from .errors import InvalidInput
from .validation import BadValue, check_text, parse_aware_datetime, parse_int

MAX_OFFSET = 1_000_000


class DefaultPagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = 500

    def _param(self, request, name: str, low: int, high: int, default: int) -> int:
        raw = request.query_params.get(name)
        if raw is None or raw == "":
            return default
        try:
            return parse_int(raw, low=low, high=high)
        except BadValue as exc:
            raise InvalidInput(f"{name}: {exc}", code=exc.code, field=name) from exc

    def get_limit(self, request) -> int:  # type: ignore[override]
        return self._param(request, self.limit_query_param, 1, self.max_limit, self.default_limit)

    def get_offset(self, request) -> int:  # type: ignore[override]
        return self._param(request, self.offset_query_param, 0, MAX_OFFSET, 0)


class SafeCursorPagination(CursorPagination):
    """Cursor pagination over a datetime first ordering field (e.g. ``("-ts", "-id")``)."""

    offset_cutoff = 1000

    def decode_cursor(self, request) -> Cursor | None:  # type: ignore[override]
        try:
            cursor = super().decode_cursor(request)
            if cursor is not None and cursor.position is not None:
                check_text(cursor.position)
                parse_aware_datetime(cursor.position)
        except (NotFound, BadValue, UnicodeError) as exc:
            raise InvalidInput(
                "the cursor is not one this API issued", code="invalid_cursor", field="cursor"
            ) from exc
        return cursor

    def get_page_size(self, request) -> int:  # type: ignore[override]
        raw = request.query_params.get(self.page_size_query_param or "")
        if not raw:
            return self.page_size
        try:
            return parse_int(raw, low=1, high=self.max_page_size or self.page_size)
        except BadValue as exc:
            raise InvalidInput(
                f"{self.page_size_query_param}: {exc}",
                code=exc.code,
                field=self.page_size_query_param,
            ) from exc
