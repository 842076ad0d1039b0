"""Logging filters (``settings.LOGGING``)."""

from __future__ import annotations

import logging


class OneLinePerRequest(logging.Filter):
    """Drop django-structlog's ``request_started``: its ``request_finished`` (method, path,
    status code, request id, user) is the one line a request writes at INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        return not (isinstance(msg, dict) and msg.get("event") == "request_started")
