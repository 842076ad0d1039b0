"""Logging filters (``settings.LOGGING``) and the function that applies it
(``settings.LOGGING_CONFIG``)."""

from __future__ import annotations

import logging
import logging.config
import threading
import time


class OneLinePerRequest(logging.Filter):
    """Drop django-structlog's ``request_started``: its ``request_finished`` (method, path,
    status code, request id, user) is the one line a request writes at INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        return not (isinstance(msg, dict) and msg.get("event") == "request_started")


class DisallowedHostOncePerWindow(logging.Filter):
    """``django.security.DisallowedHost`` at most once per ``window_s`` (per process), as a
    WARNING without the traceback.

    Django logs every request with a Host outside ``ALLOWED_HOSTS`` at ERROR with a full
    traceback (~15 lines): a client sending bad Host headers could flood the log. The request
    log still has its one line per request (``request_finished``, status 400); this line says
    why (Django's message, cut to 300 characters) and how many it left out since the last."""

    def __init__(self, window_s: float = 60.0) -> None:
        super().__init__()
        self.window_s = window_s
        self._lock = threading.Lock()
        self._next = 0.0
        self._left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                self._left_out += 1
                return False
            self._next = now + self.window_s
            left_out, self._left_out = self._left_out, 0
        record.msg = record.getMessage()[:300]  # Django's, naming the (client's) host
        if left_out:
            record.msg += f"; {left_out} more since the last such line, not logged"
        record.args = ()
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True


def configure(config: dict) -> None:
    """Apply ``settings.LOGGING`` (Django's ``LOGGING_CONFIG`` hook), again and again alike.

    ``django.setup()`` runs the logging configuration every time it is called, and Celery's
    Django fix-up calls it once more in every worker. ``logging.config.dictConfig`` replaces a
    logger's handlers but *adds* its filters to the ones already there, so a second run gave
    ``django.security.DisallowedHost`` two rate-limit windows (and every configured logger its
    filters twice). The filters of the loggers ``config`` names are cleared first."""
    for name in config.get("loggers", {}):
        logging.getLogger(name).filters.clear()
    if "root" in config:
        logging.getLogger().filters.clear()
    logging.config.dictConfig(config)
