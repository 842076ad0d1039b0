"""The API's JSON renderer: DRF's ``JSONRenderer`` output, encoded by orjson (issue 15: lists
at framework speed).

A page of 50 node pools with their nodes is about 60 kB of JSON; the standard library's
encoder (DRF's) took about a fifth of such a request's CPU time, orjson (already the agent
report parser's, ``fleet/api/parsers.py``) about a tenth of that. The bytes are DRF's compact,
UTF-8 form (``COMPACT_JSON``, ``UNICODE_JSON``): the same separators, key order and string
escapes, ``\\u2028``/``\\u2029`` escaped as DRF escapes them, and every type orjson does not
encode itself — datetimes (so that microseconds and ``Z`` are DRF's), ``Decimal``, lazy
strings, querysets, IP addresses, ``timedelta`` — handed to DRF's own
``JSONEncoder.default``. DRF's path is kept where the two would differ: a pretty-printed
response (``Accept: application/json; indent=4``), non-compact or ASCII-only settings, and data
orjson refuses (an integer beyond 64 bits). What remains different: a float in exponent form is
written ``1e16`` (orjson) rather than ``1e+16`` (Python), the same number; NaN/Infinity, which
DRF refuses with a server error, are written ``null``.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder

_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS
_default = JSONEncoder().default


def dumps(data: Any) -> bytes:
    """``data`` as the renderer writes it (compact UTF-8 JSON; ``orjson.Fragment`` values
    written as they are). Raises ``orjson.JSONEncodeError`` for what orjson refuses."""
    return orjson.dumps(data, default=_default, option=_OPTIONS)


class FastJSONRenderer(JSONRenderer):
    """``application/json`` as :class:`rest_framework.renderers.JSONRenderer` renders it
    (module docstring), encoded by orjson. ``render`` returns bytes, ``b""`` for ``None``."""

    def render(self, data: Any, accepted_media_type=None, renderer_context=None) -> bytes:
        if data is None:
            return b""
        if (
            not self.compact
            or self.ensure_ascii
            or self.get_indent(accepted_media_type, renderer_context or {}) is not None
        ):
            return super().render(_plain(data), accepted_media_type, renderer_context)
        try:
            body = dumps(data)
        except (orjson.JSONEncodeError, TypeError):
            return super().render(data, accepted_media_type, renderer_context)
        if b"\xe2\x80\xa8" in body or b"\xe2\x80\xa9" in body:  # U+2028 / U+2029, as DRF
            body = body.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
        return body


def _plain(data: Any) -> Any:
    """``data`` with any ``orjson.Fragment`` (a list row PostgreSQL wrote, nvke/sql_lists.py)
    parsed, for DRF's own encoder (pretty-printing); anything orjson refuses as it is. Parsed
    by the standard library, which keeps an integer beyond 64 bits an integer (orjson's
    ``loads`` made ``10**23`` the float ``1e+23``)."""
    try:
        return json.loads(dumps(data))
    except (orjson.JSONEncodeError, TypeError, ValueError):
        return data
