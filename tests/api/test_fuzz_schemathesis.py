"""Fuzz the API from its own OpenAPI schema (schemathesis, bounded and derandomised for CI):
no 5xx for any generated request, and every documented response matches the schema."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance

pytestmark = pytest.mark.django_db


@pytest.fixture
def api_schema(db):
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    from nvke.wsgi import application

    # As Django's test client does: keep the test transaction's connection across requests.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield schemathesis.openapi.from_wsgi("/api/v1/schema/", application)
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def owner_key(tenant_a, import_capture):
    from tenants.services import create_api_key

    import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b")
    return create_api_key(tenant=tenant_a, name="fuzz", role="owner")[1]


def test_api_never_500s_and_matches_its_schema(api_schema, owner_key):
    headers = {"Authorization": f"Bearer {owner_key}"}
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 20

    for operation in operations:

        @settings(
            max_examples=8,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def fuzz(case):
            response = case.call(headers=headers)
            case.validate_response(
                response, checks=[not_a_server_error, response_schema_conformance]
            )

        fuzz()
