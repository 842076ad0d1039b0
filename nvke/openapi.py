"""The OpenAPI schema as a contract: errors, protocol headers, stable operation ids, examples.

drf-spectacular describes the happy path of each view. :class:`ContractAutoSchema` adds, per
operation, what the middleware and the problem+json handler really do (DESIGN §7):

- every error response the operation can return, as ``application/problem+json`` bodies of the
  ``Problem`` component (400 invalid input, 401/403/429 on authenticated routes, 404 on routes
  with a path parameter, 409/413/415 on writes, 412 where ``If-Match`` is checked, 422 on a
  reused ``Idempotency-Key``);
- the protocol headers: ``X-Request-ID`` on every request and response, ``Idempotency-Key`` on
  POST, ``If-Match`` where the view checks it, ``ETag`` on retrieves, ``Location`` and
  ``Retry-After`` on 202 (:func:`clusters.api.accepted.accepted`) and ``Retry-After`` on 429;
- paths without the optional trailing slash, one spelling per route;
- operation ids without dots (``invoices.csv`` routes) so generated clients get valid names.

:func:`postprocess` adds the shared components and the examples of the main operations, and
repairs defaults that drf-spectacular places inside a ``oneOf`` branch they do not satisfy
(``default: ''`` beside a ``pattern``), which ``openapi-spec-validator`` rejects.
"""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.openapi import AutoSchema
from rest_framework.permissions import AllowAny

from .etags import ETagMixin

PROBLEM = "application/problem+json"
PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}

ERROR_DESCRIPTIONS = {
    400: "Invalid request: a field breaks a rule (`field` names it, `errors` lists all).",
    401: "No or invalid credentials.",
    403: "The caller's role does not allow this.",
    404: "Missing, or another tenant's (the same body for both).",
    409: "Conflicts with the current state (quota, capacity, duplicate, another operation "
    "running, an Idempotency-Key still in progress).",
    412: "`If-Match` does not match the resource's current `ETag`: read it again.",
    413: "The request body is too large.",
    415: "The request body is not JSON.",
    422: "This `Idempotency-Key` was used with a different request body.",
    429: "Throttled: retry after `Retry-After` seconds.",
}

PARAMETERS = {
    "XRequestID": {
        "name": "X-Request-ID",
        "in": "header",
        "required": False,
        "description": "Correlation id (1-64 of `A-Za-z0-9._-`); generated when absent or "
        "invalid, echoed on the response and carried into logs, tasks and audit events.",
        "schema": {"type": "string", "maxLength": 64, "pattern": r"^[A-Za-z0-9._-]{1,64}$"},
    },
    "IdempotencyKey": {
        "name": "Idempotency-Key",
        "in": "header",
        "required": False,
        "description": "A retry with the same key and body within 24 h returns the first "
        "response (with `Idempotent-Replayed: true`) and does no work.",
        "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    },
    "IfMatch": {
        "name": "If-Match",
        "in": "header",
        "required": False,
        "description": "The `ETag` read before; a change of the resource since then answers 412.",
        "schema": {"type": "string"},
    },
}

HEADERS = {
    "XRequestID": {
        "description": "The request's correlation id.",
        "schema": {"type": "string"},
    },
    "ETag": {
        "description": "Strong validator of the resource; send it back in `If-Match`.",
        "schema": {"type": "string"},
    },
    "Location": {
        "description": "URL of the Operation to poll (`/api/v1/operations/{id}`).",
        "schema": {"type": "string", "format": "uri"},
    },
    "RetryAfter": {
        "description": "Seconds to wait before polling (202) or retrying (429).",
        "schema": {"type": "integer", "minimum": 0},
    },
}

SCHEMAS = {
    "Problem": {
        "type": "object",
        "description": "RFC 9457 problem details (`application/problem+json`).",
        "required": ["type", "title", "status", "detail", "code", "retryable"],
        "properties": {
            "type": {"type": "string", "description": "URI naming the problem"},
            "title": {"type": "string"},
            "status": {"type": "integer", "description": "the HTTP status code"},
            "detail": {"type": "string", "description": "what went wrong, for people"},
            "code": {
                "type": "string",
                "description": "stable snake_case code, for programs (`quota_exceeded`)",
            },
            "retryable": {
                "type": "boolean",
                "description": "whether the same request may succeed later",
            },
            "field": {"type": "string", "description": "the first offending field (dotted)"},
            "errors": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/FieldError"},
            },
        },
        "additionalProperties": True,
    },
    "FieldError": {
        "type": "object",
        "required": ["field", "code", "message"],
        "properties": {
            "field": {"type": "string"},
            "code": {"type": "string"},
            "message": {"type": "string"},
        },
    },
}


