"""A bad Host header logged a full traceback at ERROR per request (issue 26 leftover): a client
could flood the log. Now ``django.security.DisallowedHost`` writes at most one WARNING line a
minute per process, without the traceback; the request log keeps its one line per request."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.fixture
def fresh_window():
    """The filter as configured, its window restarted (another test may have used it)."""
    from nvke.log_filters import DisallowedHostOncePerWindow

    (f,) = [
        f
        for f in logging.getLogger("django.security.DisallowedHost").filters
        if isinstance(f, DisallowedHostOncePerWindow)
    ]
    assert f.window_s == 60
    f._next, f._left_out = 0.0, 0
    yield f
    f._next, f._left_out = 0.0, 0


def test_fifty_bad_hosts_log_one_short_warning_and_no_traceback(fresh_window, caplog, capsys):
    client = Client()
    with caplog.at_level(logging.INFO):
        for _ in range(50):
            assert client.get("/api/v1/", HTTP_HOST="evil.example").status_code == 400
    refused = [r for r in caplog.records if r.name == "django.security.DisallowedHost"]
    assert len(refused) == 1
    (line,) = refused
    assert (line.levelname, line.exc_info) == ("WARNING", None)
    assert "evil.example" in line.getMessage()
    # everything written: one request line per request and the one refusal, no traceback
    assert len(caplog.records) <= 51
    written = capsys.readouterr()
    assert "Traceback" not in written.err + written.out + caplog.text
    # the next window's line says how many it left out
    fresh_window._next = 0.0
    with caplog.at_level(logging.INFO):
        client.get("/api/v1/", HTTP_HOST="evil.example")
    last = [r for r in caplog.records if r.name == "django.security.DisallowedHost"][-1]
    assert "49 more since the last such line, not logged" in last.getMessage()


def test_logging_applied_again_keeps_one_filter_per_logger():
    """CI failure: Celery's Django fix-up (an in-process test worker) ran ``django.setup()``
    again, ``dictConfig`` added the filters a second time, and this file's fixture found two
    windows. Applying ``LOGGING`` twice more leaves exactly the configured filters."""
    import django
    from django.conf import settings

    from nvke.log_filters import DisallowedHostOncePerWindow, OneLinePerRequest, configure

    configure(settings.LOGGING)
    django.setup()  # what Celery's fix-up calls
    host = logging.getLogger("django.security.DisallowedHost").filters
    request = logging.getLogger("django_structlog.middlewares.request").filters
    assert [type(f) for f in host] == [DisallowedHostOncePerWindow]
    assert [type(f) for f in request] == [OneLinePerRequest]
