"""``/metrics`` and ``/admin/`` only on the internal port (``NVKE_INTERNAL_PORT``).

gunicorn binds two ports in the Helm chart (``GUNICORN_BIND="0.0.0.0:8000 0.0.0.0:9000"``):
the ingress reaches 8000, the NetworkPolicy lets only the monitoring namespace and the
release's own pods reach 9000. On any other port these paths answer 404 as if they did not
exist, so an ingress rule that forwards ``/`` does not publish them. Unset (the default, and
``make run``): every path on every port.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponseNotFound

INTERNAL_PREFIXES = ("/metrics", "/admin/")


class InternalPortMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        port = settings.NVKE_INTERNAL_PORT
        if (
            port
            and request.path.startswith(INTERNAL_PREFIXES)
            and request.META.get("SERVER_PORT") != str(port)
        ):
            return HttpResponseNotFound(b"Not found\n", content_type="text/plain")
        return self.get_response(request)
