"""Password-reset links printed into logs (issue 26 leftover): ``EMAIL_URL`` defaulted to
``consolemail://`` and the Helm chart left it unset, so every reset mail went to the pod log and
whoever read the log could take over any account. With DEBUG off an unset ``EMAIL_URL`` or
``consolemail://`` now refuses to start (``nvke.E005``, also reported by ``check --deploy``);
where ``NVKE_ALLOW_INSECURE_DEFAULTS`` lets such a process start, it sends nothing and logs no
link. (``make run`` mails to files: tests/portal/test_log_redaction.py.)"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core import mail
from django.test import Client

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


def _start(**env: str) -> subprocess.CompletedProcess:
    """A production web process (DEBUG off, real secrets, a public URL) with ``env``."""
    from cryptography.fernet import Fernet

    clean = {k: v for k, v in os.environ.items() if k not in ("EMAIL_URL", "ALLOWED_HOSTS")}
    clean.update(
        DEBUG="0",
        SECRET_KEY="k" * 20 + "9Qx2-random-enough-secret-value-0123456789",
        NVKE_SECRET_KEYS=Fernet.generate_key().decode(),
        NVKE_PUBLIC_URL="https://nvke.example.com",
        NVKE_ALLOW_INSECURE_DEFAULTS="0",
    )
    clean.update(env)
    code = "import nvke.wsgi; from django.conf import settings; print(settings.EMAIL_BACKEND)"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_refuses_to_start_without_a_mail_server_or_with_console_mail():
    unset = _start()
    assert unset.returncode != 0
    assert "EMAIL_URL is not set" in unset.stderr
    console = _start(EMAIL_URL="consolemail://")
    assert console.returncode != 0
    assert "EMAIL_URL is consolemail://" in console.stderr
    smtp = _start(EMAIL_URL="smtp+tls://nvke:pw@mail.example.com:587")
    assert smtp.returncode == 0, smtp.stderr
    assert smtp.stdout.strip() == "django.core.mail.backends.smtp.EmailBackend"
    # development lifts the refusal, but an unset EMAIL_URL then sends nothing (never the log)
    lifted = _start(NVKE_ALLOW_INSECURE_DEFAULTS="1")
    assert lifted.returncode == 0, lifted.stderr
    assert lifted.stdout.strip() == "nvke.mail.UnconfiguredEmailBackend"


@pytest.mark.parametrize(
    ("scheme", "reported"), [("", True), ("consolemail", True), ("smtp+tls", False)]
)
def test_check_deploy_reports_a_missing_or_console_mail_server(settings, scheme, reported):
    from nvke.secrets_check import check_production_secrets

    settings.EMAIL_URL_SCHEME = scheme
    ids = [m.id for m in check_production_secrets()]
    assert ("nvke.E005" in ids) is reported


def test_an_unconfigured_process_sends_nothing_and_logs_no_link(alice, settings, caplog, capsys):
    settings.EMAIL_BACKEND = "nvke.mail.UnconfiguredEmailBackend"
    with caplog.at_level(logging.INFO):
        sent = Client().post("/password-reset", {"email": "alice@example.com"})
    assert sent.status_code == 302  # the page answers as usual: no account enumeration
    assert mail.outbox == []
    out = capsys.readouterr()
    logged = caplog.text + out.out + out.err
    assert "mail_not_sent" in logged and "EMAIL_URL is not set" in logged
    assert "/password-reset/" not in logged.replace("POST /password-reset ", "")
    assert "alice@example.com" not in logged
