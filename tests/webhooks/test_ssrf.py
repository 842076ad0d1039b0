"""Webhook SSRF (issue 26, item 1): the address a delivery connects to is the address that was
vetted. Each URL form a hostile tenant tried is registered through the API, then — as if it
had been stored before the fix, or its name had changed its answer since — driven through the
real delivery task. A resolver stub answers a public address for a name the first time it is
asked (registration) and 127.0.0.1 afterwards (delivery); an "internal service" listens on
127.0.0.1 and counts its connections; the connection guard (conftest) records every connect
this process makes and lets none leave 127.0.0.1."""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.webhooks.receiver import Receiver, start

pytestmark = pytest.mark.django_db

PUBLIC = "93.184.216.34"  # a global unicast address (never reached: the guard refuses it)
NAME = "hooks.example.test"


class Internal:
    """A TCP listener on 127.0.0.1 standing for an internal service; counts connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def internal():
    service = Internal()
    yield service
    service.close()


@pytest.fixture
def resolver(monkeypatch):
    """``socket.getaddrinfo`` for host names: ``answers[name]`` (a list consumed one per
    call, the last repeated), by default PUBLIC once then 127.0.0.1. IP literals resolve for
    real. ``asked`` counts the lookups per name."""
    real = socket.getaddrinfo
    answers: dict[str, list[str]] = {}
    asked: dict[str, int] = defaultdict(int)

    def stub(host, port, family=0, type=0, proto=0, flags=0):
        name = host.decode() if isinstance(host, bytes) else str(host)
        try:
            ipaddress.ip_address(name)
            return real(host, port, family, type, proto, flags)
        except ValueError:
            pass
        queue = answers.setdefault(name, [PUBLIC, "127.0.0.1"])
        address = queue.pop(0) if len(queue) > 1 else queue[0]
        asked[name] += 1
        fam = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [(fam, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port or 0))]

    monkeypatch.setattr(socket, "getaddrinfo", stub)
    stub.answers = answers
    stub.asked = asked
    return stub


@pytest.fixture
def admin(tenant_a):
    from tests.conftest import _client, _key

    return _client(_key(tenant_a, "admin"))


def deliver(tenant, url: str):
    """Store an endpoint with ``url`` (as if registered before), emit one event and run the
    real delivery task once; returns the delivery, reloaded."""
    from nvke import crypto
    from webhooks import services
    from webhooks.models import WebhookEndpoint
    from webhooks.tasks import deliver_webhook

    WebhookEndpoint.objects.filter(tenant=tenant).delete()  # one endpoint: this one
    WebhookEndpoint.objects.create(
        tenant=tenant,
        url=url,
        event_types=["quota.80"],
        secret_encrypted=crypto.encrypt("whsec_" + "A" * 44),
    )
    (delivery,) = services.emit(
        tenant_id=tenant.id, event_type="quota.80", source="/t", subject="s", data={}
    )
    deliver_webhook.apply(args=(str(delivery.id),))
    delivery.refresh_from_db()
    return delivery


FORMS = {
    "backslash": "https://127.0.0.1:{p}\\@8.8.8.8/x",
    "loopback": "https://127.0.0.1:{p}/x",
    "localhost": "https://localhost:{p}/x",
    "localhost-dot": "https://localhost.:{p}/x",
    "ipv6-loopback": "https://[::1]:{p}/x",
    "ipv4-compatible": "https://[::127.0.0.1]:{p}/x",
    "ipv4-mapped": "https://[::ffff:127.0.0.1]:{p}/x",
    "ipv4-mapped-hex": "https://[::ffff:7f00:1]:{p}/x",
    "nat64": "https://[64:ff9b::7f00:1]:{p}/x",
    "6to4": "https://[2002:7f00:1::1]:{p}/x",
    "unspecified": "https://0.0.0.0:{p}/x",
    "metadata": "https://169.254.169.254/latest/meta-data",
    "decimal": "https://2130706433:{p}/x",
    "octal": "https://0177.0.0.1:{p}/x",
    "hex": "https://0x7f000001:{p}/x",
    "hex-dotted": "https://0x7f.0.0.1:{p}/x",
    "short": "https://127.1:{p}/x",
    "userinfo": "https://user:pw@" + NAME + ":{p}/x",
    "userinfo-public": "https://8.8.8.8@127.0.0.1:{p}/x",
    "tab": "https://127.0.0.1:{p}/x\t",
    "rebinding": "https://" + NAME + ":{p}/x",
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_delivery_never_connects_to_a_refused_address(
    form, admin, tenant_a, internal, resolver, connection_guard
):
    url = FORMS[form].format(p=internal.port)
    registered = admin.post(
        "/api/v1/webhooks", {"url": url, "event_types": ["quota.80"]}, format="json"
    )
    if form == "rebinding":
        # the name answers a public address at registration: accepted, then it rebinds
        assert registered.status_code == 201, registered.content
    else:
        body = registered.json()
        assert (registered.status_code, body["code"], body["field"]) == (
            400,
            "webhook_target_not_allowed",
            "url",
        ), body
    delivery = deliver(tenant_a, url)
    # nothing was connected to: not the internal service, not anything the guard refused
    assert internal.accepted == 0
    assert connection_guard.to_port(internal.port) == []
    assert connection_guard.to_port(443) == []
    assert [(e["status_code"], e["error"]) for e in delivery.log] == [
        (None, "delivery failed (target not allowed)")
    ]
    assert (delivery.status, delivery.attempts) == ("PENDING", 1)


def test_the_connection_goes_to_the_vetted_address_with_the_name_as_host(
    tenant_a, resolver, connection_guard, settings
):
    """With loopback allowed (as in tests), a name resolving to 127.0.0.1 is delivered to
    127.0.0.1 — the address vetted — with ``Host`` naming the URL's host."""
    settings.NVKE_WEBHOOK_ALLOW_HTTP = True
    settings.NVKE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    receiver = Receiver()
    server = start(receiver)
    try:
        port = server.server_port
        resolver.answers[NAME] = ["127.0.0.1"]
        delivery = deliver(tenant_a, f"http://{NAME}:{port}/hooks?x=1")
        assert delivery.status == "DELIVERED"
        assert connection_guard.to_port(port) == ["127.0.0.1"]
        assert resolver.asked[NAME] == 1  # resolved once for the attempt, never again
        (got,) = receiver.received
        assert got.headers["host"] == f"{NAME}:{port}"
    finally:
        server.shutdown()


