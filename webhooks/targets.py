"""Which webhook URLs the operator allows, and the addresses a delivery may connect to.

A URL is parsed once, here, strictly (:func:`parse_target`), and the delivery connects with
the parts parsed here — there is no second URL parser that could read the same text
differently (the backslash trick ``https://127.0.0.1:1\\@8.8.8.8/`` reads as host 8.8.8.8 to
``urlsplit`` and as 127.0.0.1 to urllib3). Refused outright: anything but printable ASCII,
backslashes, userinfo (``user@``), a host that is not a canonical dotted-quad IPv4, a bracketed
IPv6 literal without zone, or a DNS name; numeric forms a resolver would still take for an
address (``2130706433``, ``0177.0.0.1``, ``0x7f.1``, ``127.1``); ``localhost`` names (RFC 6761);
and any URL whose host, port or userinfo ``urlsplit`` or urllib3 read differently.

:func:`resolve_target` resolves the host once and vets every address it gets: each must be
global unicast — not loopback, private, link-local (169.254.169.254), shared, reserved,
multicast or unspecified, nor an IPv6 address embedding such an IPv4 one (IPv4-mapped,
IPv4-compatible ``::a.b.c.d``, 6to4, Teredo, NAT64) — unless it lies inside one of
``NVKE_WEBHOOK_ALLOWED_NETWORKS`` (CIDRs, e.g. ``127.0.0.0/8`` in tests). The delivery then
connects to one of exactly those addresses (:mod:`webhooks.transport`), never resolving again,
so a name that answers a public address at registration and 127.0.0.1 later is refused at the
later attempt, not followed. Only ``https`` is allowed unless ``NVKE_WEBHOOK_ALLOW_HTTP``.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from nvke.errors import InvalidInput

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_PRINTABLE = re.compile(r"[\x21-\x7e]+")  # no spaces, no controls, no non-ASCII
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED_QUAD = re.compile(rf"{_OCTET}(\.{_OCTET}){{3}}")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
DEFAULT_PORTS = {"https": 443, "http": 80}


@dataclass(frozen=True)
class Target:
    """A vetted webhook URL, split: ``host`` as written (lower case; an IPv6 literal without
    brackets) is the TLS server name and the ``Host`` header; ``request_target`` is the path
    and query sent in the request line."""

    scheme: str
    host: str
    port: int
    request_target: str

    @property
    def literal(self) -> Address | None:
        """The address when the host is an IP literal, else None."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None


def _refuse(message: str) -> InvalidInput:
    return InvalidInput(message, code="webhook_target_not_allowed", field="url")


def parse_target(url: str) -> Target:
    """Split ``url`` by the rules above (no DNS). Raises InvalidInput
    ``webhook_target_not_allowed`` (field ``url``)."""
    allowed_schemes = {"https", "http"} if settings.NVKE_WEBHOOK_ALLOW_HTTP else {"https"}
    must = f"webhook URLs must be {' or '.join(sorted(allowed_schemes))} with a host" + (
        ""
        if "http" in allowed_schemes
        else " (the operator setting NVKE_WEBHOOK_ALLOW_HTTP=1 allows http)"
    )
    if not isinstance(url, str) or not _PRINTABLE.fullmatch(url) or "\\" in url:
        raise _refuse("webhook URLs are printable ASCII without spaces or backslashes")
    try:
        parts = urlsplit(url)  # ValueError: an unclosed "[" ("Invalid IPv6 URL")
    except ValueError:
        raise _refuse("the webhook URL is not a URL") from None
    if parts.scheme not in allowed_schemes or not parts.netloc:
        raise _refuse(must)
    if "@" in parts.netloc:
        raise _refuse("webhook URLs may not carry a user name or password (user@host)")
    host, port = _split_netloc(parts.netloc, DEFAULT_PORTS[parts.scheme])
    _check_host(host)
    # the same text as the other parsers read it: anything else is ambiguous, so refused
    try:
        other = parse_url(url)
        split_port = parts.port or DEFAULT_PORTS[parts.scheme]
    except (LocationParseError, ValueError):
        raise _refuse("the webhook URL is ambiguous") from None
    seen = {
        ((parts.hostname or "").lower(), split_port, None),
        ((other.host or "").strip("[]").lower(), other.port or split_port, other.auth),
    }
    if seen != {(host, port, None)}:
        raise _refuse("the webhook URL is ambiguous")
    request_target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, host, port, request_target)


