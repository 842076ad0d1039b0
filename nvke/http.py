"""problem+json responses for plain Django code (middleware), outside DRF."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpResponse

from .errors import PROBLEM_CONTENT_TYPE, PROBLEM_TYPE_BASE, TITLES


def problem_response(
    status: int,
    code: str,
    detail: str,
    *,
    field: str | None = None,
    retryable: bool = False,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> HttpResponse:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + code.replace("_", "-"),
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "code": code,
        "retryable": retryable,
    }
    if field:
        body["field"] = field
    body.update(extra or {})
    response = HttpResponse(json.dumps(body), status=status, content_type=PROBLEM_CONTENT_TYPE)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def not_found(request, exception=None) -> HttpResponse:
    """``handler404``: problem+json for API paths, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return problem_response(404, "not_found", "Not found.")
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def server_error(request) -> HttpResponse:
    """``handler500``: problem+json for API paths (503 ``broker_unavailable`` /
    ``database_unavailable`` when a backing service is down, else 500 ``internal_error``),
    Django's page elsewhere. Called by Django inside its ``except`` block, so the exception
    is in ``sys.exc_info()``."""
    import sys

    from .errors import UNAVAILABLE_RETRY_AFTER_S, unavailable_problem

    if not request.path.startswith("/api/"):
        from django.views.defaults import server_error as page

        return page(request)
    exc = sys.exc_info()[1]
    unavailable = unavailable_problem(exc) if exc is not None else None
    if unavailable is not None:
        code, detail = unavailable
        return problem_response(
            503,
            code,
            detail,
            retryable=True,
            headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)},
        )
    return problem_response(500, "internal_error", "internal error; it has been logged")
