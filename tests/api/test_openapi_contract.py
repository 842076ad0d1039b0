"""The OpenAPI schema is a contract: valid OpenAPI 3 (openapi-spec-validator), every operation
documents its problem+json errors and the protocol headers, operation ids are stable, and what
the schema promises for 202 (``Location`` = the operation, ``Retry-After``) is what the API sends.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from openapi_spec_validator import validate

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
METHODS = {"get", "post", "put", "patch", "delete"}


@pytest.fixture
def schema(anonymous):
    response = anonymous.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return response.json()


def operations(schema):
    for path, item in schema["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield path, method, op


def test_the_schema_is_valid_openapi_3(schema):
    assert schema["openapi"].startswith("3.")
    validate(schema)  # raises on the first error


def test_the_problem_component_describes_rfc9457_bodies(schema):
    problem = schema["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == {"type", "title", "status", "detail", "code", "retryable"}
    assert problem["properties"]["errors"]["items"] == {"$ref": "#/components/schemas/FieldError"}


def test_every_error_response_is_problem_json(schema):
    seen = 0
    for path, method, op in operations(schema):
        for status, response in op["responses"].items():
            if int(status) >= 400:
                seen += 1
                assert list(response["content"]) == ["application/problem+json"]
                media = response["content"]["application/problem+json"]
                assert media["schema"] == {"$ref": "#/components/schemas/Problem"}, (path, method)
                assert response["description"], (path, method, status)
    assert seen > 300


def test_authenticated_operations_document_401_403_429_and_detail_routes_404(schema):
    for path, method, op in operations(schema):
        codes = set(op["responses"])
        if path == "/api/v1/schema":
            assert not codes & {"401", "403"}
            continue
        if path == "/api/v1/agent/register":
            continue  # bootstrap token in the body, not a principal
        assert {"401", "403", "429"} <= codes, (path, method)
        if "{" in path:
            assert "404" in codes, (path, method)


def test_writes_document_conflict_idempotency_and_lost_updates(schema):
    create = schema["paths"]["/api/v1/clusters"]["post"]
    assert {"400", "409", "413", "415", "422"} <= set(create["responses"])
    names = [p["$ref"].rsplit("/", 1)[1] for p in create["parameters"] if "$ref" in p]
    assert names == ["XRequestID", "IdempotencyKey"]

    patch = schema["paths"]["/api/v1/clusters/{id}"]["patch"]
    assert "412" in patch["responses"]
    assert {"$ref": "#/components/parameters/IfMatch"} in patch["parameters"]
    assert schema["components"]["parameters"]["IfMatch"]["name"] == "If-Match"

    set_size = schema["paths"]["/api/v1/clusters/{cluster_pk}/nodepools/{id}/set-size"]["post"]
    assert "412" in set_size["responses"]
    assert {"$ref": "#/components/parameters/IfMatch"} in set_size["parameters"]

    kubeconfig = schema["paths"]["/api/v1/clusters/{id}/kubeconfig"]["get"]
    assert "409" in kubeconfig["responses"]


def test_202_answers_document_location_and_retry_after(schema):
    accepted = 0
    for path, _method, op in operations(schema):
        if "202" in op["responses"]:
            accepted += 1
            headers = op["responses"]["202"]["headers"]
            assert headers["Location"] == {"$ref": "#/components/headers/Location"}, path
            assert headers["Retry-After"] == {"$ref": "#/components/headers/RetryAfter"}, path
    # clusters create/patch/delete/rotate, node pools create/patch/delete/set-size/
    # autoscaling/upgrade, webhook redelivery, defragmentation run
    assert accepted == 12


def test_retrieves_document_etag_and_every_response_the_request_id(schema):
    get = schema["paths"]["/api/v1/clusters/{id}"]["get"]
    assert get["responses"]["200"]["headers"]["ETag"] == {"$ref": "#/components/headers/ETag"}
    for path, method, op in operations(schema):
        for response in op["responses"].values():
            assert "X-Request-ID" in response["headers"], (path, method)


def test_operation_ids_are_stable_and_unique(schema):
    ids = [op["operationId"] for _, _, op in operations(schema)]
    assert len(ids) == len(set(ids))
    assert all("." not in i for i in ids)
    pinned = [
        line
        for line in (ROOT / "docs" / "api-operation-ids.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    missing = sorted(set(pinned) - set(ids))
    assert not missing, f"operation ids renamed or removed: {missing}"


def test_main_operations_carry_examples(schema):
    create = schema["paths"]["/api/v1/clusters"]["post"]
    body = create["requestBody"]["content"]["application/json"]["example"]
    assert body == {"name": "train", "kubernetes_version": "1.34", "region": "us-east-1"}
    conflict = create["responses"]["409"]["content"]["application/problem+json"]["example"]
    assert conflict["code"] == "duplicate_cluster_name"


def test_a_202_carries_location_of_the_operation_and_retry_after(owner, import_capture):
    import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b")
    response = owner.post(
        "/api/v1/clusters",
        {"name": "loc", "kubernetes_version": "1.35", "region": "us-east-1"},
        format="json",
    )
    assert response.status_code == 202, response.content
    op_id = response.json()["id"]
    assert response["Location"] == f"http://testserver/api/v1/operations/{op_id}"
    assert response["Retry-After"] == "2"
    follow = owner.get(response["Location"].removeprefix("http://testserver"))
    assert follow.status_code == 200
    assert follow.json()["id"] == op_id


def test_an_idempotent_replay_of_a_202_keeps_its_location(owner, import_capture):
    import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b")
    body = {"name": "replay", "kubernetes_version": "1.35", "region": "us-east-1"}
    first = owner.post("/api/v1/clusters", body, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    again = owner.post("/api/v1/clusters", body, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert again["Idempotent-Replayed"] == "true"
    assert again["Location"] == first["Location"]
