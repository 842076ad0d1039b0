"""JSON parsing that answers 400 for pathological input instead of crashing.

Python's json module recurses once per nesting level: a body of 100,000 ``[`` raises
RecursionError, which DRF's JSONParser would let through as a 500.
"""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class SafeJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):  # type: ignore[override]
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON parse error - nested too deeply") from exc
