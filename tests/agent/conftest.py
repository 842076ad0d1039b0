"""Fixtures for the nvke-agent tests (no Django, no database, no network but 127.0.0.1).

``api_server`` is a *test server*: a real HTTP server (``http.server`` on 127.0.0.1, port 0)
that plays the NVKE agent API as the wire format defines it — registration with one-time
bootstrap tokens, per-host Bearer credentials, idempotent ``(host, seq)`` report ingestion
answering ``{"seq", "duplicate", "samples_stored", "samples_rejected"}``, RFC 9457 problem+json
errors — plus knobs to make it fail (503/500/429 with ``Retry-After``, a final 400 for chosen
seqs). The agent under test talks to it over real sockets exactly as it would to the server.
"""

from __future__ import annotations

import json
import logging
import secrets
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# The agent is a separate package (agent/); make it importable even when it was not
# `pip install -e agent`-ed into the environment running the tests.
try:
    import nvke_agent  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    sys.path.insert(0, str(REPO_ROOT / "agent"))


def _find_captures() -> Path:
    # fleet/captures/ holds byte-for-byte copies of shared/data/nvidia-smi-xml (see its README),
    # so a clean clone tests without the shared folder beside it
    for folder in (
        REPO_ROOT / "fleet" / "captures",
        REPO_ROOT.parent / "shared" / "data" / "nvidia-smi-xml",
    ):
        if (folder / "a100-sxm4-v12.xml").is_file():
            return folder
    raise FileNotFoundError("fleet/captures/ (the nvidia-smi -q -x captures) is missing")


CAPTURES = _find_captures()


@pytest.fixture
def captures() -> Path:
    """Folder of the real ``nvidia-smi -q -x`` captures (shared/data/nvidia-smi-xml)."""
    return CAPTURES


@pytest.fixture(autouse=True)
def _reset_agent_logging() -> Iterator[None]:
    """``cli.main`` points the nvke_agent logger at the current stderr; undo it after a test."""
    yield
    logger = logging.getLogger("nvke_agent")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.propagate = True
    logger.setLevel(logging.NOTSET)


# --- the test server -------------------------------------------------------------------------


@dataclass
class ScriptedFailure:
    """An answer the test server gives instead of processing a report."""

    status: int
    retry_after: str | None = None


@dataclass
class ApiState:
    """Everything the test server knows and saw. Guarded by ``lock``."""

    bootstrap_tokens: set[str] = field(default_factory=set)
    report_interval_s: int = 10
    credentials: dict[str, str] = field(default_factory=dict)  # credential -> host_id
    hosts: dict[str, str] = field(default_factory=dict)  # host_id -> hostname
    stored: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    failures: list[ScriptedFailure] = field(default_factory=list)  # next answers, any path
    refuse_seqs: dict[int, int] = field(default_factory=dict)  # seq -> final 4xx status
    requests: list[tuple[str, int, int | None]] = field(default_factory=list)  # path, status, seq
    commands: list[dict[str, Any]] = field(default_factory=list)  # on every ack until cleared
    request_times: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class ApiTestServer:
    """The NVKE agent API played by a local test server (see module docstring)."""

    def __init__(self) -> None:
        self.state = ApiState()
        handler = type("Handler", (_Handler,), {"api": self.state})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # knobs and views

    def add_token(self, token: str | None = None) -> str:
        token = token or secrets.token_urlsafe(16)
        with self.state.lock:
            self.state.bootstrap_tokens.add(token)
        return token

    def add_host(self) -> tuple[str, str]:
        """Register a host directly; returns ``(host_id, credential)``."""
        host_id, credential = str(uuid.uuid4()), secrets.token_urlsafe(24)
        with self.state.lock:
            self.state.credentials[credential] = host_id
            self.state.hosts[host_id] = "pre-registered"
        return host_id, credential

    def fail_next(self, count: int, status: int = 503, retry_after: str | None = None) -> None:
        with self.state.lock:
            self.state.failures.extend(ScriptedFailure(status, retry_after) for _ in range(count))

    def reports(self) -> list[dict[str, Any]]:
        """Stored (acknowledged, de-duplicated) report bodies in seq order."""
        with self.state.lock:
            return [self.state.stored[key] for key in sorted(self.state.stored)]

    def report_statuses(self) -> list[int]:
        with self.state.lock:
            return [status for path, status, _ in self.state.requests if path.endswith("reports")]


