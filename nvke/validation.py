"""Validation at the edge: the checks every entry point (API bodies, query parameters, agent
reports, portal forms) shares, so that bad input is a 400 naming the field, never a 500.

What goes wrong without them (each found by an outside probe):

* datetimes far from now (``0001-01-01T00:00:00+05:00``, ``9999-12-31T23:59:59-05:00``) parse,
  then overflow when converted to UTC or reach PostgreSQL out of range;
* NUL bytes (``\\x00``) and lone surrogates (``\\ud800``) in text: PostgreSQL refuses both in
  ``text`` and ``jsonb`` (psycopg raises before the query is sent);
* ``NaN``/``Infinity`` parse as floats and break JSON rendering and comparisons;
* integers beyond a column's type wrap (binary COPY) or fail in the database;
* ``int()`` takes non-ASCII digits (``"١٢"`` is 12, ``"²"`` raises) where a check used
  ``str.isdigit``.

Error codes (``code`` of the problem+json): ``invalid_datetime``, ``datetime_out_of_range``,
``invalid_character``, ``invalid_number``, ``number_out_of_range``.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime
from rest_framework import serializers

#: the datetimes NVKE accepts from clients (UTC): far enough for any real schedule or query,
#: near enough that arithmetic (``end - 30 days``, time-zone conversion) can never overflow.
DATETIME_MIN = datetime(1970, 1, 1, tzinfo=UTC)
DATETIME_MAX = datetime(2200, 1, 1, tzinfo=UTC)

#: PostgreSQL column types' integer ranges
INT4 = (-(2**31), 2**31 - 1)
INT8 = (-(2**63), 2**63 - 1)

_ASCII_INT = re.compile(r"[+-]?[0-9]{1,19}")
_SPACE_OFFSET = re.compile(r"(?<=\d) (\d{2}(?::?\d{2})?)$")
_BAD_CHARS = re.compile(r"[\x00\ud800-\udfff]")


class BadValue(ValueError):
    """A value breaks an edge rule; ``code`` as in the module docstring."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


def to_utc(value: datetime) -> datetime:
    """An aware datetime in UTC within [DATETIME_MIN, DATETIME_MAX). Raises BadValue."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise BadValue("invalid_datetime", "give an RFC 3339 timestamp with a UTC offset")
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not DATETIME_MIN <= utc < DATETIME_MAX:
        raise BadValue(
            "datetime_out_of_range",
            f"timestamps must lie between {DATETIME_MIN:%Y-%m-%d} and {DATETIME_MAX:%Y-%m-%d}",
        )
    return utc


def parse_aware_datetime(value: Any) -> datetime:
    """``"2026-11-29T10:00:00Z"`` (RFC 3339, offset required) -> aware UTC datetime.

    A ``' '`` before the offset is read as ``'+'`` (an unescaped ``+`` in a query string).
    Raises BadValue ``invalid_datetime`` / ``datetime_out_of_range``.
    """
    if not isinstance(value, str) or not value or len(value) > 64:
        raise BadValue("invalid_datetime", "give an RFC 3339 timestamp with a UTC offset")
    text = _SPACE_OFFSET.sub(r"+\1", value.strip())
    try:
        parsed = parse_datetime(text)
    except (ValueError, OverflowError):
        parsed = None
    if parsed is None:
        raise BadValue(
            "invalid_datetime",
            "give an RFC 3339 timestamp with a UTC offset, e.g. 2026-11-29T10:00:00Z",
        )
    return to_utc(parsed)


def check_text(value: str) -> str:
    """``value`` unchanged, or BadValue ``invalid_character`` (NUL, lone surrogate)."""
    if _BAD_CHARS.search(value):
        raise BadValue("invalid_character", "text may not contain NUL or lone surrogates")
    return value


def find_bad_text(data: Any, path: str = "") -> str | None:
    """The dotted path of the first string (key or value) in a parsed JSON document that
    PostgreSQL cannot store (NUL, lone surrogate), or None. Linear in the document's size."""
    stack: list[tuple[str, Any]] = [(path, data)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if _BAD_CHARS.search(item):
                return where
        elif isinstance(item, dict):
            for key, value in item.items():
                name = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and _BAD_CHARS.search(key):
                    return name
                stack.append((name, value))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", value) for i, value in enumerate(item))
    return None


def parse_int(value: Any, *, low: int, high: int) -> int:
    """A query-parameter integer: ASCII digits only, within ``[low, high]``. Raises BadValue."""
    text = value.strip() if isinstance(value, str) else ""
    if not _ASCII_INT.fullmatch(text):
        raise BadValue("invalid_number", "give an integer (ASCII digits)")
    number = int(text)
    if not low <= number <= high:
        raise BadValue("number_out_of_range", f"must be between {low} and {high}")
    return number


def parse_float(value: Any, *, low: float, high: float) -> float:
    """A query-parameter number: finite (no NaN/Infinity), ASCII, within ``[low, high]``."""
    text = value.strip() if isinstance(value, str) else ""
    try:
        number = float(text) if text.isascii() and len(text) <= 32 else math.nan
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise BadValue("invalid_number", "give a finite number")
    if not low <= number <= high:
        raise BadValue("number_out_of_range", f"must be between {low:g} and {high:g}")
    return number


class StrictUUIDField(serializers.UUIDField):
    """DRF ``UUIDField`` that takes only a JSON string: DRF turns an integer into a UUID
    (``5`` -> ``00000000-0000-0000-0000-000000000005``), so ``"reservation": 5`` was looked up
    as that id. Any other type is the field's ``invalid`` error ("Must be a valid UUID.")."""

    def to_internal_value(self, data: Any):
        if not isinstance(data, str):
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


class BoundedDateTimeField(serializers.DateTimeField):
    """DRF ``DateTimeField`` that requires an offset and a time in the accepted range
    (``datetime_out_of_range`` instead of an overflow far in the past or future)."""

    default_error_messages = {
        "invalid_datetime": "give an RFC 3339 timestamp with a UTC offset",
        "datetime_out_of_range": "timestamps must lie between 1970-01-01 and 2200-01-01",
    }

    def to_internal_value(self, value: Any) -> datetime:
        if isinstance(value, datetime):
            candidate = value
        else:
            try:
                return parse_aware_datetime(value)
            except BadValue as exc:
                self.fail(exc.code)
        try:
            return to_utc(candidate)
        except BadValue as exc:
            self.fail(exc.code)
        raise AssertionError("unreachable")
