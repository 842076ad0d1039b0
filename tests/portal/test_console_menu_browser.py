"""The console's menu fits one line at 1280 px in Chromium (issue 33 item 6: it wrapped onto
two). ``NVKE_SCREENSHOTS=docs/screenshots`` keeps ``console-menu-1280.png``."""

from __future__ import annotations

import pytest

from tests.portal.conftest import login

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [1280, 1440])
def test_the_console_menu_is_one_line(live_server, browser, shots, portal_user, width):
    portal_user("ops", staff=True)
    page = login(browser, live_server.url, "ops", width=width)
    page.goto("/console/")
    tops = page.eval_on_selector_all(
        "header.top nav a", "links => links.map(a => Math.round(a.getBoundingClientRect().top))"
    )
    # the console's 11 pages (portal/templates/portal/partials/nav.html), all on one row
    assert len(tops) == 11 and len(set(tops)) == 1, tops
    header = page.eval_on_selector("header.top", "h => h.getBoundingClientRect().height")
    assert header <= 53, header  # one row: the 52 px bar
    if width == 1280:
        page.set_viewport_size({"width": 1280, "height": 300})
        shots(page, "console-menu-1280")
    page.context.close()
