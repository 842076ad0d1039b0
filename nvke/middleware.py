"""Request id: taken from ``X-Request-ID`` (if sane) or generated; echoed on the response."""

from __future__ import annotations

import contextvars
import re
import uuid

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "request_id", default=None
)
_SANE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class RequestIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        incoming = request.headers.get("X-Request-ID", "")
        rid = incoming if _SANE.match(incoming) else uuid.uuid4().hex
        request.request_id = rid
        request.META["HTTP_X_REQUEST_ID"] = rid  # django-structlog binds the same id ...
        # ... reading request.headers, which the line above cached without it: drop the cache
        request.__dict__.pop("headers", None)
        token = request_id_var.set(rid)
        try:
            response = self.get_response(request)
        finally:
            request_id_var.reset(token)
        response["X-Request-ID"] = rid
        return response


client_ip_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "client_ip", default=None
)


class ClientIpMiddleware:
    """Remember the caller's IP for audit events (``REMOTE_ADDR``; put a trusted proxy's
    ``X-Forwarded-For`` handling in front when deployed behind one)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = client_ip_var.set(request.META.get("REMOTE_ADDR") or None)
        try:
            return self.get_response(request)
        finally:
            client_ip_var.reset(token)


class BodySizeLimitMiddleware:
    """413 problem+json for a request body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from django.conf import settings

        from .http import problem_response

        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit and length > limit:
            return problem_response(
                413, "request_too_large", f"the request body is over {limit} bytes"
            )
        return self.get_response(request)


class QueryStringGuardMiddleware:
    """400 for a query parameter PostgreSQL cannot take as text (a NUL byte, from
    ``%00``): problem+json ``invalid_character`` naming the parameter on ``/api/`` paths, a
    plain 400 elsewhere. Runs before any view, so no filter, form or lookup ever sees one."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from django.http import HttpResponseBadRequest

        from .http import is_api, problem_response
        from .validation import BadValue, check_text

        bad = None  # (a NUL in the path matches no route: 404, tests/tenants/test_found_by_review)
        for name, values in request.GET.lists():
            try:
                check_text(name)
                for value in values:
                    check_text(value)
            except BadValue:
                bad = name if "\x00" not in name else name.replace("\x00", "")
                break
        if bad is None:
            return self.get_response(request)
        detail = f"{bad}: text may not contain NUL bytes"
        if is_api(request):
            return problem_response(400, "invalid_character", detail, field=bad)
        return HttpResponseBadRequest(detail, content_type="text/plain")


class FormTextGuardMiddleware:
    """A plain 400 for a portal or console form field PostgreSQL cannot take as text (a NUL
    byte): Django's form fields refuse one, but views also read ``request.POST`` directly (a
    GPU UUID to mark healthy, the GPU model of a node-pool form) and put it in a query, which
    was a 500 (``DataError``). Only non-``/api/`` POSTs with a form body: the API's bodies are
    JSON, checked by ``nvke.parsers.SafeJSONParser``. Runs after BodySizeLimitMiddleware, so
    the body it parses is bounded."""

    FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from django.http import HttpResponseBadRequest

        from .http import is_api
        from .validation import BadValue, check_text

        if (
            request.method == "POST"
            and not is_api(request)
            and request.content_type in self.FORM_TYPES
        ):
            for name, values in request.POST.lists():
                try:
                    check_text(name)
                    for value in values:
                        check_text(value)
                except BadValue:
                    bad = name.replace("\x00", "")
                    return HttpResponseBadRequest(
                        f"{bad}: text may not contain NUL bytes", content_type="text/plain"
                    )
        return self.get_response(request)