def _split_netloc(netloc: str, default_port: int) -> tuple[str, int]:
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            raise _refuse("the webhook URL's IPv6 address lacks its closing ]")
        host, rest = netloc[1:end], netloc[end + 1 :]
        if "%" in host:  # Python's IPv6Address takes a zone id; the HTTP clients read it apart
            raise _refuse(
                "the webhook URL's IPv6 address carries a zone id (%…): zones name this "
                "machine's own interfaces, so such an address is never a webhook target"
            )
        try:
            ipaddress.IPv6Address(host)  # refuses IPv4 in brackets
        except ValueError:
            raise _refuse("the webhook URL's [...] is not an IPv6 address") from None
    else:
        host, colon, port_text = netloc.partition(":")
        rest = colon + port_text
    if not rest:
        return host.lower(), default_port
    if not rest.startswith(":") or not rest[1:].isdigit() or not rest[1:].isascii():
        raise _refuse("the webhook URL's port must be between 1 and 65535")
    port = int(rest[1:])
    if not 1 <= port <= 65535 or rest[1:] != str(port):
        raise _refuse("the webhook URL's port must be between 1 and 65535")
    return host.lower(), port


def _check_host(host: str) -> None:
    if not host:
        raise _refuse("the webhook URL has no host")
    if ":" in host:
        return  # an IPv6 literal, checked in _split_netloc
    labels = host.split(".")
    numeric = [label.isdigit() or label.startswith("0x") for label in labels]
    if numeric[-1] or all(numeric):
        if not _DOTTED_QUAD.fullmatch(host):
            raise _refuse(
                "write an IPv4 webhook host as four decimal numbers a.b.c.d "
                "(no octal, hex, decimal-integer or shortened forms)"
            )
        return
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise _refuse(f"the webhook host {host!r} is not a valid DNS name")
    if labels[-1] == "localhost":
        raise _refuse("localhost is not an allowed webhook host")


def address_allowed(address: Address) -> bool:
    """True when a delivery may connect to ``address`` (see the module docstring)."""
    networks = [ipaddress.ip_network(n) for n in settings.NVKE_WEBHOOK_ALLOWED_NETWORKS]
    if any(address.version == net.version and address in net for net in networks):
        return True
    candidates: list[Address] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        if address in _IPV4_COMPATIBLE:  # ::a.b.c.d (deprecated) and ::, ::1
            return False
        teredo = address.teredo
        candidates += [
            a
            for a in (
                address.ipv4_mapped,
                address.sixtofour,
                *(teredo or ()),
                ipaddress.IPv4Address(int(address) & 0xFFFFFFFF) if address in _NAT64 else None,
            )
            if a is not None
        ]
    return all(a.is_global and not a.is_multicast for a in candidates)


def resolve_target(target: Target) -> list[Address]:
    """The addresses ``target`` may be reached at: resolved once, every one vetted, in the
    resolver's order without repeats. Raises InvalidInput ``webhook_target_not_allowed`` when
    the name does not resolve or any address is not allowed (one message for both, so the
    answer is no oracle of internal DNS)."""
    refused = _refuse(
        f"webhook host {target.host} does not resolve to allowed public addresses only "
        "(loopback, private, link-local and reserved addresses are refused; the operator "
        "setting NVKE_WEBHOOK_ALLOWED_NETWORKS lists networks to allow, e.g. 127.0.0.0/8)"
    )
    if target.literal is not None:
        found = [target.literal]
    else:
        try:
            infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise refused from None
        found = []
        for info in infos:
            address = ipaddress.ip_address(info[4][0].split("%", 1)[0])
            if address not in found:
                found.append(address)
    if not found or not all(address_allowed(a) for a in found):
        raise refused
    return found


def check_target(url: str) -> tuple[Target, list[Address]]:
    """Parse and resolve ``url`` (registration, and every delivery attempt). Raises
    InvalidInput ``webhook_target_not_allowed`` (field ``url``)."""
    target = parse_target(url)
    return target, resolve_target(target)
