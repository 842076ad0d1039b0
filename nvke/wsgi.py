"""WSGI entry point (gunicorn nvke.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nvke.settings")
application = get_wsgi_application()
