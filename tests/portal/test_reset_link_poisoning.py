"""Password-reset link poisoning (issue 26, item 2). The report: with ``ALLOWED_HOSTS = ["*"]``
``POST /password-reset`` with ``Host: evil.example`` mailed ``http://evil.example/
password-reset/…`` to the victim; the attacker, receiving the click, set a new password and
logged in. Now links come from ``NVKE_PUBLIC_URL`` only, a foreign Host is refused, and ``*``
cannot be configured with DEBUG off."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core import mail
from django.test import Client

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
STRONG = "violet-anchor-harbour-42"


def test_a_foreign_host_is_refused_and_nothing_is_mailed(alice):
    client = Client()
    sent = client.post("/password-reset", {"email": "alice@example.com"}, HTTP_HOST="evil.example")
    assert sent.status_code == 400  # DisallowedHost: the default hosts are ours only
    assert mail.outbox == []


def test_the_link_names_the_public_url_whatever_host_the_request_named(alice, settings):
    """Even through a host name the operator does allow (an alias), the mailed link is built
    from NVKE_PUBLIC_URL, and it works there."""
    settings.NVKE_PUBLIC_URL = "https://nvke.example.com"
    # as the settings module derives them from NVKE_PUBLIC_URL, plus an alias the operator added
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "nvke.example.com", "alias.example"]
    client = Client()
    sent = client.post("/password-reset", {"email": "alice@example.com"}, HTTP_HOST="alias.example")
    assert sent.status_code == 302
    (message,) = mail.outbox
    links = re.findall(r"\w+://[^/\s]+/password-reset/\S+", message.body)
    assert len(links) == 1 and links[0].startswith("https://nvke.example.com/password-reset/")
    assert "alias.example" not in message.body and "testserver" not in message.body
    # the link works at the public URL: the owner of the mailbox sets the password
    path = links[0].removeprefix("https://nvke.example.com")
    form = client.get(path, follow=True, HTTP_HOST="nvke.example.com", secure=True)
    set_url = form.redirect_chain[-1][0]
    done = client.post(
        set_url,
        {"new_password1": STRONG, "new_password2": STRONG},
        HTTP_HOST="nvke.example.com",
        secure=True,
    )
    assert done.status_code == 302
    alice.refresh_from_db()
    assert alice.check_password(STRONG)


def test_invitation_links_name_the_public_url(alice_client, settings):
    settings.NVKE_PUBLIC_URL = "https://nvke.example.com"
    page = alice_client.post(
        "/members", {"email": "bob@example.com", "role": "member", "ttl_hours": "72"}
    )
    link = re.search(r'id="invite-url"[^>]* value="([^"]+)"', page.content.decode())
    assert link.group(1).startswith("https://nvke.example.com/invite/")


def _start(**env: str) -> subprocess.CompletedProcess:
    from cryptography.fernet import Fernet

    clean = {k: v for k, v in os.environ.items() if k not in ("ALLOWED_HOSTS", "NVKE_PUBLIC_URL")}
    clean.update(
        DEBUG="0",
        SECRET_KEY="k" * 20 + "9Qx2-random-enough-secret-value-0123456789",
        NVKE_SECRET_KEYS=Fernet.generate_key().decode(),
        **env,
    )
    return subprocess.run(
        [sys.executable, "-c", "import nvke.wsgi; print('started')"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_wildcard_host_is_refused_with_debug_off_even_with_insecure_defaults_allowed():
    refused = _start(
        ALLOWED_HOSTS="*", NVKE_ALLOW_INSECURE_DEFAULTS="1", NVKE_PUBLIC_URL="https://n.example"
    )
    assert refused.returncode != 0
    assert "refusing to start: ALLOWED_HOSTS contains '*'" in refused.stderr
    without_url = _start(NVKE_ALLOW_INSECURE_DEFAULTS="0")
    assert without_url.returncode != 0
    assert "NVKE_PUBLIC_URL is not set" in without_url.stderr
    started = _start(
        NVKE_ALLOW_INSECURE_DEFAULTS="0",
        NVKE_PUBLIC_URL="https://n.example",
        EMAIL_URL="smtp+tls://nvke:pw@mail.example.com:587",
    )
    assert (started.returncode, started.stdout.strip()) == (0, "started"), started.stderr


def test_the_default_hosts_are_the_public_urls_and_loopback(settings):
    """The settings module's own default (read in a fresh process: no test client host)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from django.conf import settings; print(','.join(settings.ALLOWED_HOSTS))",
        ],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if k != "ALLOWED_HOSTS"},
            "DJANGO_SETTINGS_MODULE": "nvke.settings",
            "NVKE_PUBLIC_URL": "https://nvke.example.com",
            "NVKE_POD_IP": "10.1.2.3",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "nvke.example.com,10.1.2.3,localhost,127.0.0.1,[::1]"
