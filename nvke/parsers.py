"""JSON parsing that answers 400 for pathological input instead of crashing.

* Python's json module recurses once per nesting level: a body of 100,000 ``[`` raises
  RecursionError, which DRF's JSONParser would let through as a 500;
* a string with NUL (``\\u0000``) or a lone surrogate (``\\ud800``) parses, then fails in
  PostgreSQL (text and jsonb refuse both): 400 ``invalid_character`` naming the field;
* ``NaN``/``Infinity`` are refused by DRF's strict JSON (``STRICT_JSON``, on by default).
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from .validation import find_bad_text


def reject_bad_text(data: Any) -> None:
    """400 ``invalid_character`` (field: the path) for a string PostgreSQL cannot store."""
    where = find_bad_text(data)
    if where is not None:
        from .errors import InvalidInput  # not at import: nvke.errors imports DRF's views

        raise InvalidInput(
            f"{where or 'body'}: text may not contain NUL or lone surrogates",
            code="invalid_character",
            field=where or None,
        )


class SafeJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):  # type: ignore[override]
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON parse error - nested too deeply") from exc
        reject_bad_text(data)
        return data
