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


def is_api(request) -> bool:
    """True for the paths whose every answer is problem+json when it is an error."""
    return request.path.startswith("/api/")


def _request_id(request) -> dict[str, Any]:
    rid = getattr(request, "request_id", None)
    return {"request_id": rid} if rid else {}


def not_found(request, exception=None) -> HttpResponse:
    """``handler404``: problem+json for API paths, Django's page elsewhere."""
    if is_api(request):
        return problem_response(404, "not_found", "Not found.")
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def bad_request(request, exception=None) -> HttpResponse:
    """``handler400`` (SuspiciousOperation: a disallowed Host, too many fields …)."""
    if is_api(request):
        return problem_response(
            400, "bad_request", "The request is malformed.", extra=_request_id(request)
        )
    from django.views.defaults import bad_request as django_bad_request

    return django_bad_request(request, exception)


def permission_denied(request, exception=None) -> HttpResponse:
    """``handler403`` for Django's PermissionDenied raised outside DRF."""
    if is_api(request):
        return problem_response(403, "permission_denied", "You may not do this.")
    from django.views.defaults import permission_denied as django_permission_denied

    return django_permission_denied(request, exception)


def server_error(request) -> HttpResponse:
    """``handler500``: any uncaught error (a view, a middleware, outside DRF). On API paths
    problem+json: 503 ``broker_unavailable`` / ``database_unavailable`` when a backing service
    is down, else 500 ``internal_error``; Django's page elsewhere. The traceback is logged by
    Django (``django.request``) with the request id that the body names. Called by Django
    inside its ``except`` block, so the exception is in ``sys.exc_info()``."""
    import sys

    from .errors import UNAVAILABLE_RETRY_AFTER_S, unavailable_problem

    if is_api(request):
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
                extra=_request_id(request),
            )
        return problem_response(
            500,
            "internal_error",
            "The server failed; the error is logged under this request_id.",
            retryable=True,
            extra=_request_id(request),
        )
    from django.views.defaults import server_error as django_server_error

    return django_server_error(request)


def csrf_failure(request, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: problem+json on API paths (a session caller without the token)."""
    if is_api(request):
        return problem_response(403, "csrf_failed", f"CSRF check failed: {reason}")
    from django.views.csrf import csrf_failure as django_csrf_failure

    return django_csrf_failure(request, reason)