class _Handler(BaseHTTPRequestHandler):
    api: ApiState

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def _answer(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        # Kept until the request is recorded (do_POST), so a client that got its answer always
        # finds the request in ``requests``.
        self._pending_answer = (status, body, headers)

    def _write_answer(self) -> None:
        status, body, headers = self._pending_answer
        data = json.dumps(body).encode()
        self.send_response(status)
        content_type = "application/problem+json" if status >= 400 else "application/json"
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _problem(
        self, status: int, code: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        self._answer(
            status,
            {
                "type": "about:blank",
                "title": code,
                "status": status,
                "detail": detail,
                "code": code,
            },
            headers,
        )

    def do_POST(self) -> None:
        import time

        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = None
        api = self.api
        with api.lock:
            api.request_times.append(time.monotonic())
            status, seq = self._dispatch(body)
            api.requests.append((self.path, status, seq))
        self._write_answer()

    def _dispatch(self, body: Any) -> tuple[int, int | None]:
        api = self.api
        if api.failures:  # e.g. the API behind its load balancer is down
            failure = api.failures.pop(0)
            headers = {"Retry-After": failure.retry_after} if failure.retry_after else None
            self._problem(failure.status, "unavailable", "scripted failure", headers)
            seq = body.get("seq") if isinstance(body, dict) else None
            return failure.status, seq
        if self.path == "/api/v1/agent/register":
            token = body.get("bootstrap_token") if isinstance(body, dict) else None
            if token not in api.bootstrap_tokens:
                self._problem(
                    401, "invalid_bootstrap_token", "bootstrap token unknown, used or expired"
                )
                return 401, None
            api.bootstrap_tokens.discard(token)  # one-time
            host_id, credential = str(uuid.uuid4()), secrets.token_urlsafe(24)
            api.credentials[credential] = host_id
            api.hosts[host_id] = body.get("hostname", "")
            self._answer(
                201,
                {
                    "host_id": host_id,
                    "credential": credential,
                    "report_interval_s": api.report_interval_s,
                },
            )
            return 201, None
        if self.path != "/api/v1/agent/reports":
            self._problem(404, "not_found", self.path)
            return 404, None
        auth = self.headers.get("Authorization", "")
        host_id = api.credentials.get(auth.removeprefix("Bearer "))
        if not auth.startswith("Bearer ") or host_id is None:
            self._problem(401, "invalid_credential", "unknown host credential")
            return 401, None
        seq = body.get("seq") if isinstance(body, dict) else None
        if not isinstance(seq, int) or seq < 1 or body.get("host_id") != host_id:
            self._problem(
                400, "invalid", "seq must be an int >= 1 and host_id the credential's host"
            )
            return 400, seq
        if seq in api.refuse_seqs:
            status = api.refuse_seqs[seq]
            self._problem(status, "invalid_report", f"report {seq} refused")
            return status, seq
        key = (host_id, seq)
        duplicate = key in api.stored
        if not duplicate:
            api.stored[key] = body
        samples = 0 if duplicate else len(body.get("samples") or [])
        self._answer(
            200,
            {
                "seq": seq,
                "duplicate": duplicate,
                "samples_stored": samples,
                "samples_rejected": 0,
                "commands": api.commands,
            },
        )
        return 200, seq


@pytest.fixture
def api_server() -> Iterator[ApiTestServer]:
    """A running :class:`ApiTestServer` (the NVKE agent API played by a local test server)."""
    server = ApiTestServer()
    try:
        yield server
    finally:
        server.close()
