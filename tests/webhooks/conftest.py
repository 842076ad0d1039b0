"""Every webhook test runs behind a connection guard: the test process may open TCP
connections to 127.0.0.1 only, whatever the code under test does. A connect anywhere else is
refused (``ConnectionRefusedError``) before any packet leaves, and recorded, so a test can
assert which address a delivery actually tried to reach. Unix sockets (Redis) pass."""

from __future__ import annotations

import socket

import pytest

ONLY = "127.0.0.1"


class ConnectionGuard:
    """``attempts``: ``(address, port)`` of every TCP connect of this test, allowed or not."""

    def __init__(self) -> None:
        self.attempts: list[tuple[str, int]] = []

    def to_port(self, port: int) -> list[str]:
        return [address for address, p in self.attempts if p == port]


@pytest.fixture(autouse=True)
def connection_guard(monkeypatch) -> ConnectionGuard:
    guard = ConnectionGuard()
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def vet(sock: socket.socket, address) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            host, port = str(address[0]), int(address[1])
            guard.attempts.append((host, port))
            if host != ONLY:
                raise ConnectionRefusedError(f"connection guard: {host}:{port} is not {ONLY}")

    def connect(sock, address):
        vet(sock, address)
        return real_connect(sock, address)

    def connect_ex(sock, address):
        vet(sock, address)
        return real_connect_ex(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    return guard
