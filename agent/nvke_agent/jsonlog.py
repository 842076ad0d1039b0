"""JSON-lines logging to stderr: one object per record.

Shape: ``{"ts": RFC3339 UTC, "level": "INFO", "logger": "nvke_agent.agent", "msg": str, ...}``
plus the keys of ``extra={"fields": {...}}`` and ``"exc"`` (the traceback) when there is one.
Secrets (credential, bootstrap token) are never passed to the logger.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO


class JsonFormatter(logging.Formatter):
    """Formats a :class:`logging.LogRecord` as one JSON object."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                entry.setdefault(key, value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def setup_logging(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send the ``nvke_agent`` loggers to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("nvke_agent")
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
