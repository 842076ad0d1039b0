"""With NVKE_INTERNAL_PORT set, /metrics and /admin/ exist on that port only (the socket the
connection was accepted on decides, not a Host header or SERVER_PORT a client can send)."""

from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture
def accepted():
    """A real connection accepted on a local port: ``(server-side socket, its port)``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client_side = socket.create_connection(listener.getsockname())
    server_side, _ = listener.accept()
    yield server_side, listener.getsockname()[1]
    for s in (client_side, server_side, listener):
        s.close()


def test_metrics_and_admin_answer_only_on_the_internal_port(client, settings, accepted):
    sock, port = accepted
    settings.NVKE_INTERNAL_PORT = port + 1  # this connection came in on another port
    assert client.get("/metrics", **{"gunicorn.socket": sock}).status_code == 404
    assert client.get("/admin/", **{"gunicorn.socket": sock}).status_code == 404
    # claiming the internal port in Host / SERVER_PORT changes nothing
    forged = {"gunicorn.socket": sock, "SERVER_PORT": str(port + 1)}
    assert client.get("/metrics", HTTP_HOST=f"x:{port + 1}", **forged).status_code == 404
    assert client.get("/healthz", **{"gunicorn.socket": sock}).status_code == 200

    settings.NVKE_INTERNAL_PORT = port
    internal = client.get("/metrics", **{"gunicorn.socket": sock})
    assert internal.status_code == 200
    assert b"# TYPE" in internal.content
    assert client.get("/admin/", **{"gunicorn.socket": sock}).status_code == 302  # to the login


def test_unset_every_path_answers_on_every_port(client, settings):
    settings.NVKE_INTERNAL_PORT = 0
    assert client.get("/metrics").status_code == 200
    assert client.get("/admin/").status_code == 302
