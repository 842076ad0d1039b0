"""A real HTTP webhook receiver on 127.0.0.1 (a thread of the test process) that verifies
every request's Standard Webhooks signature with the ``standardwebhooks`` library, as an
integrator's receiver would, and answers the status codes it is told to (then 200)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass
class Received:
    at: float
    headers: dict[str, str]
    body: bytes
    answered: int
    verified_with: list[int]  # indexes of the secrets that verify it


@dataclass
class Receiver:
    secrets: list[str] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)  # popped per request; then 200
    received: list[Received] = field(default_factory=list)
    url: str = ""

    def verify(self, headers: dict[str, str], body: bytes) -> list[int]:
        ok = []
        for index, secret in enumerate(self.secrets):
            try:
                Webhook(secret).verify(body, headers)
                ok.append(index)
            except WebhookVerificationError:
                pass
        return ok


def start(receiver: Receiver) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            headers = {k.lower(): v for k, v in self.headers.items()}
            status = receiver.answers.pop(0) if receiver.answers else 200
            receiver.received.append(
                Received(time.monotonic(), headers, body, status, receiver.verify(headers, body))
            )
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_port}/hooks/nvke"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
