"""Secret path segments never reach a log line.

An invitation token (``/invite/<token>``) and a password-reset link (``/password-reset/<uidb64>
/<token>``, and the ``set-password`` step Django redirects to) are credentials: whoever reads
them in a log can join a tenant or set someone's password. :func:`redact` replaces them with
``[redacted]`` wherever they appear in a text (a request line, a referer, a message);
:func:`redact_event` applies it to every string of a structlog event — the JSON and console
formatters of ``LOGGING`` run it last, so Django's, Celery's and NVKE's own lines all pass
through it — and :mod:`nvke.gunicorn_logging` to gunicorn's access log. The login records
django-axes keeps in the database (``AccessLog`` and its kin, shown in ``/admin/``) are logs
too: :func:`redact_login_record` redacts their ``path_info`` before they are saved (accepting
an invitation logs the new member in at ``/invite/<token>``).
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"

#: ``/invite/<token>``; ``/password-reset/<anything>`` except the token-free pages
_SECRET_PATHS = re.compile(
    r"(?P<prefix>/invite/)[^/?#\s\"']+"
    r"|(?P<reset>/password-reset/)(?!sent\b|done\b)[^?#\s\"']+"
)


#: keys whose values are secrets (API keys, tokens, credentials, kubeconfigs, raw reports)
_SECRET_KEY = re.compile(r"(key|token|credential|password|secret|kubeconfig|xml)", re.I)


def redact_keys(value: Any) -> Any:
    """A copy of ``value`` (dicts and lists, nested) with the values of secret-looking keys
    replaced by :data:`REDACTED` (audit events and kept idempotent responses)."""
    if isinstance(value, dict):
        return {
            k: (REDACTED if _SECRET_KEY.search(str(k)) else redact_keys(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_keys(v) for v in value]
    return value


def _replace(match: re.Match[str]) -> str:
    return (match.group("prefix") or match.group("reset")) + REDACTED


def redact(text: str) -> str:
    """``text`` with every secret path segment replaced by ``[redacted]``."""
    if "/invite/" not in text and "/password-reset/" not in text:
        return text
    return _SECRET_PATHS.sub(_replace, text)


def _walk(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _walk(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_walk(v) for v in value)
    return value


def redact_event(logger: Any, method_name: str, event_dict: dict) -> dict:
    """structlog processor: :func:`redact` every string in the event (nested ones too)."""
    return {key: _walk(value) for key, value in event_dict.items()}


def redact_login_record(sender: Any, instance: Any, **kwargs: Any) -> None:
    """``pre_save`` receiver for django-axes' ``AccessLog``, ``AccessAttempt`` and
    ``AccessFailureLog``: :func:`redact` their ``path_info`` (connected in
    :meth:`nvke.apps.NvkeConfig.ready`)."""
    if instance.path_info:
        instance.path_info = redact(instance.path_info)
