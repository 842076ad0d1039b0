"""The console's server-side rules (#20): price input never a 500, one currency per price
sheet, a quota below current use needs an explicit confirmation, no invoice for a month before
the tenant existed, typed-name confirmations for drain / maintenance / retire, the live drain
progress of a host's nodes, and the Xid events page's filters and pages.

Hosts are SIMULATED rows (``make_host``); everything above them (reconcilers, the drain
machinery, billing) is the real code on the real database.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from tests.helpers import drive_pool

# the fixture ``world`` (tenant A's running 1 x 1 H100 pool on sim-h100-01), reused
from tests.portal.test_portal_access import world  # noqa: F401

pytestmark = pytest.mark.django_db

PRICE = {
    "gpu_model": "a10g",
    "hourly_rate": "2.50",
    "currency": "USD",
    "effective_from": "2026-12-01T00:00",
}


def field_error(html: str, field: str) -> str:
    """The text of the error shown next to ``field`` ('' when none)."""
    marker = f'id="id_{field}-error"'
    if marker not in html:
        return ""
    return html.split(marker)[1].split("</div>")[0]


# --- prices ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "says"),
    [
        ("-2.50", "hourly_rate must lie in [0, 99999999]"),  # the service's range
        ("NaN", "digits 0-9"),
        ("Infinity", "digits 0-9"),
        ("1e400", "digits 0-9"),
        ("1e3", "digits 0-9"),  # published 1000 per GPU-hour before (a new-user trial)
        ("123456789012345", "Ensure that there are no more than 14 digits in total."),
        ("99999999.5", "hourly_rate must lie in [0, 99999999]"),  # fits the column, too big
        ("\u0662\u066b\u0665", "digits 0-9"),  # Arabic-Indic 2.5 (Decimal would read 2.5)
        ("\uff12.\uff15", "digits 0-9"),  # fullwidth 2.5
        ("2,50", "digits 0-9"),
    ],
)
def test_a_bad_price_is_a_form_error_next_to_the_rate_never_a_500(ops_client, catalog, rate, says):
    from billing.models import Price

    response = ops_client.post("/console/prices", dict(PRICE, hourly_rate=rate))
    assert response.status_code == 200
    assert says in field_error(response.content.decode(), "hourly_rate")
    assert not Price.objects.exists()


def test_a_good_price_is_stored_exactly(ops_client, catalog):
    from billing.models import Price

    assert ops_client.post("/console/prices", PRICE).status_code == 302
    (price,) = Price.objects.all()
    assert (price.hourly_rate, price.currency) == (Decimal("2.500000"), "USD")
    assert price.reservation_hourly_rate is None


def test_the_price_form_publishes_a_reservation_rate(ops_client, catalog):
    from billing.models import Price

    form = dict(PRICE, reservation_hourly_rate="1.75", effective_from="2026-12-05T00:00")
    assert ops_client.post("/console/prices", form).status_code == 302
    (price,) = Price.objects.all()
    assert (price.hourly_rate, price.reservation_hourly_rate) == (
        Decimal("2.500000"),
        Decimal("1.750000"),
    )
    bad = dict(form, reservation_hourly_rate="1e3", effective_from="2026-12-06T00:00")
    html = ops_client.post("/console/prices", bad).content.decode()
    assert "digits 0-9" in field_error(html, "reservation_hourly_rate")


def test_a_price_sheet_keeps_one_currency_unless_another_is_chosen_explicitly(
    ops_client, catalog, tenant_a
):
    """The list sheet is in USD: EUR is refused next to the currency field, accepted with the
    explicit tick (then the sheet has two). Tenant A's billing account is in CHF: an override
    in USD is refused, in CHF accepted."""
    from billing.aggregation import get_account
    from billing.models import BillingAccount, Price

    assert ops_client.post("/console/prices", PRICE).status_code == 302
    eur = dict(PRICE, currency="eur", effective_from="2026-12-02T00:00")
    html = ops_client.post("/console/prices", eur).content.decode()
    assert "the list price sheet is in USD" in field_error(html, "currency")
    assert "currency_not_of_sheet" in field_error(html, "currency")
    assert Price.objects.count() == 1
    assert ops_client.post("/console/prices", dict(eur, new_currency="on")).status_code == 302
    assert sorted(Price.objects.values_list("currency", flat=True)) == ["EUR", "USD"]

    get_account(tenant_a.id)
    BillingAccount.objects.filter(tenant=tenant_a).update(currency="CHF")
    override = dict(PRICE, tenant=str(tenant_a.id), hourly_rate="2.00")
    html = ops_client.post("/console/prices", override).content.decode()
    assert "the price sheet of tenant-a is in CHF" in field_error(html, "currency")
    assert ops_client.post("/console/prices", dict(override, currency="CHF")).status_code == 302
    assert Price.objects.get(tenant=tenant_a).currency == "CHF"


def test_the_service_refuses_a_second_currency_for_every_caller(catalog):
    """The rule lives in ``set_price`` (the console, ``manage.py billing price``)."""
    from billing.prices import set_price
    from nvke.errors import InvalidInput

    start = datetime(2026, 1, 1, tzinfo=UTC)
    set_price(gpu_model="a10g", hourly_rate=Decimal(1), effective_from=start)
    with pytest.raises(InvalidInput) as refused:
        set_price(gpu_model="h100-sxm5-80gb", hourly_rate=Decimal(2), currency="JPY",
                  effective_from=start)  # fmt: skip
    assert (refused.value.code, refused.value.field) == ("currency_not_of_sheet", "currency")
    set_price(
        gpu_model="h100-sxm5-80gb",
        hourly_rate=Decimal(300),
        currency="JPY",
        effective_from=start,
        new_currency=True,
    )


# --- quotas ----------------------------------------------------------------------------------


def test_a_quota_below_current_use_is_shown_and_needs_an_explicit_confirmation(
    ops_client,
    tenant_a,
    world,  # noqa: F811
):
    """Tenant A runs 1 cluster, 1 node, 1 H100 (the ``world`` pool). Nodes 0 and H100s 0 are
    below use: the page lists both with the use, nothing is saved; with the tick, saved."""
    from tenants.models import AuditEvent, Quota

    url = f"/console/tenants/{tenant_a.id}"
    before = Quota.objects.get(tenant=tenant_a)
    limits = {"max_clusters": "5", "max_nodes": "0", "max_gpus": "h100-sxm5-80gb=0"}
    html = ops_client.post(url, limits).content.decode()
    box = html.split('id="below-use"')[1].split("</div>")[0]
    warning = box.split("<ul>")[1].split("</ul>")[0]
    assert "nodes: limit 0 is below the 1 in use (1 reserved)" in warning
    assert "GPUs h100-sxm5-80gb: limit 0 is below the 1 in use (1 reserved)" in warning
    assert "clusters" not in warning  # 5 >= 1
    assert 'name="confirm_below_use"' in box
    quota = Quota.objects.get(tenant=tenant_a)
    assert (quota.max_nodes, quota.max_gpus) == (before.max_nodes, before.max_gpus)
    assert not AuditEvent.objects.filter(action="quota.set").exists()

    response = ops_client.post(url, dict(limits, confirm_below_use="on"), follow=True)
    quota = Quota.objects.get(tenant=tenant_a)
    assert (quota.max_clusters, quota.max_nodes, quota.max_gpus) == (
        5,
        0,
        {"h100-sxm5-80gb": 0},
    )
    assert "Below use: nodes: limit 0 is below the 1 in use" in response.content.decode()
    assert AuditEvent.objects.get(action="quota.set").after["nodes"] == 0


def test_a_quota_at_or_above_use_needs_no_confirmation(ops_client, tenant_a, world):  # noqa: F811
    from tenants.models import Quota

    url = f"/console/tenants/{tenant_a.id}"
    limits = {"max_clusters": "1", "max_nodes": "1", "max_gpus": "h100-sxm5-80gb=1"}
    assert ops_client.post(url, limits).status_code == 302
    assert Quota.objects.get(tenant=tenant_a).max_nodes == 1


# --- invoices --------------------------------------------------------------------------------


def test_the_console_invoice_run_builds_no_invoice_for_the_month_before_the_tenant(
    ops_client,
    tenant_a,
    world,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    """Tenant A was created just now and holds a node (a ledger row from now): the console's
    "build" runs the billing worker's build for its previous and current month; the previous
    month ended before the tenant existed, so only the current month's draft exists."""
    from django.utils import timezone

    from billing.aggregation import get_account
    from billing.invoices import build_invoice
    from billing.models import Invoice
    from billing.periods import period_of
    from billing.prices import set_price
    from billing.tasks import build_tenant_invoices
    from nvke.errors import Conflict

    set_price(gpu_model="h100-sxm5-80gb", hourly_rate=Decimal("2.50"),
              effective_from=datetime(2026, 1, 1, tzinfo=UTC))  # fmt: skip
    assert ops_client.post("/console/invoices/build").status_code == 302
    build_tenant_invoices(str(tenant_a.id))  # what the billing worker runs for the message
    now = timezone.now()
    tz = get_account(tenant_a.id).time_zone
    current = period_of(tz, now)
    previous = period_of(tz, current.start - timedelta(seconds=1))
    assert list(Invoice.objects.filter(tenant=tenant_a).values_list("period_label", flat=True)) == [
        current.label
    ]
    with pytest.raises(Conflict) as refused:
        build_invoice(tenant_a.id, previous.label, now)
    assert refused.value.code == "period_before_tenant"


