"""``GET /api/v1/``: where the API's documents are, so the URL ``make run``'s banner prints as
"API" answers (it was a 404 problem+json, the first thing a newcomer saw).

Public and static: it names only the schema, the docs UI and how to authenticate, never data,
and its links are paths (not built from the request's ``Host``). Not part of the OpenAPI
schema: it is an index of that schema, not an operation.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from .http import problem_response

API_ROOT = {
    "name": "NVKE API",
    "version": "v1",
    "openapi": "/api/v1/schema/",
    "docs": "/api/v1/docs/",
    "authentication": "Authorization: Bearer <API key> (an operator key or a tenant's key)",
    "errors": "application/problem+json with `code` and, for bad input, `field`",
}


@csrf_exempt  # it changes nothing; a POST gets the 405 below, not a CSRF page
def api_root(request: HttpRequest) -> HttpResponse:
    """The index above (200, ``application/json``); GET and HEAD only: any other method is a
    405 problem+json ``method_not_allowed`` with ``Allow: GET, HEAD``."""
    if request.method not in ("GET", "HEAD"):
        return problem_response(
            405,
            "method_not_allowed",
            f'Method "{request.method}" not allowed.',
            headers={"Allow": "GET, HEAD"},
        )
    return JsonResponse(API_ROOT)
