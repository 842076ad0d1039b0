"""The doors (issue 15): login lockout, password rules wherever a password is set, framing and
CSP headers, production secrets, the last operator key, bounded metrics labels, CSV cells."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "correct-horse-battery-staple"


@pytest.fixture
def alice(tenant_a):
    from django.contrib.auth import get_user_model

    from tenants.models import Membership

    user = get_user_model().objects.create_user(username="alice", password=PASSWORD)
    Membership.objects.create(user=user, tenant=tenant_a, role="owner")
    return user


@pytest.fixture
def ops_client():
    from django.contrib.auth import get_user_model

    client = Client()
    client.force_login(get_user_model().objects.create_user(username="ops", is_staff=True))
    return client


def login(client, password):
    return client.post("/login", {"username": "alice", "password": password})


def test_five_wrong_passwords_lock_the_login_even_for_the_right_one(alice, settings):
    settings.AXES_FAILURE_LIMIT = 5
    client = Client()
    for _ in range(4):
        assert login(client, "wrong-password").status_code == 200  # the form again
    assert login(client, "wrong-password").status_code == 429  # the 5th locks
    locked = login(client, PASSWORD)
    assert locked.status_code == 429
    assert "Too many failed logins" in locked.content.decode()
    assert "_auth_user_id" not in client.session
    # another username from the same address is not locked
    assert Client().post("/login", {"username": "bob", "password": "x"}).status_code == 200


def test_the_username_logs_in_whatever_its_letter_case(tenant_a):
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user(username="Carol", password=PASSWORD)
    for typed in ("carol", "CAROL", "Carol"):
        client = Client()
        resp = client.post("/login", {"username": typed, "password": PASSWORD})
        assert resp.status_code == 302, typed
        assert client.session["_auth_user_id"] == str(get_user_model().objects.get().pk)
    wrong = Client().post("/login", {"username": "carol", "password": "not-hers"})
    assert wrong.status_code == 200 and "_auth_user_id" not in wrong.client.session


def test_case_variants_of_a_username_share_one_lockout(alice, settings):
    settings.AXES_FAILURE_LIMIT = 5
    client = Client()
    for typed in ("alice", "ALICE", "Alice", "aLiCe"):  # 4 failures of one account
        resp = client.post("/login", {"username": typed, "password": "wrong-password"})
        assert resp.status_code == 200, typed
    assert client.post("/login", {"username": "ALIce", "password": "x"}).status_code == 429
    from axes.models import AccessAttempt

    assert list(AccessAttempt.objects.values_list("username", "failures_since_start")) == [
        ("alice", 5)
    ]
    assert client.post("/login", {"username": "alice", "password": PASSWORD}).status_code == 429


def test_a_right_password_before_the_limit_logs_in_and_resets_the_count(alice):
    client = Client()
    for _ in range(3):
        login(client, "wrong-password")
    assert login(client, PASSWORD).status_code == 302
    from axes.models import AccessAttempt

    assert not AccessAttempt.objects.filter(username="alice").exists()


@pytest.mark.parametrize("password", ["abc", "12345678901", "password1234", "alice-alice"])
def test_weak_initial_passwords_are_refused_in_the_console(ops_client, password):
    from django.contrib.auth import get_user_model

    resp = ops_client.post(
        "/console/tenants",
        {"name": "initech", "owner_username": "alice-alice", "owner_password": password},
    )
    assert resp.status_code == 200
    assert 'id="id_owner_password-error"' in resp.content.decode()
    assert not get_user_model().objects.filter(username="alice-alice").exists()


def test_owners_cannot_set_passwords_and_invitees_weak_ones_are_refused(alice, tenant_a):
    import re

    from django.contrib.auth import get_user_model

    client = Client()
    client.force_login(alice)
    # the old "owner sets a password" form is gone: a username and password create nobody
    resp = client.post("/members", {"username": "bob", "role": "member", "password": PASSWORD})
    assert resp.status_code == 200
    assert 'id="invite_email-error"' in resp.content.decode()  # an invitation needs an email
    assert not get_user_model().objects.filter(username="bob").exists()
    # the invitee sets their own, under the password validators
    page = client.post("/members", {"email": "bob@example.com", "role": "member", "ttl_hours": 24})
    link = re.search(r'value="http://testserver(/invite/[^"]+)"', page.content.decode()).group(1)
    weak = Client().post(link, {"username": "bob", "new_password1": "abc", "new_password2": "abc"})
    assert weak.status_code == 400
    assert "This password is too short" in weak.content.decode()
    assert not get_user_model().objects.filter(username="bob").exists()
    ok = Client().post(
        link, {"username": "bob", "new_password1": PASSWORD, "new_password2": PASSWORD}
    )
    assert ok.status_code == 302
    assert get_user_model().objects.get(username="bob").check_password(PASSWORD)


def test_portal_demo_refuses_a_weak_password(tmp_path):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="too short"):
        call_command("portal_demo", "--data-dir", str(tmp_path), "--password", "abc")


def test_portal_demo_reuses_a_login_that_differs_only_in_case(tmp_path):
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    get_user_model().objects.create_user(username="Demo", password=PASSWORD)
    call_command("portal_demo", "--data-dir", str(tmp_path), "--h100-hosts", "0")
    # it raised IntegrityError (the case-insensitive unique index) creating "demo"
    assert sorted(get_user_model().objects.values_list("username", flat=True)) == [
        "Demo",
        "operator",
    ]
    assert not (tmp_path / "portal-demo-password").exists()  # its password is unchanged


def test_pages_cannot_be_framed_and_carry_a_csp(alice):
    client = Client()
    for path in ("/login", "/api/v1/docs/", "/healthz"):
        resp = client.get(path)
        assert resp["X-Frame-Options"] == "DENY", path
        csp = resp["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0], path
    client.force_login(alice)
    page = client.get("/clusters").content.decode()
    assert "onchange=" not in page and "onclick=" not in page
    assert "portal/portal.js" in page


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "NVKE_SECRET_KEYS")}
    clean.update(NVKE_ALLOW_INSECURE_DEFAULTS="0", DEBUG="0", **env)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_web_process_refuses_development_secrets_with_debug_off():
    refused = _run("import nvke.wsgi")
    assert refused.returncode != 0
    assert "refusing to start with development secrets" in refused.stderr
    assert "SECRET_KEY" in refused.stderr and "NVKE_SECRET_KEYS" in refused.stderr
    from cryptography.fernet import Fernet

    started = _run(
        "import nvke.wsgi; print('started')",
        SECRET_KEY="k" * 20 + "9Qx2-random-enough-secret-value-0123456789",
        NVKE_SECRET_KEYS=Fernet.generate_key().decode(),
        NVKE_PUBLIC_URL="https://nvke.example.com",
        EMAIL_URL="smtp+tls://nvke:pw@mail.example.com:587",
    )
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == "started"


def test_check_deploy_is_clean_with_production_settings():
    from cryptography.fernet import Fernet

    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env={
            **os.environ,
            "DEBUG": "0",
            "SECRET_KEY": "s" * 10 + "p-9Qx2-random-enough-secret-value-0123456789-abcdef",
            "NVKE_SECRET_KEYS": Fernet.generate_key().decode(),
            "NVKE_BEHIND_TLS_PROXY": "1",
            "ALLOWED_HOSTS": "nvke.example.com",
            "NVKE_PUBLIC_URL": "https://nvke.example.com",
            "NVKE_INTERNAL_PORT": "9000",
            "EMAIL_URL": "smtp+tls://nvke:pw@mail.example.com:587",
        },
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_the_last_operator_key_cannot_be_revoked(operator):
    keys = operator.get("/api/v1/operator-keys").json()
    assert len(keys) == 1
    resp = operator.delete(f"/api/v1/operator-keys/{keys[0]['prefix']}")
    assert resp.status_code == 409
    assert resp.json()["code"] == "last_operator_key"
    second = operator.post("/api/v1/operator-keys", {"name": "second"}).json()
    assert operator.delete(f"/api/v1/operator-keys/{keys[0]['prefix']}").status_code == 200
    from tenants.models import ApiKey

    assert list(
        ApiKey.objects.filter(is_operator=True, revoked=False).values_list("prefix", flat=True)
    ) == [second["prefix"]]


def test_metrics_labels_are_bounded_whatever_the_client_sends(anonymous):
    from nvke.observability import HTTP_REQUESTS

    for method in ("FOO", "BREW", "PROPFIND"):
        anonymous.generic(method, "/healthz")
    methods = {
        sample.labels["method"] for metric in HTTP_REQUESTS.collect() for sample in metric.samples
    }
    assert "OTHER" in methods
    assert not methods & {"FOO", "BREW", "PROPFIND"}
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "OTHER"}


def test_metrics_answer_only_on_the_internal_port_when_one_is_set(anonymous, settings):
    import socket

    assert anonymous.get("/metrics").status_code == 200
    settings.NVKE_INTERNAL_PORT = 9100
    assert anonymous.get("/metrics").status_code == 404  # no gunicorn socket on that port
    # a connection accepted on the internal port (what gunicorn hands the view)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    client_side = socket.create_connection(("127.0.0.1", port))
    server_side, _ = listener.accept()
    try:
        settings.NVKE_INTERNAL_PORT = port
        resp = anonymous.get("/metrics", **{"gunicorn.socket": server_side})
        assert resp.status_code == 200
        assert b"nvke_http_requests_total" in resp.content
        # the Host header cannot fake it
        settings.NVKE_INTERNAL_PORT = port + 1
        faked = anonymous.get(
            "/metrics", HTTP_HOST=f"localhost:{port + 1}", **{"gunicorn.socket": server_side}
        )
        assert faked.status_code == 404
    finally:
        for s in (client_side, server_side, listener):
            s.close()


def test_csv_cells_are_neutralised_against_formulas():
    import csv
    import io

    from billing.api.csvutil import csv_response

    rows = [
        [
            '=HYPERLINK("http://x")',
            "+1",
            "-2+3",
            "@SUM(A1)",
            "\tx",
            "\rx",
            "gpu-1",
            "-12.50",
            Decimal("-3.5"),
            7,
            None,
        ]
    ]
    resp = csv_response("t.csv", ["a"] * 11, rows)
    [_header, cells] = list(csv.reader(io.StringIO(resp.content.decode())))
    assert cells == [
        '\'=HYPERLINK("http://x")',
        "+1",
        "'-2+3",
        "'@SUM(A1)",
        "'\tx",
        "'\rx",
        "gpu-1",
        "-12.50",
        "-3.5",
        "7",
        "",
    ]