def test_the_console_offers_no_finalize_before_the_period_ends(ops_client, tenant_a, catalog):
    """The current month's draft: the API answers 409 period_not_ended, so the invoices page
    shows no Finalize button for it (it did) but when it can be finalized."""
    from django.utils import timezone

    from billing.aggregation import get_account
    from billing.invoices import build_invoice, finalize_invoice
    from billing.periods import period_of
    from nvke.errors import Conflict

    now = timezone.now()
    current = period_of(get_account(tenant_a.id).time_zone, now)
    draft = build_invoice(tenant_a.id, current.label, now)
    with pytest.raises(Conflict) as refused:
        finalize_invoice(draft.id, now)
    assert refused.value.code == "period_not_ended"
    html = ops_client.get("/console/invoices").content.decode()
    row = html[html.index(draft.number) :].split("</tr>")[0]
    assert "Finalize</button>" not in row
    end = timezone.localtime(current.end, UTC).strftime("%Y-%m-%d %H:%M")
    assert f"Finalize from {end} UTC, when {current.label} has ended" in row


# --- host drain: typed-name confirmation and live progress -----------------------------------


def test_drain_maintenance_and_retire_need_the_hosts_name_typed(
    ops_client,
    h100_host,
    make_host,
    world,  # noqa: F811
):
    """The confirmation page lists the node that would move (tenant, cluster, pool, node);
    no name or a wrong one is a 400 with the page again and the host unchanged."""
    from fleet.models import Host
    from nodepools.models import Node

    url = f"/console/hosts/{h100_host.id}"
    node = Node.objects.get(pk=world["node"])
    page = ops_client.get(url + "/confirm/retire").content.decode()
    table = page.split('id="disrupted-nodes"')[1].split("</table>")[0]
    assert f'<td>tenant-a</td><td>llm</td><td>train</td><td class="mono small">{node.name}' in (
        table
    )
    assert "Retiring is final" in page
    for action, body in [
        ("retire", {}),
        ("maintenance", {"confirm_name": "sim-h100-0"}),
        ("drain", {"target": "CORDONED", "confirm_name": "SIM-H100-01"}),
    ]:
        response = ops_client.post(f"{url}/{action}", body)
        assert response.status_code == 400, action
        assert Host.objects.get(pk=h100_host.pk).state == "ALLOCATED", action
    assert "type sim-h100-01 exactly to confirm" in response.content.decode()
    assert ops_client.get(url + "/confirm/explode").status_code == 404
    # a spare host takes the node (without one the drain is refused: test_console_commitments)
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="sim-h100-02")
    response = ops_client.post(url + "/maintenance", {"confirm_name": "sim-h100-01"})
    assert response.status_code == 302
    host = Host.objects.get(pk=h100_host.pk)
    assert (host.state, host.drain_target, host.drain_nodes) == ("CORDONED", "MAINTENANCE", 1)


