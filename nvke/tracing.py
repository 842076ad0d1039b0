"""Optional OpenTelemetry tracing across Django, Celery, psycopg and requests (env-enabled).

Off unless ``NVKE_TRACING=1``; then spans go to the OTLP/HTTP endpoint the standard
``OTEL_EXPORTER_OTLP_*`` variables name (default ``http://localhost:4318``), with
``service.name`` = ``OTEL_SERVICE_NAME`` or ``nvke-web`` / ``nvke-worker``. Web processes set
it up in ``nvke/wsgi.py``, Celery worker processes after the fork (``worker_process_init``:
the batch exporter's thread does not survive a fork).

Every span carries ``nvke.request_id``: the ``X-Request-ID`` of the API call (the server span
gets it from the response header, child spans and spans of the Celery tasks a request caused
from the request id in context), and outgoing ``requests`` calls (webhook deliveries …) send it
as ``X-Request-ID`` beside the W3C ``traceparent``.
"""

from __future__ import annotations

from typing import Any

from nvke.settings_registry import read

_configured = False
REQUEST_ID_ATTRIBUTE = "nvke.request_id"


def enabled() -> bool:
    return bool(read("NVKE_TRACING"))


def current_request_id() -> str | None:
    """The request id in context: the web request's, or the one a Celery task inherited."""
    from nvke.middleware import request_id_var

    rid = request_id_var.get()
    if rid:
        return rid
    import structlog

    return structlog.contextvars.get_contextvars().get("request_id")


def _request_id_processor() -> Any:
    """A span processor stamping ``nvke.request_id`` on every span started while a request id
    is in context (built lazily: the SDK is an optional dependency)."""
    from opentelemetry.sdk.trace import SpanProcessor

    class RequestIdSpanProcessor(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            rid = current_request_id()
            if rid:
                span.set_attribute(REQUEST_ID_ATTRIBUTE, rid)

    return RequestIdSpanProcessor()


def _django_response_hook(span: Any, request: Any, response: Any) -> None:
    if span is not None and span.is_recording() and response.has_header("X-Request-ID"):
        span.set_attribute(REQUEST_ID_ATTRIBUTE, response["X-Request-ID"])


def _requests_request_hook(span: Any, request: Any) -> None:
    rid = current_request_id()
    if rid and "X-Request-ID" not in request.headers:
        request.headers["X-Request-ID"] = rid


def setup_tracing(service_name: str, *, span_processor: Any = None, force: bool = False) -> bool:
    """Install the tracer provider and the four instrumentations once per process.

    ``span_processor`` (tests: a SimpleSpanProcessor around an InMemorySpanExporter) replaces
    the OTLP exporter. Returns whether tracing is on. Never raises for a missing collector:
    the exporter drops spans it cannot send.
    """
    global _configured
    if not (enabled() or force):
        return False
    if _configured:
        if span_processor is not None:
            from opentelemetry import trace

            trace.get_tracer_provider().add_span_processor(span_processor)
        return True
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.requests import RequestsInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    name = read("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(_request_id_processor())
    if span_processor is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        span_processor = BatchSpanProcessor(OTLPSpanExporter())
    provider.add_span_processor(span_processor)
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument(response_hook=_django_response_hook)
    CeleryInstrumentor().instrument()
    PsycopgInstrumentor().instrument(enable_commenter=False)
    RequestsInstrumentor().instrument(request_hook=_requests_request_hook)
    _configured = True
    return True
