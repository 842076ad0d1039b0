"""Every tenant view of a draft whose rebuild failed says so (issue 33; a fresh-user trial of
``make run``): the account was set to EUR (``manage.py billing account --currency EUR``), the
console's Build drafts now failed (``missing_price``) and said "Rebuild failed … lines are
stale", the API's invoice had ``build_error``, but ``nvkectl invoices`` and the portal's
``/invoices`` and ``/invoices/{id}`` still read ``DRAFT … 1.85 USD`` with no warning.

Worked by hand: tenant A (UTC) held 1 H100 on 2026-03-10 00:00-04:00 at the list price 2.50 USD
per GPU-hour: the draft of 2026-03, built 2026-04-02 00:00 UTC, is 4 x 2.50 = 10.00 USD. Then the
account's currency is EUR and the rebuild at 01:00 fails: no EUR price. Every view keeps the
stale 10.00 USD and says why: ``Rebuild failed 2026-04-02 01:00 UTC: no EUR price for
h100-sxm5-80gb (whole GPU) at 2026-03-10 00:00:00+00:00 (missing_price); the lines and total are
stale (from the build of 2026-04-02 00:00 UTC)``.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command

from tests.portal.conftest import alice, alice_client, portal_user  # noqa: F401

H100 = "h100-sxm5-80gb"
BUILT = datetime(2026, 4, 2, tzinfo=UTC)
FAILED = BUILT + timedelta(hours=1)
DETAIL = "no EUR price for h100-sxm5-80gb (whole GPU) at 2026-03-10 00:00:00+00:00"
TEXT = (
    f"Rebuild failed 2026-04-02 01:00 UTC: {DETAIL} (missing_price); the lines and total are "
    "stale (from the build of 2026-04-02 00:00 UTC)"
)


@pytest.fixture
def stale_draft(world, tenant_a):
    from billing.invoices import build_invoice
    from billing.models import Invoice
    from billing.prices import set_price
    from nvke.errors import Conflict

    set_price(
        gpu_model=H100,
        hourly_rate=Decimal("2.50"),
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
        label="list",
    )
    pool = world.pool(tenant_a, name="od", gpus_per_node=1)
    start = datetime(2026, 3, 10, tzinfo=UTC)
    world.hold(pool, world.make_host(H100, gpus=1), start, end=start + timedelta(hours=4))
    draft = build_invoice(tenant_a.id, "2026-03", now=BUILT)
    assert (draft.total, draft.currency, draft.build_error) == (Decimal("10.00"), "USD", None)
    call_command("billing", "account", "--tenant", str(tenant_a.id), "--currency", "EUR")
    with pytest.raises(Conflict):
        build_invoice(tenant_a.id, "2026-03", now=FAILED)
    return Invoice.objects.get(pk=draft.pk)


@pytest.mark.django_db
def test_the_stored_fact_and_its_text(stale_draft):
    assert (stale_draft.status, stale_draft.total, stale_draft.currency) == (
        "DRAFT",
        Decimal("10.00"),
        "USD",
    )
    assert (stale_draft.build_error["code"], stale_draft.build_error["detail"]) == (
        "missing_price",
        DETAIL,
    )
    assert stale_draft.build_error_text == TEXT


@pytest.mark.django_db
def test_the_api_and_its_csvs_say_the_draft_is_stale(owner, stale_draft):
    (listed,) = owner.get("/api/v1/invoices").json()["results"]
    detail = owner.get(f"/api/v1/invoices/{stale_draft.id}").json()
    for body in (listed, detail):
        assert (body["status"], body["total"], body["currency"]) == ("DRAFT", "10.00", "USD")
        assert (body["build_error"]["code"], body["build_error"]["detail"]) == (
            "missing_price",
            DETAIL,
        )
    (row,) = csv.DictReader(io.StringIO(owner.get("/api/v1/invoices.csv").content.decode()))
    assert (row["status"], row["total"], row["build_error"]) == ("DRAFT", "10.00", TEXT)
    (line,) = csv.DictReader(
        io.StringIO(owner.get(f"/api/v1/invoices/{stale_draft.id}.csv").content.decode())
    )
    assert (line["amount"], line["invoice_build_error"]) == ("10.00", TEXT)


@pytest.mark.django_db
def test_the_portal_invoice_pages_say_the_draft_is_stale(alice_client, stale_draft):  # noqa: F811
    listing = alice_client.get("/invoices").content.decode()
    assert "<strong>10.00 USD</strong>" in listing
    assert (
        f'<td>DRAFT<div class="error small stale-draft" role="alert">{TEXT}. An operator must add '
        "the missing price; until a rebuild succeeds this draft cannot be finalized.</div></td>"
    ) in listing.replace("&#x27;", "'")
    page = alice_client.get(f"/invoices/{stale_draft.id}").content.decode()
    assert '<span class="badge bad">stale</span>' in page
    assert f'<div class="error small stale-draft" role="alert">{TEXT}.' in page


@pytest.mark.django_db
def test_a_draft_that_rebuilt_shows_no_warning(alice_client, owner, stale_draft):  # noqa: F811
    """With the account back in USD the rebuild succeeds and clears the mark: no view warns."""
    from billing.invoices import build_invoice

    call_command("billing", "account", "--tenant", str(stale_draft.tenant_id), "--currency", "USD")
    build_invoice(stale_draft.tenant_id, "2026-03", now=FAILED + timedelta(hours=1))
    assert "stale" not in alice_client.get("/invoices").content.decode()
    assert "stale" not in alice_client.get(f"/invoices/{stale_draft.id}").content.decode()
    (row,) = csv.DictReader(io.StringIO(owner.get("/api/v1/invoices.csv").content.decode()))
    assert row["build_error"] == ""


@pytest.mark.django_db(transaction=True)
def test_nvkectl_invoices_says_the_draft_is_stale(live_server, tmp_path, monkeypatch, stale_draft):
    """The real command, in-process, against the live server: the list reads DRAFT (stale)
    and the note says why; ``nvkectl invoices NUMBER`` shows the lines and says the same."""
    from nvkectl.main import app
    from typer.testing import CliRunner

    from tenants.services import create_api_key

    key = create_api_key(tenant=stale_draft.tenant, name="cli", role="viewer")[1]
    monkeypatch.setenv("NVKECTL_CONFIG", str(tmp_path / "nvkectl.yaml"))
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    ctx = ["config", "set-context", "t", "--server", live_server.url, "--api-key", key]
    assert runner.invoke(app, ctx).exit_code == 0
    note = (
        f"{stale_draft.number}: rebuild failed 2026-04-02 01:00 UTC: {DETAIL} (missing_price); "
        "its lines and total are stale (from the build of 2026-04-02 00:00 UTC) and it cannot "
        "be finalized until an operator adds the missing price"
    )

    listed = runner.invoke(app, ["invoices"])
    assert listed.exit_code == 0, listed.output
    (row,) = [ln for ln in listed.stdout.splitlines() if stale_draft.number in ln]
    assert row.split()[1:] == ["2026-03", "DRAFT", "(stale)", "USD", "10.00", "0.00", "10.00"]
    assert listed.stderr.strip() == note

    one = runner.invoke(app, ["invoices", stale_draft.number])
    assert one.exit_code == 0, one.output
    assert one.stderr.strip().splitlines() == [
        f"{stale_draft.number} 2026-03 DRAFT (stale): total 10.00 USD",
        note,
    ]
    (line,) = [ln for ln in one.stdout.splitlines() if ln.strip().startswith("1 ")]
    assert line.split()[-1] == "10.00"

    missing = runner.invoke(app, ["invoices", "NVKE-nope"])
    assert missing.exit_code == 1