def test_a_drain_flash_says_it_started_and_leaves_the_progress_to_the_live_part(
    ops_client,
    h100_host,
    make_host,
    world,  # noqa: F811
):
    """The flash after a maintenance drain said "… now CORDONED. draining: 0 of 1 node(s)
    moved" and stayed so above the live part while the node moved and the host reached
    MAINTENANCE. It now says only what started; the count is the live part's. Once the drain
    is over the flash is not shown again (a later page has no message)."""
    from fleet.models import Host

    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="sim-h100-02")  # spare
    url = f"/console/hosts/{h100_host.id}"
    page = ops_client.post(
        url + "/maintenance", {"confirm_name": "sim-h100-01"}, follow=True
    ).content.decode()
    flash = page.split('<ul class="messages" id="messages" role="status">')[1].split("</ul>")[0]
    assert flash.count("<li") == 1
    assert (
        "sim-h100-01: maintenance started, draining into MAINTENANCE; "
        "the nodes&#x27; moves are shown live below."
    ) in flash
    assert "of 1" not in flash and "CORDONED" not in flash
    assert Host.objects.get(pk=h100_host.pk).drain_target == "MAINTENANCE"
    live = ops_client.get(url + "?fragment=live", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="messages"' not in live  # the polled part never carries a flash
    for later in (url, "/console/", "/console/defrag"):
        assert 'id="messages"' not in ops_client.get(later).content.decode(), later
    # an action that is over at once still says the state it left
    cordoned = ops_client.post(f"/console/hosts/{h100_host.id}/uncordon", follow=True)
    assert "sim-h100-01: uncordon done, now " in cordoned.content.decode()


def test_the_host_page_shows_each_moving_node_live_with_replacement_and_blocker(
    ops_client,
    h100_host,
    make_host,
    world,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    """Drain sim-h100-01 into MAINTENANCE with a spare host: the live fragment shows tenant A's
    node ``replacing`` with its replacement PROVISIONING on the spare, then (converged) the
    node ``moved``, the host in MAINTENANCE and 1 of 1 node moved."""
    from nodepools.models import Node

    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="sim-h100-spare")
    old = Node.objects.get(pk=world["node"])
    url = f"/console/hosts/{h100_host.id}"
    with django_capture_on_commit_callbacks(execute=True):
        ops_client.post(url + "/maintenance", {"confirm_name": "sim-h100-01"})
    live = {"HTTP_HX_REQUEST": "true"}

    def row(html: str, name: str) -> str:
        return html.split(f'data-node="{name}"')[1].split("</tr>")[0]

    html = ops_client.get(url, {"fragment": "live"}, **live).content.decode()
    assert html.startswith('<div id="host-live"') and "<html" not in html
    assert "draining to MAINTENANCE: 0 of 1 node(s) moved, 1 pending" in html
    assert "<td>tenant-a</td><td>llm / train</td>" in row(html, old.name)

    from nodepools.reconcile import reconcile_nodepool

    reconcile_nodepool(world["pool"])  # marks it replacing, places the replacement
    new = Node.objects.filter(nodepool_id=world["pool"]).exclude(pk=old.pk).get()
    html = ops_client.get(url, {"fragment": "live"}, **live).content.decode()
    assert '<td class="move">replacing</td>' in row(html, old.name)
    assert f"{new.name} PROVISIONING on sim-h100-spare" in row(html, old.name)

    drive_pool(world["pool"])
    html = ops_client.get(url, {"fragment": "live"}, **live).content.decode()
    assert '<td class="move">moved</td>' in row(html, old.name)
    assert f"{new.name} READY on sim-h100-spare" in row(html, old.name)
    assert "drained to MAINTENANCE: 1 of 1 node(s) moved, none pending" in html
    assert '<span class="badge' in html.split('id="host-state"')[1].split("</span></span>")[0]
    assert "MAINTENANCE" in html.split('id="host-state"')[1].split("</span></span>")[0]


def test_a_blocked_node_shows_the_pods_and_their_budget_as_blocker(
    ops_client,
    h100_host,
    make_host,
    world,  # noqa: F811
    settings,
    django_capture_on_commit_callbacks,
):
    """The simulated provider reports a pod whose PodDisruptionBudget allows 0 disruptions on
    the node; with a 0 s drain timeout the move pauses ``drain-blocked`` and the page names it."""
    from clusters.providers import simulated
    from nodepools.models import Node
    from nodepools.reconcile import reconcile_nodepool

    blocker = "default/trainer-0 (PodDisruptionBudget trainer allows 0 disruptions)"
    settings.NVKE_HOST_DRAIN_TIMEOUT_S = 0
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="sim-h100-spare")
    old = Node.objects.get(pk=world["node"])
    simulated.simulate_drain_blockers(old.id, [blocker])
    try:
        url = f"/console/hosts/{h100_host.id}"
        with django_capture_on_commit_callbacks(execute=True):
            ops_client.post(url + "/maintenance", {"confirm_name": "sim-h100-01"})
        for _ in range(10):
            if reconcile_nodepool(world["pool"]) is None:
                break
            if Node.objects.get(pk=old.pk).move_state == "drain-blocked":
                break
        html = ops_client.get(url, {"fragment": "live"}, HTTP_HX_REQUEST="true").content.decode()
        cells = html.split(f'data-node="{old.name}"')[1].split("</tr>")[0]
        assert '<td class="move">drain-blocked</td>' in cells
        assert blocker in cells
    finally:
        simulated.simulate_drain_blockers(old.id, [])