def _header(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/headers/{name}"}


def _parameter(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/parameters/{name}"}


class ContractAutoSchema(AutoSchema):
    """AutoSchema that documents errors and protocol headers of every operation."""

    def get_operation_id(self) -> str:
        # "invoices.csv" / "{id}.csv" routes: dots are not valid in generated names.
        raw = super().get_operation_id()
        return raw.replace("_.csv", "_csv_detail").replace(".csv", "_csv")

    def _requires_auth(self) -> bool:
        return not all(isinstance(p, AllowAny) for p in self.view.get_permissions())

    def _checks_if_match(self) -> bool:
        if self.method not in ("POST", "PUT", "PATCH", "DELETE"):
            return False
        if getattr(self.view, "checks_if_match", False):  # APIViews calling check_if_match
            return True
        return isinstance(self.view, ETagMixin) and self.method != "POST"

    def error_statuses(self, operation: dict[str, Any]) -> list[int]:
        """The problem+json statuses this operation can answer (see the module docstring)."""
        writes = self.method in ("POST", "PUT", "PATCH", "DELETE")
        has_query = any(
            p.get("in") == "query" for p in operation.get("parameters", []) if "in" in p
        )
        codes: set[int] = set()
        if writes or has_query or "requestBody" in operation:
            codes.add(400)
        if self._requires_auth():
            codes |= {401, 403, 429}
        if "{" in self.path:
            codes.add(404)
        if writes:
            codes.add(409)
        if "requestBody" in operation:
            codes |= {413, 415}
        if self._checks_if_match():
            codes.add(412)
        if self.method == "POST":
            codes |= {409, 422}
        return sorted(codes)

    def get_operation(self, path, path_regex, path_prefix, method, registry):  # type: ignore[no-untyped-def]
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        params = operation.setdefault("parameters", [])
        params.append(_parameter("XRequestID"))
        if self.method == "POST" and path.startswith("/api/"):
            params.append(_parameter("IdempotencyKey"))
        if self._checks_if_match():
            params.append(_parameter("IfMatch"))

        responses: dict[str, Any] = operation["responses"]
        for status_code in self.error_statuses(operation):
            responses.setdefault(str(status_code), {})
        for status_code, response in responses.items():
            code = int(status_code) if status_code.isdigit() else 0
            headers = response.setdefault("headers", {})
            headers["X-Request-ID"] = _header("XRequestID")
            if code >= 400:
                response.setdefault("description", ERROR_DESCRIPTIONS.get(code, "Error"))
                if not response["description"]:
                    response["description"] = ERROR_DESCRIPTIONS.get(code, "Error")
                response["content"] = {PROBLEM: {"schema": PROBLEM_REF}}
            if code in (202,):
                headers["Location"] = _header("Location")
                headers["Retry-After"] = _header("RetryAfter")
            if code == 429:
                headers["Retry-After"] = _header("RetryAfter")
            if (
                code == 200
                and self.method == "GET"
                and getattr(self.view, "action", None) == "retrieve"
                and isinstance(self.view, ETagMixin)
            ):
                headers["ETag"] = _header("ETag")
        operation["responses"] = dict(sorted(responses.items()))
        return operation


# Examples of the main operations, by operation id (request body, then response per status).
_OPERATION_EXAMPLE = {
    "id": "0b8e0f7c-6c1e-4c8e-9d7e-3f0c2a1b4d5e",
    "type": "CREATE_CLUSTER",
    "target_type": "cluster",
    "target_id": "5f1d2c3b-4a59-4e68-8b7a-9c0d1e2f3a4b",
    "cluster_id": "5f1d2c3b-4a59-4e68-8b7a-9c0d1e2f3a4b",
    "status": "PENDING",
    "progress": {"done": 0, "total": 3, "stage": "queued"},
    "error": None,
    "requested_by": "key:ci",
    "created_at": "2026-12-01T10:00:00Z",
    "started_at": None,
    "finished_at": None,
}
EXAMPLES: dict[str, dict[str, Any]] = {
    "clusters_create": {
        "request": {"name": "train", "kubernetes_version": "1.34", "region": "us-east-1"},
        "202": _OPERATION_EXAMPLE,
        "409": {
            "type": "https://nvke.dev/problems/duplicate-cluster-name",
            "title": "Conflict",
            "status": 409,
            "detail": "a cluster named 'train' already exists",
            "code": "duplicate_cluster_name",
            "retryable": False,
        },
        "400": {
            "type": "https://nvke.dev/problems/invalid-field",
            "title": "Invalid request",
            "status": 400,
            "detail": "name: name must be a DNS-1123 label: lower-case letters, digits and '-', "
            "starting with a letter",
            "code": "invalid_field",
            "retryable": False,
            "field": "name",
            "errors": [{"field": "name", "code": "invalid", "message": "name must be …"}],
        },
    },
    "clusters_nodepools_create": {
        "request": {
            "name": "h100-mig",
            "gpu_model": "h100-sxm5-80gb",
            "gpus_per_node": 8,
            "node_count": 2,
            "isolation": {"mode": "mig", "mig_profile": "1g.10gb"},
        },
        "202": {**_OPERATION_EXAMPLE, "type": "CREATE_NODEPOOL", "target_type": "nodepool"},
        "400": {
            "type": "https://nvke.dev/problems/unknown-mig-profile",
            "title": "Invalid request",
            "status": 400,
            "detail": "MIG profile 1g.18gb does not exist on h100-sxm5-80gb",
            "code": "unknown_mig_profile",
            "retryable": False,
            "field": "isolation.mig_profile",
        },
        "409": {
            "type": "https://nvke.dev/problems/quota-exceeded",
            "title": "Conflict",
            "status": 409,
            "detail": "quota for h100-sxm5-80gb GPUs exceeded: 16 requested, 8 left",
            "code": "quota_exceeded",
            "retryable": False,
        },
    },
    "operations_retrieve": {
        "200": {
            **_OPERATION_EXAMPLE,
            "status": "DONE",
            "progress": {"done": 3, "total": 3, "stage": "done"},
            "started_at": "2026-12-01T10:00:01Z",
            "finished_at": "2026-12-01T10:02:30Z",
        },
    },
    "clusters_destroy": {"202": {**_OPERATION_EXAMPLE, "type": "DELETE_CLUSTER"}},
}


def _move_branch_defaults(node: Any) -> None:
    """A ``default`` inside a ``oneOf``/``anyOf`` branch that rejects it moves to the parent."""
    if isinstance(node, dict):
        for key in ("oneOf", "anyOf"):
            for branch in node.get(key, []):
                if isinstance(branch, dict) and "default" in branch:
                    node.setdefault("default", branch.pop("default"))
        for value in node.values():
            _move_branch_defaults(value)
    elif isinstance(node, list):
        for value in node:
            _move_branch_defaults(value)


def _fix_invalid_defaults(node: Any) -> None:
    """Drop a blank default that the field's own ``pattern``/``format`` rejects (a blank value
    is accepted by the serializer through a separate ``maxLength: 0`` branch)."""
    if isinstance(node, dict):
        if node.get("default") == "" and (
            ("pattern" in node and not re.search(node["pattern"], ""))
            or node.get("format") == "email"
            or node.get("minLength", 0) > 0
        ):
            node.pop("default")
        for value in node.values():
            _fix_invalid_defaults(value)
    elif isinstance(node, list):
        for value in node:
            _fix_invalid_defaults(value)


def postprocess(result: dict[str, Any], generator, request, public) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """drf-spectacular POSTPROCESSING_HOOK: shared components, examples, valid defaults."""
    components = result.setdefault("components", {})
    components.setdefault("schemas", {}).update(SCHEMAS)
    components.setdefault("parameters", {}).update(PARAMETERS)
    components.setdefault("headers", {}).update(HEADERS)
    # The router matches with and without a trailing slash ("/?"); the contract names one.
    result["paths"] = {
        (path.rstrip("/") or "/"): item for path, item in result.get("paths", {}).items()
    }
    _move_branch_defaults(result)
    _fix_invalid_defaults(result)
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            examples = EXAMPLES.get(operation.get("operationId", ""))
            if not examples:
                continue
            if "request" in examples and "requestBody" in operation:
                for media in operation["requestBody"].get("content", {}).values():
                    media["example"] = examples["request"]
            for status_code, response in operation["responses"].items():
                if status_code in examples:
                    for media in response.get("content", {}).values():
                        media["example"] = examples[status_code]
    return result
