"""Tokens in logs (issue 26, item 6): the report counted 55 log lines carrying full
invitation tokens (``GET /invite/7C05…``) and password-reset paths in one run. The web
process is started the way ``make run`` starts it (the supervisor's own argv: gunicorn with
its redacting error logger, Django's JSON request log); a real invitation is opened,
accepted, a real password-reset link followed; then every line the process wrote is scanned
for the secrets."""

from __future__ import annotations

import re
import signal

import pytest
import requests
from django.core import mail

from tests.e2e.conftest import WebProcess, free_port, service_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

STRONG = "violet-anchor-harbour-42"


@pytest.fixture
def web(tmp_path):
    from nvke.embedded.__main__ import child_env
    from nvke.embedded.supervisor import default_processes

    port = free_port()
    (spec,) = [p for p in default_processes(data_dir=tmp_path, port=port) if p.name == "web"]
    server = WebProcess(
        tmp_path / "web.log",
        # INFO: `make test` runs with LOG_LEVEL=WARNING, which drops the request log
        service_env(
            NVKE_PUBLIC_URL=f"http://127.0.0.1:{port}",
            LOG_LEVEL="INFO",
            # mail where `make run` puts it: files under the data dir
            EMAIL_URL=child_env({}, tmp_path, port)["EMAIL_URL"],
        ),
        port=port,
        argv=list(spec.argv),
    )
    server.start()
    yield server.url, tmp_path / "web.log"
    server.stop()
    assert server.proc.returncode in (0, -signal.SIGTERM)


def test_invitation_tokens_and_reset_links_are_redacted_in_every_log_line(web, tenant_a):
    from django.contrib.auth import get_user_model

    from tenants.choices import Role
    from tenants.invitations import invite
    from tenants.principal import Principal

    url, log_path = web
    issued = invite(
        principal=Principal(tenant=None, role=Role.OWNER, is_operator=True, label="test"),
        tenant=tenant_a,
        email="bob@example.com",
        role=Role.MEMBER,
    )
    token = issued.token
    visitor = requests.Session()
    page = visitor.get(f"{url}/invite/{token}", timeout=30)
    assert page.status_code == 200, page.text[:500]
    csrf = visitor.cookies["csrftoken"]
    joined = visitor.post(
        f"{url}/invite/{token}",
        data={
            "csrfmiddlewaretoken": csrf,
            "username": "bob",
            "new_password1": STRONG,
            "new_password2": STRONG,
        },
        headers={"Referer": f"{url}/invite/{token}"},
        timeout=30,
        allow_redirects=False,
    )
    assert joined.status_code == 302, joined.text[:500]
    # a password reset, through its mailed link (the web process mails to its own outbox:
    # the link is made here the same way, with Django's token generator)
    from django.contrib.auth.tokens import default_token_generator
    from django.utils.encoding import force_bytes
    from django.utils.http import urlsafe_base64_encode

    bob = get_user_model().objects.get(username="bob")
    uid = urlsafe_base64_encode(force_bytes(bob.pk))
    reset_token = default_token_generator.make_token(bob)
    reset = requests.get(f"{url}/password-reset/{uid}/{reset_token}", timeout=30)
    assert reset.status_code == 200 and "new_password1" in reset.text
    assert mail.outbox == []  # nothing mailed from this process

    wait_for(lambda: "/password-reset/" in log_path.read_text(), timeout=30, what="the log")
    text = log_path.read_text()
    lines = text.splitlines()
    assert [line for line in lines if token in line] == []
    assert [line for line in lines if reset_token in line] == []
    # the requests were logged (one JSON line per request; gunicorn's access log is off)
    assert len(re.findall(r"/invite/\[redacted\]", text)) >= 4
    assert len(re.findall(r"/password-reset/\[redacted\]", text)) >= 2


def test_a_password_reset_through_the_portal_logs_no_link_and_mails_it_to_a_file(
    web, tmp_path, tenant_a
):
    """Issue 26 leftover: the default EMAIL_URL printed every reset mail, link and all, to the
    log. Under `make run` the mail goes to a file in the data dir (the banner says where); the
    reset is asked for through the portal, the mailed link followed, and no log line holds the
    token."""
    from django.contrib.auth import get_user_model

    from nvke.embedded.__main__ import mail_dir

    url, log_path = web
    get_user_model().objects.create_user("carol", "carol@example.com", STRONG)
    visitor = requests.Session()
    visitor.get(f"{url}/password-reset", timeout=30)
    sent = visitor.post(
        f"{url}/password-reset",
        data={"csrfmiddlewaretoken": visitor.cookies["csrftoken"], "email": "carol@example.com"},
        headers={"Referer": f"{url}/password-reset"},
        timeout=30,
        allow_redirects=False,
    )
    assert sent.status_code == 302, sent.text[:500]
    (mailed,) = mail_dir(tmp_path).iterdir()
    links = re.findall(
        rf"{re.escape(url)}/password-reset/(\S+)/(\S+?)/?$", mailed.read_text(), re.M
    )
    assert len(links) == 1, mailed.read_text()
    uid, token = links[0]
    form = visitor.get(f"{url}/password-reset/{uid}/{token}", timeout=30)
    assert form.status_code == 200 and "new_password1" in form.text

    wait_for(lambda: "/password-reset/" in log_path.read_text(), timeout=30, what="the log")
    lines = log_path.read_text().splitlines()
    assert [line for line in lines if token in line] == []
    assert [line for line in lines if "Subject:" in line or "carol@example.com" in line] == []