# --- Xid events ------------------------------------------------------------------------------


@pytest.fixture
def xids(make_host, catalog):
    """Xids on two SIMULATED hosts, 1 minute apart from 2026-11-01 00:00 UTC:
    alpha GPU0: 79 (critical, RESTART_BM) x2; alpha GPU1: 13 (warning, RESTART_APP);
    beta GPU0: 48 (critical, WORKFLOW_XID_48), 43 (info, IGNORE), 999 (not in the catalog)."""
    from fleet.models import XidEvent

    alpha = make_host("h100-sxm5-80gb", gpus=2, hostname="alpha")
    beta = make_host("h100-sxm5-80gb", gpus=1, hostname="beta")
    a0, a1 = alpha.gpus.order_by("index").values_list("uuid", flat=True)
    (b0,) = beta.gpus.values_list("uuid", flat=True)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    plan = [(alpha, a0, 79), (alpha, a0, 79), (alpha, a1, 13), (beta, b0, 48), (beta, b0, 43)]
    plan.append((beta, b0, 999))
    for i, (host, gpu, code) in enumerate(plan):
        XidEvent.objects.create(
            host=host, gpu_uuid=gpu, ts=start + timedelta(minutes=i), xid=code, report_seq=i
        )
    return {"alpha": alpha, "beta": beta, "a0": a0, "a1": a1, "b0": b0}


