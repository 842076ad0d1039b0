"""One default window for usage and utilization (issue 33; a fresh-user trial of ``make run``
on 2026-12-07): the portal's /usage covered 2026-11-24 .. today (14 days), the usage API and
``nvkectl usage`` the last 31 days (from 11-06), the utilization API the last 7 days (from
11-30). Now every one of them defaults to this billing month so far, in the tenant's billing
time zone (what the cost views of AWS, Google Cloud and Azure open with), and says so.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from urllib.parse import unquote
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.utils import timezone

from tests.portal.conftest import alice, alice_client, portal_user  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("tz", "end", "start"),
    [
        # the trial's clock: from the 1st, not 11-24, 11-06 or 11-30
        ("UTC", datetime(2026, 12, 7, 2, 53, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)),
        # 1 Dec 00:00 in Berlin (CET, +1) is 30 Nov 23:00 UTC
        (
            "Europe/Berlin",
            datetime(2026, 12, 7, 3, tzinfo=UTC),
            datetime(2026, 11, 30, 23, tzinfo=UTC),
        ),
        # an end exactly at a local month start is the whole month before: November in New
        # York began at 04:00 UTC (EDT, -4; DST ended that day)
        (
            "America/New_York",
            datetime(2026, 12, 1, 5, tzinfo=UTC),
            datetime(2026, 11, 1, 4, tzinfo=UTC),
        ),
    ],
)
def test_month_to_date(tz, end, start):
    from billing.periods import month_to_date

    assert month_to_date(tz, end) == (start, end)


def _month_start(tz: str) -> datetime:
    """This month's first local midnight in ``tz``, worked out with zoneinfo directly."""
    local = timezone.now().astimezone(ZoneInfo(tz))
    return local.replace(day=1, hour=0, minute=0, second=0, microsecond=0).astimezone(UTC)


@pytest.fixture
def berlin(tenant_a):
    call_command("billing", "account", "--tenant", str(tenant_a.id), "--time-zone", "Europe/Berlin")
    return _month_start("Europe/Berlin")


def test_the_apis_default_to_this_billing_month(owner, berlin):
    usage = owner.get("/api/v1/usage").json()
    util = owner.get("/api/v1/utilization").json()
    assert datetime.fromisoformat(usage["start"]) == berlin
    assert datetime.fromisoformat(util["start"]) == berlin  # was now - 7 days
    assert util["cost_window"]["start"] == usage["totals"]["cost_window"]["start"]
    # only --end: from the 1st of its month in Berlin (1 March 00:00 CET = 28 Feb 23:00 UTC)
    body = owner.get("/api/v1/usage", {"end": "2026-03-20T12:00:00Z"}).json()
    assert (body["start"], body["end"]) == (
        "2026-02-28T23:00:00+00:00",
        "2026-03-20T12:00:00+00:00",
    )
    body = owner.get("/api/v1/utilization", {"end": "2026-03-20T12:00:00Z"}).json()
    assert body["start"] == "2026-02-28T23:00:00+00:00"


def test_last_months_usage_is_not_in_the_default_window(owner, world, tenant_a, list_prices):
    """1 H100 held two to one hours before this month began (UTC): 1 GPU-h of last month,
    which the old 31-day default counted; this month so far holds none of it."""
    from billing.aggregation import aggregate_usage

    month = _month_start("UTC")
    pool = world.pool(tenant_a, name="p", gpus_per_node=1)
    host = world.make_host("h100-sxm5-80gb", gpus=1)
    world.hold(pool, host, month - timedelta(hours=2), month - timedelta(hours=1))
    aggregate_usage(tenant_a.id, month - timedelta(days=1), month, now=timezone.now())
    body = owner.get("/api/v1/usage").json()
    assert datetime.fromisoformat(body["start"]) == month
    assert body["totals"]["gpu_hours"] == "0.000000"
    assert owner.get("/api/v1/utilization").json()["groups"] == []
    last_month = owner.get("/api/v1/usage", {"end": month.isoformat()}).json()
    assert last_month["totals"]["gpu_hours"] == "1.000000"


def test_nvkectl_usage_states_the_default_window(owner, berlin):
    from nvkectl import usage as usage_cli

    body = owner.get("/api/v1/usage").json()
    note = usage_cli.window_note(body, start_given=False, end_given=False)
    assert note == (
        f"window: {berlin.isoformat()} .. {body['end']} (this billing month so far, the default)"
    )
    assert usage_cli.usage_notes(body, note)[0] == note
    assert usage_cli.window_note(body, start_given=True, end_given=True) == ""


def test_the_portal_defaults_to_this_billing_month(alice_client, berlin):  # noqa: F811
    today = timezone.now().astimezone(ZoneInfo("Europe/Berlin")).date()
    html = alice_client.get("/usage").content.decode()
    window = re.search(r'<span id="usage-window">(.*?)</span>', html).group(1)
    assert window == (
        "This billing month so far (the default window, as the usage and utilization APIs and "
        f"nvkectl usage): {today.replace(day=1):%Y-%m-%d} to {today:%Y-%m-%d}, days in "
        "Europe/Berlin."
    )
    assert 'for="id_start">From (Europe/Berlin)</label>' in html
    # the CSV link asks the API for the same start
    csv_url = unquote(re.search(r'href="(/api/v1/usage\.csv\?[^"]+)" download', html).group(1))
    assert f"start={berlin.isoformat().replace('+00:00', 'Z')}" in csv_url
    # a window the user chose is not called the default
    chosen = alice_client.get("/usage", {"start": "2026-03-01", "end": "2026-03-31"}).content
    window = re.search(r'<span id="usage-window">(.*?)</span>', chosen.decode()).group(1)
    assert window == "2026-03-01 to 2026-03-31, days in Europe/Berlin."
