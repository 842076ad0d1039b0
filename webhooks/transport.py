"""One webhook POST to an address that was vetted, never to a name resolved again.

The connection goes to one of the addresses :func:`webhooks.targets.resolve_target` returned
(in order, the next one when a connect fails); TLS verifies the certificate for the URL's
host name (sent as SNI) with certifi's CA bundle, and the ``Host`` header carries that name.
Redirects are never followed: the status code is the answer. Time is bounded three ways:
``connect_s`` per connect, ``read_s`` per read, and ``attempt_s`` for the whole attempt (a
timer shuts the socket down, so an endpoint trickling one byte at a time cannot hold a worker
longer). The standard library's ``http.client`` writes the request on the socket opened
here, so nothing else parses the URL or opens a connection.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
from collections.abc import Sequence
from functools import lru_cache

import certifi

from .targets import Address, Target


class DeliveryTimeout(OSError):
    """The attempt ran past its ``attempt_s`` bound."""


@lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=certifi.where())


def _connect(addresses: Sequence[Address], port: int, connect_s: float) -> socket.socket:
    error: OSError = OSError("no address to connect to")
    for address in addresses:
        try:
            return socket.create_connection((str(address), port), timeout=connect_s)
        except OSError as exc:
            error = exc
    raise error


def post(
    target: Target,
    addresses: Sequence[Address],
    body: bytes,
    headers: dict[str, str],
    *,
    connect_s: float,
    read_s: float,
    attempt_s: float,
) -> int:
    """POST ``body`` to ``target`` at one of ``addresses``; returns the HTTP status code.

    Raises OSError (connection refused or reset, timeouts — :class:`DeliveryTimeout` past
    ``attempt_s`` —, TLS errors) and ``http.client.HTTPException`` (a malformed answer).
    """
    expired = threading.Event()
    holder: list[socket.socket] = []

    def expire() -> None:
        expired.set()
        for sock in holder:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked connect/recv at once

    timer = threading.Timer(attempt_s, expire)
    timer.daemon = True
    timer.start()
    conn: http.client.HTTPConnection | None = None
    try:
        sock = _connect(addresses, target.port, min(connect_s, attempt_s))
        holder.append(sock)
        if expired.is_set():
            raise DeliveryTimeout(f"no answer within {attempt_s} s")
        sock.settimeout(read_s)
        if target.scheme == "https":
            # an IP literal is verified against the certificate's IP SANs (and sent no SNI)
            sock = _tls_context().wrap_socket(sock, server_hostname=target.host)
            holder.append(sock)
            conn = http.client.HTTPSConnection(target.host, target.port, timeout=read_s)
        else:
            conn = http.client.HTTPConnection(target.host, target.port, timeout=read_s)
        conn.sock = sock  # already connected: http.client never connects by itself
        conn.request("POST", target.request_target, body=body, headers=headers)
        return conn.getresponse().status
    except OSError as exc:
        if expired.is_set():
            raise DeliveryTimeout(f"no answer within {attempt_s} s") from exc
        raise
    finally:
        timer.cancel()
        if conn is not None:
            conn.close()
        for sock in holder:
            sock.close()
