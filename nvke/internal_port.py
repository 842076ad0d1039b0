"""``/metrics`` and ``/admin/`` only on the internal port (``NVKE_INTERNAL_PORT``).

gunicorn also listens on that port when it is set (``nvke/gunicorn_conf.py``; the Helm chart
binds 8000 and 9000): the ingress reaches the public port, the NetworkPolicy lets only the
monitoring namespace and the release's own pods reach the internal one. On any other port these
paths answer 404 as if they did not exist, so an ingress rule that forwards ``/`` does not
publish them. The port is read from the accepted connection's socket (its local port), which a
client cannot forge the way it can a ``Host`` header (Django's and gunicorn's ``SERVER_PORT``
come from it). Unset (the default, and ``make run``): every path on every port.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponseNotFound

INTERNAL_PREFIXES = ("/metrics", "/admin/")


def on_internal_port(request: HttpRequest) -> bool:
    """True when ``NVKE_INTERNAL_PORT`` is unset, or the connection was accepted on it."""
    port = settings.NVKE_INTERNAL_PORT
    if not port:
        return True
    sock = request.META.get("gunicorn.socket")
    try:
        return sock is not None and int(sock.getsockname()[1]) == int(port)
    except (OSError, TypeError, ValueError, IndexError):
        return False


class InternalPortMiddleware:
    """404 for :data:`INTERNAL_PREFIXES` off the internal port (see the module docstring)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith(INTERNAL_PREFIXES) and not on_internal_port(request):
            return HttpResponseNotFound(b"Not found\n", content_type="text/plain")
        return self.get_response(request)
