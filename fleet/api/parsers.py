"""A JSON parser on orjson for the agent report endpoint (the ingest hot path).

Reports are about 100 kB of JSON (8 GPUs x 30 samples); orjson parses them about four times
faster than the standard library here (0.2 ms against 0.9 ms per report, measured on this
machine), and refuses NaN/Infinity, which are not JSON (RFC 8259) — the agent never sends them.
"""

from __future__ import annotations

from typing import Any

import orjson
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from nvke.parsers import reject_bad_text


class OrjsonParser(BaseParser):
    """``application/json`` bodies parsed with orjson."""

    media_type = "application/json"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = stream.read()
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ParseError(f"JSON parse error - {exc}") from exc
        # orjson refuses lone surrogates but not NUL (\u0000), which PostgreSQL cannot store;
        # the byte search keeps the walk off the hot path of every clean report
        if b"\\u0000" in raw:
            reject_bad_text(data)
        return data
