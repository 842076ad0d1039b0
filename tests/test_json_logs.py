"""JSON log lines keep the traceback of an exception (``exception``), for stdlib records
(Celery's, Django's) and structlog's alike — the formatter of ``settings.LOGGING``."""

from __future__ import annotations

import json
import logging
import sys

from django.conf import settings


def test_a_logged_exception_carries_its_traceback_in_the_json_line():
    config = dict(settings.LOGGING["formatters"]["json"])
    formatter = config.pop("()")(**config)
    try:
        {}["missing"]
    except KeyError:
        record = logging.LogRecord(
            "celery.worker", logging.CRITICAL, __file__, 1, "Unrecoverable error: %r",
            ("KeyError",), sys.exc_info(),
        )  # fmt: skip
    line = json.loads(formatter.format(record))
    assert line["event"] == "Unrecoverable error: 'KeyError'"
    assert line["level"] == "critical"
    assert line["exception"].startswith("Traceback (most recent call last):")
    assert "KeyError: 'missing'" in line["exception"]
    assert "test_json_logs.py" in line["exception"]
