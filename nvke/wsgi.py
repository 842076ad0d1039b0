"""WSGI entry point (gunicorn nvke.wsgi). Refuses to start on development secrets with DEBUG
off (:mod:`nvke.secrets_check`)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nvke.settings")
application = get_wsgi_application()

from nvke.secrets_check import require_production_secrets  # noqa: E402  (needs the app registry)

require_production_secrets()

from nvke.tracing import setup_tracing  # noqa: E402  (after Django is set up)

setup_tracing("nvke-web")  # a no-op unless NVKE_TRACING=1