def shown(html: str) -> list[str]:
    """The Xid codes of the listed rows, in order."""
    body = html.split('id="xid-events"')[1].split("</table>")[0]
    return [part.split('"')[0] for part in body.split('data-xid="')[1:]]


@pytest.mark.parametrize(
    ("query", "codes"),
    [
        ({}, ["999", "43", "48", "13", "79", "79"]),  # newest first
        ({"host": "alpha"}, ["13", "79", "79"]),
        ({"gpu": "a1"}, ["13"]),
        ({"xid": "79"}, ["79", "79"]),
        ({"severity": "critical"}, ["48", "79", "79"]),
        ({"action": "IGNORE"}, ["43"]),
        ({"severity": "critical", "host": "beta"}, ["48"]),
        # [00:02, 00:04): the 3rd and 4th events
        ({"since": "2026-11-01T00:02", "until": "2026-11-01T00:04"}, ["48", "13"]),
    ],
)
def test_the_xid_page_filters_by_host_gpu_code_catalog_and_time(ops_client, xids, query, codes):
    if "host" in query:
        query = dict(query, host=str(xids[query["host"]].id))
    if "gpu" in query:
        query = dict(query, gpu=xids[query["gpu"]])
    html = ops_client.get("/console/xids", query).content.decode()
    assert shown(html) == codes
    assert f"{len(codes)} event(s)" in html


