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
