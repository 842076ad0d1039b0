"""Portal fixtures: portal logins (Django users with memberships) and logged-in test clients.

Hosts come from ``make_host`` (SIMULATED infrastructure: rows shaped like imported hosts) when
a test needs H100s, which no real capture in ``fleet/captures/`` holds.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tests.e2e.conftest import worker  # noqa: F401  (a real Celery worker, for browser tests)

PASSWORD = "correct-horse-battery-staple"


@pytest.fixture
def portal_user(db):
    """``portal_user("alice", tenant, "owner")`` -> a user with that membership (password
    :data:`PASSWORD`); ``portal_user("ops", staff=True)`` -> an operator (staff) user."""
    from django.contrib.auth import get_user_model

    from tenants.models import Membership

    def _make(username: str, tenant=None, role: str = "owner", *, staff: bool = False):
        user = get_user_model().objects.create_user(
            username=username, email=f"{username}@example.com", password=PASSWORD
        )
        if staff:
            user.is_staff = True
            user.save(update_fields=["is_staff"])
        if tenant is not None:
            Membership.objects.create(user=user, tenant=tenant, role=role)
        return user

    return _make


def _login(user):
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def alice(portal_user, tenant_a):
    """Owner of tenant A."""
    return portal_user("alice", tenant_a, "owner")


@pytest.fixture
def alice_client(alice):
    return _login(alice)


@pytest.fixture
def viewer_client(portal_user, tenant_a):
    return _login(portal_user("victor", tenant_a, "viewer"))


@pytest.fixture
def outsider_client(portal_user, tenant_b):
    """Owner of tenant B."""
    return _login(portal_user("olga", tenant_b, "owner"))


@pytest.fixture
def ops_client(portal_user):
    return _login(portal_user("ops", staff=True))


@pytest.fixture
def h100_host(make_host):
    """One SIMULATED 8 x H100-SXM5-80GB host in us-east-1a."""
    return make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="sim-h100-01")


def without_tokens(html: str) -> str:
    """A page without its per-response CSRF tokens (masked anew on every render)."""
    html = re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "", html)
    return re.sub(r'"X-CSRFToken": "[^"]+"', "", html)


# ------------------------------------------------------------------- browser (Playwright)

CHROMIUM = os.environ.get("NVKE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 60_000


@pytest.fixture
def browser(monkeypatch):
    """A headless Chromium from the system (Playwright's bundled browsers are not used)."""
    playwright = pytest.importorskip("playwright.sync_api")
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: apt-get install -y chromium")
    # Playwright's sync API runs an event loop in this thread; the ORM calls the test makes
    # between browser steps are synchronous and safe here.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()
        # ORM calls made while Playwright's loop ran used connections bound to its context:
        # close them here, or the test database cannot be dropped at the end of the session
        from django.db import connections

        connections.close_all()


@pytest.fixture
def shots(tmp_path):
    """``shots(page, "name")`` saves ``name.png`` (a 1360 px wide, full-page screenshot)."""
    target = Path(os.environ.get("NVKE_SCREENSHOTS") or tmp_path / "screenshots")
    target.mkdir(parents=True, exist_ok=True)

    def _shot(page, name: str) -> Path:
        path = target / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return _shot


def login(browser, base: str, username: str, *, width: int = 1360, **context_options):
    """A new browser context logged in as ``username`` (``context_options``: Playwright's,
    e.g. ``bypass_csp=True`` to inject the vendored axe-core)."""
    context = browser.new_context(
        viewport={"width": width, "height": 900},
        accept_downloads=True,
        base_url=base,
        **context_options,
    )
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto("/login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    return page