def test_the_xid_filter_choices_come_from_real_values(ops_client, xids):
    html = ops_client.get("/console/xids").content.decode()
    select = html.split('name="xid"')[1].split("</select>")[0]
    assert [o.split('"')[0] for o in select.split('value="')[2:]] == ["13", "43", "48", "79", "999"]
    assert "999 (not in the catalog)" in select
    hosts = html.split('name="host"')[1].split("</select>")[0]
    assert ">alpha<" in hosts and ">beta<" in hosts


def test_the_xid_page_is_paginated_and_bounded(ops_client, xids):
    """126 events (6 + 120): 50 a page, page 3 holds 26; a page past the end, page 1001 and a
    reversed range are refused (400, the reason beside the filter, no events), never a 500."""
    from fleet.models import XidEvent

    alpha = xids["alpha"]
    XidEvent.objects.bulk_create(
        XidEvent(host=alpha, gpu_uuid=xids["a0"], ts=datetime(2026, 10, 1, tzinfo=UTC)
                 + timedelta(seconds=i), xid=31, report_seq=100 + i)
        for i in range(120)
    )  # fmt: skip
    first = ops_client.get("/console/xids").content.decode()
    assert len(shown(first)) == 50 and "126 event(s)" in first and "page 1 of 3" in first
    third = ops_client.get("/console/xids", {"page": "3"}).content.decode()
    assert len(shown(third)) == 26
    past = ops_client.get("/console/xids", {"page": "7"})
    assert past.status_code == 400 and shown(past.content.decode()) == []
    assert "Page: page 7 does not exist: these filters give 3 pages" in past.content.decode()
    filtered = ops_client.get("/console/xids", {"xid": "31", "page": "2"}).content.decode()
    assert len(shown(filtered)) == 50 and 'href="?xid=31&amp;page=3"' in filtered
    for bad, message in (
        ({"page": "1001"}, "Page: Ensure this value is less than or equal to 1000."),
        ({"page": "x"}, "Page: Enter a whole number."),
        ({"since": "2026-11-02T00:00", "until": "2026-11-01T00:00"}, "must be after From"),
    ):
        response = ops_client.get("/console/xids", bad)
        html = response.content.decode()
        assert response.status_code == 400 and shown(html) == [] and message in html, bad


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        ({"xid": "7777"}, "xid", "Select a valid choice. 7777 is not one of the available"),
        ({"severity": "fatal"}, "severity", "Select a valid choice. fatal is not one of the"),
        ({"action": "REBOOT"}, "action", "Select a valid choice. REBOOT is not one of the"),
        ({"host": "00000000-0000-0000-0000-000000000000"}, "host", "Select a valid choice."),
        ({"since": "yesterday"}, "since", "Enter a valid date/time."),
        (
            {"page": "\u0662"},
            "page",
            "Page: use ASCII digits (0-9)",
        ),  # Arabic-Indic 2: not ASCII digits
        ({"hots": "alpha"}, None, "not a filter of this page: “hots”; the filters are host,"),
    ],
)
def test_the_xid_page_refuses_bad_filter_values_beside_the_filter(
    ops_client, xids, query, field, message
):
    """Before, a value the form refused fell back silently (every event, or none with no
    reason); now each is a 400 whose reason sits next to its field (or atop the form)."""
    response = ops_client.get("/console/xids", query)
    html = response.content.decode()
    assert response.status_code == 400
    assert shown(html) == [] and "0 event(s)" in html
    assert message in html
    form = html.split('id="xid-filters"')[1].split("</form>")[0]
    if field and field != "page":
        beside = form.split(f'id="field-{field}"')[1].split('<div class="field')[0]
        assert 'class="error" role="alert"' in beside and message in beside
    elif field is None:
        assert '<div class="error form-error" role="alert">' in form and message in form


def test_the_overview_xid_table_scrolls_inside_its_card(ops_client, xids):
    """The recent-Xid table sat in a two-column grid and overflowed under the next card: it is
    a full-width card now, its table in a horizontal scroller, linking to the Xid page."""
    html = ops_client.get("/console/").content.decode()
    card = html.split('id="recent-xids"')[1].split("</section>")[0]
    assert '<div class="heatmap-wrap"><table class="list compact" id="xids">' in card
    assert 'href="/console/xids"' in card
    before = html.split('id="recent-xids"')[0]
    assert before.rstrip().endswith('</section>\n<section class="card"')  # not in a .cols grid
