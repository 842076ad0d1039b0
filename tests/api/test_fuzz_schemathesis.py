"""Fuzz the API from its own OpenAPI schema (schemathesis, bounded and derandomised for CI):
every operation, as a tenant owner and as an operator: no 5xx for any generated request, and
every documented response matches the schema.

``NVKE_FUZZ_EXAMPLES`` sets the examples per operation and key (default 6: about two minutes
on this machine); ``make fuzz`` runs 60 with a longer timeout.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance
from schemathesis.generation import GenerationMode

pytestmark = pytest.mark.django_db


@pytest.fixture
def api_schema(db):
    from django.core.signals import request_finished, request_started
    from django.core.wsgi import get_wsgi_application
    from django.db import close_old_connections

    application = get_wsgi_application()

    # As Django's test client does: keep the test transaction's connection across requests.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield schemathesis.openapi.from_wsgi("/api/v1/schema/", application)
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


EXAMPLES = int(os.environ.get("NVKE_FUZZ_EXAMPLES", "6"))


@pytest.fixture
def keys(tenant_a, import_capture):
    from tenants.services import create_api_key

    import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b")
    return {
        "tenant owner": create_api_key(tenant=tenant_a, name="fuzz", role="owner")[1],
        "operator": create_api_key(tenant=None, name="fuzz-operator", role="admin")[1],
    }


@pytest.mark.parametrize("principal", ["tenant owner", "operator"])
def test_api_never_500s_and_matches_its_schema(api_schema, keys, principal):
    headers = {"Authorization": f"Bearer {keys[principal]}"}
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 20
    failures = []

    for operation in operations:

        @settings(
            max_examples=EXAMPLES,
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

        # invalid input by design (wrong types, out-of-schema values): never a 5xx
        @settings(
            max_examples=max(EXAMPLES // 2, 1),
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
        def fuzz_negative(case):
            response = case.call(headers=headers)
            case.validate_response(response, checks=[not_a_server_error])

        for run in (fuzz, fuzz_negative):
            try:
                run()
            except Exception as exc:  # collect every failing operation, then fail once
                failures.append(f"{operation.label} ({run.__name__}): {str(exc)[:1500]}")
    assert not failures, "\n\n".join(failures)
