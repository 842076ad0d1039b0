"""Optional OpenTelemetry tracing: with it on, one API call gives a server span and psycopg
child spans in one trace, all carrying the request's X-Request-ID; an outgoing ``requests``
call made with that id in context sends it (and ``traceparent``) to a real local server; a
Celery task run gets a span with the id it inherited. The SDK and instrumentations are the
real ones; spans are collected by the SDK's in-memory exporter instead of sent by OTLP."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
import structlog

pytestmark = pytest.mark.django_db


@pytest.fixture
def traced_db(spans, db):
    """The test's database connection opened before tracing was on (in production tracing is
    set up before the first connection): instrument it as psycopg's instrumentation allows."""
    from django.db import connection
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    connection.ensure_connection()
    raw = PsycopgInstrumentor.instrument_connection(connection.connection)
    yield
    PsycopgInstrumentor.uninstrument_connection(raw)
    raw._is_instrumented_by_opentelemetry = False  # uninstrument_connection leaves it set


@pytest.fixture(scope="module")
def spans():
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from nvke.tracing import setup_tracing

    exporter = InMemorySpanExporter()
    assert setup_tracing("nvke-test", span_processor=SimpleSpanProcessor(exporter), force=True)
    yield exporter
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    for instrumentor in (
        DjangoInstrumentor(),
        CeleryInstrumentor(),
        PsycopgInstrumentor(),
        RequestsInstrumentor(),
    ):
        instrumentor.uninstrument()
    import nvke.tracing

    nvke.tracing._configured = False


def test_an_api_call_is_one_trace_carrying_the_request_id(spans, traced_db, owner):
    spans.clear()
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=owner._credentials["HTTP_AUTHORIZATION"])
    response = client.get("/api/v1/clusters", HTTP_X_REQUEST_ID="trace-me-1")
    assert response.status_code == 200
    finished = spans.get_finished_spans()
    (server,) = [s for s in finished if s.kind.name == "SERVER"]
    assert server.attributes["nvke.request_id"] == "trace-me-1"
    assert "clusters" in server.name
    queries = [s for s in finished if s.attributes.get("db.system") == "postgresql"]
    assert queries, [s.name for s in finished]
    assert {s.context.trace_id for s in queries} == {server.context.trace_id}
    assert {s.attributes["nvke.request_id"] for s in queries} == {"trace-me-1"}


def test_outgoing_requests_carry_the_request_id_and_trace_context(spans):
    seen = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.update({k.lower(): v for k, v in self.headers.items()})
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    from nvke.middleware import request_id_var

    token = request_id_var.set("rid-out-2")
    try:
        spans.clear()
        requests.get(f"http://127.0.0.1:{server.server_port}/x", timeout=5)
    finally:
        request_id_var.reset(token)
        server.shutdown()
    assert seen["x-request-id"] == "rid-out-2"
    (client_span,) = [s for s in spans.get_finished_spans() if s.kind.name == "CLIENT"]
    assert seen["traceparent"].split("-")[1] == f"{client_span.context.trace_id:032x}"
    assert client_span.attributes["nvke.request_id"] == "rid-out-2"


def test_a_celery_task_span_carries_the_request_id_it_inherited(spans, traced_db):
    from webhooks.tasks import deliver_webhook

    spans.clear()
    structlog.contextvars.bind_contextvars(request_id="rid-task-3")
    try:
        deliver_webhook.apply(args=["00000000-0000-0000-0000-000000000000"])  # gone: no-op
    finally:
        structlog.contextvars.unbind_contextvars("request_id")
    finished = spans.get_finished_spans()
    (task,) = [s for s in finished if s.name.startswith("run/webhooks.tasks.deliver_webhook")]
    assert task.attributes["nvke.request_id"] == "rid-task-3"
    queries = [s for s in finished if s.attributes.get("db.system") == "postgresql"]
    assert queries, [(s.name, s.attributes) for s in finished]
    assert {s.context.trace_id for s in queries} == {task.context.trace_id}
