"""Which webhook URLs the operator allows (checked at registration and before every attempt,
so a name that later resolves to a private address is refused then too).

Refused unless configured: any scheme but ``https`` (``NVKE_WEBHOOK_ALLOW_HTTP``), and hosts
resolving to a loopback, private, link-local, multicast, reserved or unspecified address,
unless inside one of ``NVKE_WEBHOOK_ALLOWED_NETWORKS`` (CIDRs, e.g. ``127.0.0.0/8`` in tests).
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

from nvke.errors import InvalidInput


def check_target(url: str) -> None:
    """Raise InvalidInput ``webhook_target_not_allowed`` (field ``url``) when refused."""
    parts = urlsplit(url)
    allowed_schemes = {"https", "http"} if settings.NVKE_WEBHOOK_ALLOW_HTTP else {"https"}
    if parts.scheme not in allowed_schemes or not parts.hostname:
        raise InvalidInput(
            f"webhook URLs must be {' or '.join(sorted(allowed_schemes))} with a host"
            + (
                ""
                if "http" in allowed_schemes
                else " (the operator setting NVKE_WEBHOOK_ALLOW_HTTP=1 allows http)"
            ),
            code="webhook_target_not_allowed",
            field="url",
        )
    try:
        port = parts.port  # None when not given; ValueError beyond 65535 or not a number
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise InvalidInput(
            "the webhook URL's port must be between 1 and 65535",
            code="webhook_target_not_allowed",
            field="url",
        )
    port = port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        raise InvalidInput(
            f"webhook host {parts.hostname} does not resolve",
            code="webhook_target_not_allowed",
            field="url",
        ) from None
    networks = [ipaddress.ip_network(n) for n in settings.NVKE_WEBHOOK_ALLOWED_NETWORKS]
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if any(address in net for net in networks):
            continue
        if not address.is_global or address.is_multicast:
            raise InvalidInput(
                f"webhook host {parts.hostname} resolves to {address}, which is not allowed "
                "(loopback, private, link-local or reserved; the operator setting "
                "NVKE_WEBHOOK_ALLOWED_NETWORKS lists networks to allow, e.g. 127.0.0.0/8)",
                code="webhook_target_not_allowed",
                field="url",
            )
