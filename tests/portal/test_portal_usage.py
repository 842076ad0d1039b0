"""Usage and cost pages with a hand-worked example, and invoices.

One node of 8 x H100 (SIMULATED host) is READY on 2 November 2026 at 10:40 UTC and released at
12:10. The list price is 2.50 USD per GPU-hour, 3.00 from 11:30:

* 10:40-11:30: 8 GPUs x 3,000 s = 24,000 GPU-s x 2.50 / 3,600 = 16.666… USD
* 11:30-12:10: 8 GPUs x 2,400 s = 19,200 GPU-s x 3.00 / 3,600 = 16.00 USD

Total 43,200 GPU-s = 12 GPU-hours and 32.67 USD (32.666… rounded half-even); the invoice has
one line per price: 16.67 + 16.00 = 32.67 USD.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from tests.helpers import drive_cluster

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 10, 40, tzinfo=UTC)
LATER = datetime(2026, 12, 20, tzinfo=UTC)
WINDOW = "/usage?start=2026-11-02&end=2026-11-02"


@pytest.fixture
def ninety_minutes(tenant_a, h100_host, catalog):
    from billing.aggregation import aggregate_usage
    from billing.prices import set_price
    from clusters.services import create_cluster
    from nodepools.models import NodePool
    from nodepools.reconcile import reconcile_nodepool
    from nodepools.services import create_nodepool, delete_nodepool
    from tenants.principal import Principal

    set_price(
        gpu_model="h100-sxm5-80gb",
        hourly_rate=Decimal("2.50"),
        effective_from=datetime(2026, 11, 1, tzinfo=UTC),
    )
    set_price(
        gpu_model="h100-sxm5-80gb",
        hourly_rate=Decimal("3.00"),
        effective_from=T0 + timedelta(minutes=50),
    )
    owner = Principal(tenant_a, "owner", False, "user:alice")
    op = create_cluster(
        principal=owner, name="train", kubernetes_version="1.36", region="us-east-1"
    )
    drive_cluster(op.target_id)
    pool_op = create_nodepool(
        principal=owner,
        cluster=op.cluster,
        name="h100",
        gpu_model="h100-sxm5-80gb",
        gpus_per_node=8,
        node_count=1,
        isolation={"mode": "exclusive"},
    )
    for _ in range(5):
        if reconcile_nodepool(pool_op.target_id, now=T0) is None:
            break
    delete_nodepool(principal=owner, pool=NodePool.objects.get(pk=pool_op.target_id))
    for _ in range(5):
        if reconcile_nodepool(pool_op.target_id, now=T0 + timedelta(minutes=90)) is None:
            break
    aggregate_usage(tenant_a.id, T0, T0 + timedelta(hours=3), now=LATER)
    return op.target_id, pool_op.target_id


def test_usage_and_cost_of_the_ninety_minutes(alice_client, ninety_minutes):
    html = alice_client.get(WINDOW).content.decode()
    assert '<span class="big" id="total-gpu-hours">12.000</span>' in html
    assert '<span class="big" id="total-cost">32.67 USD</span>' in html
    assert "<tr><td>2026-11-02</td><td>12.000</td><td>12.000</td><td>32.67 USD</td></tr>" in html
    chart = json.loads(
        re.search(r'id="usage-data" type="application/json">(.*?)</script>', html)[1]
    )
    assert chart == {
        "labels": ["2026-11-02"],
        "gpu_hours": [12.0],
        "cost": [32.67],
        "currency": "USD",
    }
    by_cluster = html.split('id="by-cluster"')[1].split("</table>")[0]
    assert ">train</a></td><td>12.000</td><td>32.67 USD</td>" in by_cluster
    by_pool = html.split('id="by-pool"')[1].split("</table>")[0]
    assert "<td>h100</td><td>12.000</td><td>32.67 USD</td>" in by_pool
    by_model = html.split('id="by-model"')[1].split("</table>")[0]
    assert "<td>h100-sxm5-80gb</td><td>12.000</td><td>2.5, 3 USD</td><td>32.67 USD</td>" in by_model
    # the CSV download is the API's, with the same session
    csv_url = re.search(r'href="(/api/v1/usage\.csv\?[^"]+)" download', html)[1]
    assert csv_url == (
        "/api/v1/usage.csv?start=2026-11-02T00%3A00%3A00Z&amp;end=2026-11-03T00%3A00%3A00Z"
        "&amp;group_by=day%2Ccluster%2Cpool%2Cmodel%2Cprofile"
    )
    csv = alice_client.get(csv_url.replace("&amp;", "&"))
    assert csv.status_code == 200 and csv["Content-Type"].startswith("text/csv")
    body = csv.content.decode()
    assert body.splitlines()[0].startswith("day,cluster_id,nodepool_id,gpu_model,mig_profile")
    seconds = sum(Decimal(line.split(",")[-1]) for line in body.splitlines()[1:] if line.strip())
    assert seconds == Decimal(43200)


def test_another_tenant_sees_none_of_it(outsider_client, ninety_minutes):
    html = outsider_client.get(WINDOW).content.decode()
    assert '<span class="big" id="total-gpu-hours">0.000</span>' in html
    assert "train" not in html


def test_recompute_enqueues_the_billing_task_once(alice_client, tenant_a):
    from django.core.cache import cache

    key = f"enqueued:billing.tasks.aggregate_tenant_usage:{tenant_a.id}"
    cache.delete(key)
    try:
        first = alice_client.post("/usage/refresh", follow=True).content.decode()
        assert "Usage is being recomputed" in first
        assert cache.get(key) == 1
        second = alice_client.post("/usage/refresh", follow=True).content.decode()
        assert "A recomputation is already queued." in second
    finally:
        cache.delete(key)


def test_invoices_list_their_totals_and_lines(
    alice_client, outsider_client, ninety_minutes, tenant_a
):
    from billing.invoices import build_invoice

    invoice = build_invoice(tenant_a.id, "2026-11", LATER)
    listing = alice_client.get("/invoices").content.decode()
    assert invoice.number in listing and "<strong>32.67 USD</strong>" in listing
    assert f'href="/api/v1/invoices/{invoice.id}.csv" download' in listing
    detail = alice_client.get(f"/invoices/{invoice.id}").content.decode()
    amounts = re.findall(r"<td>(\d+\.\d\d)</td></tr>", detail)
    assert sorted(amounts) == ["16.00", "16.67"]
    assert outsider_client.get(f"/invoices/{invoice.id}").status_code == 404
    assert outsider_client.get(f"/api/v1/invoices/{invoice.id}.csv").status_code == 404


def test_a_usage_window_in_the_future_shows_nothing_instead_of_a_server_error(
    alice_client, ninety_minutes
):
    """Found by the hostile-tenant probe: ``/usage?end=2199-12-31`` (the window clamped to its
    last 31 days, all in the future) was a 500; the ninety minutes of 2026-11-02 are not in it."""
    response = alice_client.get("/usage?end=2199-12-31")
    assert response.status_code == 200
    html = response.content.decode()
    assert '<span class="big" id="total-gpu-hours">0.000</span>' in html


def test_the_price_column_of_usage_a_reservation_covers_whole_names_it():
    """A fresh-user trial read "no price" in the By GPU model row of GB200 usage that its
    reservation r-1f2dfd37 covered whole (the API: cost 0.00, no cost_error); "no price" is
    for a missing price only."""
    from decimal import Decimal

    from portal.queries import Sums

    covered = Sums()
    covered.add_usage(Decimal(3600), Decimal(0))
    covered.add_covered(Decimal(3600), "r-1f2dfd37", "USD")
    assert (covered.price_text, covered.rounded_cost) == (
        "covered by reservation r-1f2dfd37",
        {"USD": Decimal("0.00")},
    )
    priced = Sums()
    priced.add_cost("USD", Decimal("2.50"), Decimal("2.5"))
    assert priced.price_text == "2.5 USD"
    unpriced = Sums(missing=[{"code": "missing_price"}])
    assert unpriced.price_text == "no price"
    assert Sums().price_text == "—"
