"""``GET /api/v1/`` answers: it is the "API" URL of ``make run``'s banner (a 404 before), and an
index of where the API's documents are. Its links are followed here, not merely listed."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_the_api_root_names_the_schema_and_docs_and_each_link_answers():
    anonymous = Client()
    root = anonymous.get("/api/v1/")
    assert (root.status_code, root["Content-Type"]) == (200, "application/json")
    body = root.json()
    assert (body["openapi"], body["docs"]) == ("/api/v1/schema/", "/api/v1/docs/")
    assert body["authentication"].startswith("Authorization: Bearer ")
    schema = anonymous.get(body["openapi"], HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200 and schema.json()["openapi"].startswith("3.")
    assert "/api/v1/clusters" in schema.json()["paths"]
    docs = anonymous.get(body["docs"])
    assert docs.status_code == 200 and "swagger" in docs.content.decode().lower()


def test_the_api_root_is_read_only_and_not_built_from_the_host_header():
    anonymous = Client(enforce_csrf_checks=True)  # as curl meets it: no CSRF cookie
    # a Host the settings allow but that is not the public URL: the links stay paths
    root = anonymous.get("/api/v1/", HTTP_HOST="localhost").json()
    assert not [v for v in root.values() if "localhost" in v or "://" in v]
    refused = anonymous.post("/api/v1/", {}, content_type="application/json")
    assert (refused.status_code, refused["Allow"]) == (405, "GET, HEAD")
    assert refused["Content-Type"] == "application/problem+json"
    assert refused.json()["code"] == "method_not_allowed"
