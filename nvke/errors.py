"""RFC 9457 ``application/problem+json`` errors with stable, machine-readable codes.

Every error the API returns has: ``type`` (a URI naming the problem), ``title``, ``status``,
``detail`` (human text), ``code`` (stable snake_case, for programs), ``retryable`` (whether the
same request may succeed later), and, for invalid input, ``field`` (the first offending field)
plus ``errors`` ``[{field, code, message}]``. Status codes follow DESIGN §7.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

PROBLEM_CONTENT_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://nvke.dev/problems/"

TITLES = {
    400: "Invalid request",
    401: "Not authenticated",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    406: "Not acceptable",
    409: "Conflict",
    412: "Precondition failed",
    413: "Request too large",
    415: "Unsupported media type",
    422: "Unprocessable request",
    429: "Too many requests",
    500: "Internal error",
    503: "Service unavailable",
}


class ApiError(exceptions.APIException):
    """A domain error with a stable ``code``; raise it from services or views.

    ``field`` names the request field at fault (dotted path, e.g. ``isolation.mig_profile``);
    ``extra`` is merged into the problem body (e.g. ``{"valid_profiles": [...]}``).
    """

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "invalid"

    def __init__(
        self,
        detail: str,
        *,
        code: str | None = None,
        field: str | None = None,
        retryable: bool = False,
        status_code: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail=detail, code=code or self.default_code)
        if status_code is not None:
            self.status_code = status_code
        self.code = code or self.default_code
        self.field = field
        self.retryable = retryable
        self.extra = extra or {}


class InvalidInput(ApiError):
    """400: the request is well-formed but breaks a rule (unknown model, MIG on a T4 …)."""

    status_code = status.HTTP_400_BAD_REQUEST


def refuse_unknown_fields(
    data: Any, allowed: Any, what: str, code: str = "field_not_updatable"
) -> None:
    """A body may name only ``allowed`` fields (names, or a serializer's ``fields``):
    InvalidInput ``code`` — ``field_not_updatable`` for a ``PATCH``, ``unknown_field`` for a
    create — naming the first other one (``what`` says what the route takes, and how the
    rest changes). A field the body names but the route ignores would answer 202 and do
    nothing with it (a node pool's ``kubernetes_version`` took the cluster's)."""
    if not hasattr(data, "keys"):
        return  # not an object: the route's serializer says so (400 non_field_errors)
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise InvalidInput(f"{what}; not: {', '.join(unknown)}", code=code, field=unknown[0])


class Conflict(ApiError):
    """409: the request conflicts with the current state (duplicate, capacity, busy)."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


class NotFound(ApiError):
    """404, with the same body whether the object is missing or another tenant's."""

    status_code = status.HTTP_404_NOT_FOUND
    default_code = "not_found"

    def __init__(self, detail: str = "Not found.") -> None:
        super().__init__(detail, code="not_found")


def problem(
    status_code: int,
    code: str,
    detail: str,
    *,
    retryable: bool = False,
    field: str | None = None,
    errors: list[dict[str, str]] | None = None,
    extra: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """Build a problem+json :class:`Response`."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + code.replace("_", "-"),
        "title": TITLES.get(status_code, "Error"),
        "status": status_code,
        "detail": detail,
        "code": code,
        "retryable": retryable,
    }
    if field is not None:
        body["field"] = field
    if errors:
        body["errors"] = errors
    if extra:
        body.update(extra)
    return Response(body, status=status_code, content_type=PROBLEM_CONTENT_TYPE, headers=headers)


def flatten_validation_errors(detail: Any, prefix: str = "") -> list[dict[str, str]]:
    """Turn DRF's nested ``ValidationError.detail`` into ``[{field, code, message}]``."""
    out: list[dict[str, str]] = []
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = "" if key == "non_field_errors" else str(key)
            path = f"{prefix}.{name}" if prefix and name else (prefix or name)
            out.extend(flatten_validation_errors(value, path))
    elif isinstance(detail, list):
        for index, item in enumerate(detail):
            if isinstance(item, dict | list):
                out.extend(flatten_validation_errors(item, f"{prefix}[{index}]"))
            else:
                out.extend(flatten_validation_errors(item, prefix))
    else:
        code = getattr(detail, "code", None) or "invalid"
        out.append({"field": prefix, "code": str(code), "message": str(detail)})
    return out


_VALIDATION_CODE_MAP = {"invalid": "invalid_field", "required": "required_field"}


#: Retry-After (s) sent with ``broker_unavailable`` / ``database_unavailable``
UNAVAILABLE_RETRY_AFTER_S = 5


def unavailable_problem(exc: BaseException) -> tuple[str, str] | None:
    """``(code, detail)`` when ``exc`` says a backing service is unreachable, else None:
    the broker / Redis (``broker_unavailable``) or PostgreSQL (``database_unavailable``).
    Both answer 503, retryable, with ``Retry-After``."""
    from django.db import InterfaceError, OperationalError
    from kombu.exceptions import OperationalError as KombuOperationalError
    from redis import RedisError

    if isinstance(exc, RedisError | KombuOperationalError):
        return "broker_unavailable", "the message broker is unavailable; retry shortly"
    if isinstance(exc, OperationalError | InterfaceError):
        return "database_unavailable", "the database is unavailable; retry shortly"
    return None


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler rendering every error as problem+json."""
    unavailable = unavailable_problem(exc)
    if unavailable is not None:
        code, detail = unavailable
        return problem(
            503,
            code,
            detail,
            retryable=True,
            headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)},
        )
    if isinstance(exc, Http404):
        exc = NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()

    if isinstance(exc, ApiError):
        return problem(
            exc.status_code,
            exc.code,
            str(exc.detail),
            retryable=exc.retryable,
            field=exc.field,
            errors=[{"field": exc.field, "code": exc.code, "message": str(exc.detail)}]
            if exc.field
            else None,
            extra=exc.extra,
        )

    if isinstance(exc, exceptions.ValidationError):
        errors = flatten_validation_errors(exc.detail)
        first = errors[0] if errors else {"field": "", "code": "invalid", "message": "invalid"}
        code = first["code"]
        code = _VALIDATION_CODE_MAP.get(code, code)
        where = f"{first['field']}: " if first["field"] else ""
        return problem(
            400,
            code,
            f"{where}{first['message']}",
            field=first["field"] or None,
            errors=errors,
        )

    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) else "error"
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        headers = {k: v for k, v in response.items() if k in ("WWW-Authenticate", "Retry-After")}
        retryable = response.status_code in (429, 503)
        return problem(
            response.status_code, code, str(detail), retryable=retryable, headers=headers
        )
    return response
