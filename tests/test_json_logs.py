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


def test_a_request_writes_one_log_line_at_info(client, caplog):
    """django-structlog's request_started is dropped; request_finished is the request's line."""
    import logging

    with caplog.at_level(logging.INFO):
        response = client.get("/healthz", HTTP_X_REQUEST_ID="one-line-per-request")
    assert response.status_code == 200
    lines = [
        r.msg
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg.get("request_id") == "one-line-per-request"
    ]
    assert [line["event"] for line in lines] == ["request_finished"]
    assert lines[0]["code"] == 200 and lines[0]["request"] == "GET /healthz"
