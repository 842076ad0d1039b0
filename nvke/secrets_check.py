"""Refuse to run production on development secrets.

With ``DEBUG`` off, a web process (``nvke/wsgi.py``) and a Celery worker (``worker_init``) do
not start when

* ``SECRET_KEY`` is unset (the development default ``DEFAULT_SECRET_KEY``) or shorter than 32
  characters: sessions, CSRF tokens and password-reset links would be forgeable;
* ``NVKE_SECRET_KEYS`` is empty: the Fernet key encrypting kubeconfigs at rest would be derived
  from ``SECRET_KEY`` (``nvke/crypto.py``), so one leaked setting opens both;
* ``NVKE_PUBLIC_URL`` is unset or not an origin: links in mail need it (``nvke/public_url.py``);
* ``EMAIL_URL`` is unset (password-reset mail would not be sent) or ``consolemail://`` (it would
  be printed to the log: whoever reads the log could reset anyone's password).

``NVKE_ALLOW_INSECURE_DEFAULTS=1`` lifts that refusal for development and tests (the embedded
``make run`` and the test suite set it). It never lifts the refusal of ``"*"`` in
``ALLOWED_HOSTS`` with DEBUG off (any Host accepted: cache poisoning, and absolute URLs naming
an attacker's host). ``manage.py check --deploy`` reports the same problems (check ids
``nvke.E001`` .. ``nvke.E005``).
"""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from nvke import public_url
from nvke.settings_registry import read


def insecure_defaults() -> list[tuple[str, str]]:
    """``[(check id, message)]`` for each development secret production would run on."""
    problems = []
    key = settings.SECRET_KEY or ""
    if key == settings.DEFAULT_SECRET_KEY or len(key) < 32:
        problems.append(
            (
                "nvke.E001",
                "SECRET_KEY is the development default or shorter than 32 characters; set a "
                "random one (python -c 'import secrets; print(secrets.token_urlsafe(50))')",
            )
        )
    if not [k for k in settings.NVKE_SECRET_KEYS if k.strip()]:
        problems.append(
            (
                "nvke.E002",
                "NVKE_SECRET_KEYS is empty, so the key encrypting kubeconfigs would be derived "
                "from SECRET_KEY; set a Fernet key (python -c 'from cryptography.fernet import "
                "Fernet; print(Fernet.generate_key().decode())')",
            )
        )
    if (why := public_url.problem(settings.NVKE_PUBLIC_URL)) is not None:
        problems.append(
            (
                "nvke.E003",
                f"{why}; set it to the portal's public origin (https://nvke.example.com): "
                "password-reset and invitation links are built from it",
            )
        )
    if (why := mail_problem()) is not None:
        problems.append(("nvke.E005", why))
    return problems


def mail_problem() -> str | None:
    """Why ``EMAIL_URL`` is not fit for production, or None."""
    scheme = settings.EMAIL_URL_SCHEME
    if not scheme:
        return (
            "EMAIL_URL is not set, so password-reset mails cannot be sent; set the mail "
            "server (smtp+tls://user:password@mail.example.com:587)"
        )
    if scheme == "consolemail":
        return (
            "EMAIL_URL is consolemail://, which prints every mail (password-reset links "
            "included) to the log; set a mail server (smtp+tls://…)"
        )
    return None


def wildcard_hosts() -> list[tuple[str, str]]:
    """``[("nvke.E004", message)]`` when ``ALLOWED_HOSTS`` accepts any host, else ``[]``."""
    if any(host.strip() in ("*", ".") for host in settings.ALLOWED_HOSTS):
        return [
            (
                "nvke.E004",
                "ALLOWED_HOSTS contains '*': list the host names NVKE is reached at "
                "(NVKE_PUBLIC_URL's host is added by itself)",
            )
        ]
    return []


def require_production_secrets() -> None:
    """Raise ImproperlyConfigured when DEBUG is off and a development secret is in use, or
    ``ALLOWED_HOSTS`` contains ``"*"`` (never lifted by ``NVKE_ALLOW_INSECURE_DEFAULTS``)."""
    if settings.DEBUG:
        return
    if wildcard := wildcard_hosts():
        raise ImproperlyConfigured(f"refusing to start: {wildcard[0][1]}")
    allowed = settings.NVKE_ALLOW_INSECURE_DEFAULTS or read("NVKE_ALLOW_INSECURE_DEFAULTS")
    if allowed:
        return
    problems = insecure_defaults()
    if problems:
        raise ImproperlyConfigured(
            "refusing to start with development secrets (DEBUG is off): "
            + "; ".join(message for _id, message in problems)
            + " — or set NVKE_ALLOW_INSECURE_DEFAULTS=1 for development"
        )


@checks.register(checks.Tags.security, deploy=True)
def check_production_secrets(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """``manage.py check --deploy``: the secrets above, and /metrics kept internal."""
    out: list[checks.CheckMessage] = [
        checks.Error(message, id=check_id)
        for check_id, message in [*insecure_defaults(), *wildcard_hosts()]
    ]
    if not settings.NVKE_INTERNAL_PORT:
        out.append(
            checks.Warning(
                "/metrics and /admin/ are served on the public port; set NVKE_INTERNAL_PORT "
                "to serve them only on an internal one",
                id="nvke.W003",
            )
        )
    return out
