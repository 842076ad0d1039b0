"""A cluster's node-pool list searched, sorted and paged in a real browser (Playwright on
Debian's Chromium against Django's live server), and a bad page refused on the page.

Hosts are SIMULATED rows (``make_host``); the pools are the real services' rows (fixture
``three_pools`` of ``test_portal_lists``: train 2 x H100 RUNNING, infer 1 x A100 RUNNING,
batch 1 x H100 PROVISIONING)."""

from __future__ import annotations

import pytest

from tests.portal.conftest import TIMEOUT_MS, login
from tests.portal.test_portal_lists import three_pools  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_node_pool_list_searches_sorts_and_pages_in_the_browser(
    live_server,
    browser,
    alice,
    three_pools,  # noqa: F811
    monkeypatch,
):
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    monkeypatch.setattr("portal.listing.PAGE_SIZE", 2)  # the live server runs in this process
    page = login(browser, live_server.url, "alice")
    page.goto(f"/clusters/{three_pools['cluster']}")
    page.locator("#all-pools").click()
    names = page.locator("tr[data-pool]")

    def shown() -> list[str]:
        return [names.nth(i).get_attribute("data-pool") for i in range(names.count())]

    expect(page.locator("h1")).to_have_text("Node pools of llm")
    expect(page.locator(".pager")).to_contain_text("1\u20132 of 3")
    assert shown() == ["batch", "infer"]  # newest first, 2 a page
    # sort by name (a column header), then the other way
    page.get_by_role("link", name="Name", exact=True).click()
    expect(page.locator("a.sort[data-sort]")).to_have_text("Name ↑")
    assert shown() == ["batch", "infer"]
    page.get_by_role("link", name="Next →").click()
    expect(page.locator(".pager")).to_contain_text("3\u20133 of 3")
    assert shown() == ["train"]
    page.get_by_role("link", name="Name ↑").click()
    expect(page.locator("a.sort[data-sort]")).to_have_text("Name ↓")
    assert shown() == ["train", "infer"]
    # search (the GPU model's catalog name), keeping the sort
    page.get_by_label("Search").fill("h100")
    page.get_by_role("button", name="Apply").click()
    expect(page.locator(".pager")).to_contain_text("1\u20132 of 2")
    assert shown() == ["train", "batch"]
    assert "sort=-name" in page.url and "q=h100" in page.url
    # the phase filter offers what the pools hold
    options = page.get_by_label("Phase").locator("option").all_inner_texts()
    assert options == ["any", "PROVISIONING", "RUNNING"]
    page.get_by_label("Phase").select_option("PROVISIONING")
    page.get_by_role("button", name="Apply").click()
    expect(names).to_have_count(1)
    assert shown() == ["batch"]
    # a page past the end is refused on the page, with the reason
    response = page.goto(f"/clusters/{three_pools['cluster']}/nodepools?page=7")
    assert response.status == 400
    expect(page.locator("#list-error")).to_have_text("page 7 does not exist: this list has 2 pages")