def test_a_name_answering_differently_on_a_second_lookup_is_not_looked_up_again(
    tenant_a, resolver, connection_guard, internal, settings
):
    """Resolved once per attempt: the public answer is the one connected to (the guard stops
    it), the later 127.0.0.1 answer is never asked for, let alone connected to."""
    settings.NVKE_WEBHOOK_ALLOW_HTTP = True
    resolver.answers[NAME] = [PUBLIC, "127.0.0.1"]
    delivery = deliver(tenant_a, f"http://{NAME}:{internal.port}/x")
    assert connection_guard.to_port(internal.port) == [PUBLIC]
    assert internal.accepted == 0
    assert resolver.asked[NAME] == 1
    assert [(e["status_code"], e["error"]) for e in delivery.log] == [
        (None, "delivery failed (connection)")
    ]


def test_a_redirect_to_loopback_is_not_followed(tenant_a, internal, connection_guard, settings):
    settings.NVKE_WEBHOOK_ALLOW_HTTP = True
    settings.NVKE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{internal.port}/admin")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        delivery = deliver(tenant_a, f"http://127.0.0.1:{server.server_port}/hook")
    finally:
        server.shutdown()
    assert [(e["status_code"], e["error"]) for e in delivery.log] == [(307, "HTTP 307")]
    assert internal.accepted == 0
    assert connection_guard.to_port(internal.port) == []


def test_connection_errors_reach_the_tenant_without_internal_detail(tenant_a, settings):
    """A closed port and a plain-HTTP port spoken to in TLS read the same to the tenant
    (the port-scanner signal of the report: "Connection refused" / WRONG_VERSION_NUMBER)."""
    settings.NVKE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    receiver = Receiver()
    server = start(receiver)  # plain HTTP
    try:
        errors = [
            deliver(tenant_a, f"https://127.0.0.1:{port}/x").log[0]["error"]
            for port in (closed_port, server.server_port)
        ]
    finally:
        server.shutdown()
    assert errors == ["delivery failed (connection)"] * 2


def test_the_guard_refuses_anything_but_127_0_0_1(connection_guard):
    """The guard itself: no test of this package can reach another address."""
    for address in (("8.8.8.8", 53), ("127.0.0.2", 9)):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(address, timeout=1)
    assert connection_guard.attempts == [("8.8.8.8", 53), ("127.0.0.2", 9)]


@pytest.mark.parametrize(
    "url",
    [
        "https://[::1/",  # urlsplit's ValueError: a 500 before (found by the hostile probe)
        "https://[::1]x/",
        "https://8.8.8.8:0443/",
        "https://8.8.8.8:+443/",
        "https://8.8.8.8:80:80/",
        "https://[fe80::1%25eth0]/",
        "https://8.8.8.8/\u00e9",
        123,
    ],
)
def test_malformed_urls_are_a_400_naming_the_field(admin, url):
    resp = admin.post("/api/v1/webhooks", {"url": url, "event_types": ["quota.80"]}, format="json")
    body = resp.json()
    assert (resp.status_code, body["code"], body["field"]) == (
        400,
        "webhook_target_not_allowed",
        "url",
    ), body


def test_a_zone_id_is_refused_saying_so(admin):
    """``[fe80::1%25eth0]``: Python's IPv6Address accepts the zone id, the HTTP clients parse
    it differently, and the refusal said only "ambiguous" (a fresh-user trial)."""
    resp = admin.post(
        "/api/v1/webhooks",
        {"url": "https://[fe80::1%25eth0]/", "event_types": ["quota.80"]},
        format="json",
    )
    assert resp.status_code == 400
    assert "carries a zone id" in resp.json()["detail"]
