"""WSGI entry point (gunicorn nvke.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nvke.settings")
application = get_wsgi_application()

from nvke.tracing import setup_tracing  # noqa: E402  (after Django is set up)

setup_tracing("nvke-web")  # a no-op unless NVKE_TRACING=1
