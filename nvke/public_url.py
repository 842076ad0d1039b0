"""The portal's public origin (``NVKE_PUBLIC_URL``): links NVKE hands out — password-reset
mail, invitation links — are built from it and never from a request's ``Host`` header (with
``ALLOWED_HOSTS = ["*"]`` a request naming ``Host: evil.example`` had the reset link mailed
to the victim point at the attacker).

The value is an origin: ``https://nvke.example.com`` or ``http://127.0.0.1:8000``, no path,
query, user or fragment. Unset, development installations use :data:`DEVELOPMENT_URL`; with
DEBUG off NVKE refuses to start without it (:mod:`nvke.secrets_check`, check ``nvke.E003``).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings

DEVELOPMENT_URL = "http://localhost:8000"


def problem(value: str) -> str | None:
    """Why ``value`` is not a usable public URL, or None when it is."""
    if not value:
        return "NVKE_PUBLIC_URL is not set"
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError:
        return f"NVKE_PUBLIC_URL {value!r} is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"NVKE_PUBLIC_URL {value!r} must be http(s)://host[:port]"
    if parts.username or parts.password or parts.path.strip("/") or parts.query or parts.fragment:
        return f"NVKE_PUBLIC_URL {value!r} must be an origin: scheme://host[:port], nothing more"
    return None


def origin() -> tuple[str, str]:
    """``(scheme, host[:port])`` of the public URL (:data:`DEVELOPMENT_URL` when unset)."""
    parts = urlsplit(settings.NVKE_PUBLIC_URL or DEVELOPMENT_URL)
    return parts.scheme, parts.netloc


def absolute_url(path: str) -> str:
    """``path`` (absolute, e.g. from ``reverse()``) under the public URL."""
    scheme, netloc = origin()
    return f"{scheme}://{netloc}{path}"
