"""List pagination.

* Default: ``?limit=&offset=`` (limit 1..500, default 50; offset 0..1,000,000),
  ``{count, next, previous, results}``. A limit or offset that is not an ASCII integer in range
  is a 400 ``invalid_number`` / ``number_out_of_range`` naming ``limit`` or ``offset`` (DRF would
  silently fall back, and an offset past PostgreSQL's bigint was a 500).
  The count query is skipped where the page tells the count: the page is read with one row
  more than ``limit``, and when that row is not there (the list ends on this page) and the
  page is not empty (or the offset is 0), ``count`` is ``offset`` + the rows read. A list of
  at most ``limit`` rows — most tenants' clusters, a cluster's node pools — is then one query.
* :class:`SafeCursorPagination`: DRF's cursor pagination with signed cursors: DRF's are plain
  base64 of ``o=&r=&p=``, so a client could hand-build any position or offset (and ``!!!``
  decoded to the first page). Here each cursor carries an HMAC (``django.core.signing``, salted,
  keyed by ``SECRET_KEY``); one the API did not issue — altered, hand-built, not base64, NUL
  bytes — is a 400 ``invalid_cursor`` naming ``cursor`` and never reaches the database.
"""

from __future__ import annotations

import binascii
from base64 import b64decode, b64encode
from urllib import parse

from django.core import signing
from rest_framework.pagination import Cursor, CursorPagination, LimitOffsetPagination
from rest_framework.utils.urls import replace_query_param

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

    def paginate_queryset(self, queryset, request, view=None):  # type: ignore[override]
        """DRF's page of ``queryset`` (a list of rows, or None without a limit), with
        ``self.count`` from the page where the page ends the list (module docstring)."""
        self.request = request
        self.limit = self.get_limit(request)
        if self.limit is None:
            return None
        self.offset = self.get_offset(request)
        rows = list(queryset[self.offset : self.offset + self.limit + 1])
        if len(rows) <= self.limit and (rows or self.offset == 0):
            self.count = self.offset + len(rows)
        else:  # a later page exists, or the offset is past the end
            self.count = self.get_count(queryset)
        if self.count > self.limit and self.template is not None:
            self.display_page_controls = True
        return rows[: self.limit]


class SafeCursorPagination(CursorPagination):
    """Cursor pagination over a datetime first ordering field (e.g. ``("-ts", "-id")``), with
    cursors signed by the API (module docstring)."""

    offset_cutoff = 1000
    signer = signing.Signer(salt="nvke.pagination.cursor")

    def encode_cursor(self, cursor: Cursor) -> str:
        """The page URL for ``cursor``: DRF's ``o``/``r``/``p`` tokens, base64, signed."""
        tokens = {}
        if cursor.offset:
            tokens["o"] = str(cursor.offset)
        if cursor.reverse:
            tokens["r"] = "1"
        if cursor.position is not None:
            tokens["p"] = cursor.position
        encoded = b64encode(parse.urlencode(tokens).encode("ascii")).decode("ascii")
        return replace_query_param(
            self.base_url, self.cursor_query_param, self.signer.sign(encoded)
        )

    def decode_cursor(self, request) -> Cursor | None:  # type: ignore[override]
        raw = request.query_params.get(self.cursor_query_param)
        if raw is None:
            return None
        try:
            check_text(raw)
            query = b64decode(self.signer.unsign(raw).encode("ascii"), validate=True)
            tokens = parse.parse_qs(query.decode("ascii"), keep_blank_values=True)
            offset = min(int(tokens.get("o", ["0"])[0]), self.offset_cutoff)
            reverse = tokens.get("r", ["0"])[0] == "1"
            position = tokens.get("p", [None])[0]
            if offset < 0:
                raise ValueError(offset)
            if position is not None:
                check_text(position)
                parse_aware_datetime(position)
        except (signing.BadSignature, BadValue, UnicodeError, ValueError, binascii.Error) as exc:
            raise InvalidInput(
                "the cursor is not one this API issued", code="invalid_cursor", field="cursor"
            ) from exc
        return Cursor(offset=offset, reverse=reverse, position=position)

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
