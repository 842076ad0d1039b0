"""One meaning per name (issue 33; a fresh-user trial of ``make run``): ``/api/v1/usage``
``totals.allocated_hours`` (0.444189) counted each shared 1g.10gb instance-hour as a full hour,
while ``/api/v1/utilization`` ``allocated_gpu_hours`` weighted it by its fraction (0.020004 for
the shared pool), and ``allocated_hours`` was not documented. Now every ``…gpu_hours`` is
weighted by the billable fraction, and the unweighted count is ``device_hours``.

Worked by hand, March 2026 (UTC): pool ``shared`` (MIG shared across tenants) holds three
1g.10gb instances (fraction 0.142857) of one H100 on 14 March 00:00-02:00: 6 device-hours,
6 x 0.142857 = 0.857142 GPU-h; pool ``whole`` holds 1 H100 on 15 March 00:00-01:00: 1
device-hour, 1 GPU-h. Totals: 7 device-hours, 1.857142 GPU-h.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest

pytestmark = pytest.mark.django_db

H100 = "h100-sxm5-80gb"
NOW = datetime(2026, 4, 2, tzinfo=UTC)
WINDOW = {"start": "2026-03-01T00:00:00Z", "end": "2026-04-01T00:00:00Z"}


def t(day, hour=0):
    return datetime(2026, 3, day, hour, tzinfo=UTC)


@pytest.fixture
def pools(world, tenant_a, list_prices):
    from billing.aggregation import aggregate_usage
    from billing.ledger import close_allocations, open_allocation

    host = world.make_host(H100, gpus=2)
    g0, g1 = list(host.gpus.order_by("index").values_list("uuid", flat=True))
    shared = world.pool(
        tenant_a,
        name="shared",
        gpus_per_node=1,
        isolation={"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"},
    )
    for gi in (7, 8, 9):
        node = world.node(shared, host, [g0], t(14))
        row = open_allocation(
            node=node, gpu_uuid=g0, start=t(14), mig_gpu_instance_id=gi, mig_profile="1g.10gb"
        )
        assert str(row.billable_fraction) == "0.142857"
        close_allocations(node, t(14, 2))
    world.hold(world.pool(tenant_a, name="whole", gpus_per_node=1), host, t(15), t(15, 1), [g1])
    aggregate_usage(tenant_a.id, *(datetime.fromisoformat(v) for v in WINDOW.values()), now=NOW)


def test_gpu_hours_are_weighted_everywhere_and_device_hours_are_not(owner, pools):
    usage = owner.get("/api/v1/usage", {**WINDOW, "group_by": "pool"}).json()
    rows = {r["nodepool_name"]: (r["gpu_hours"], r["device_hours"]) for r in usage["results"]}
    assert rows == {"shared": ("0.857142", "6.000000"), "whole": ("1.000000", "1.000000")}
    totals = usage["totals"]
    assert (totals["gpu_hours"], totals["device_hours"]) == ("1.857142", "7.000000")
    assert "allocated_hours" not in totals  # the old name, which read as allocated GPU-hours
    assert all("allocated_hours" not in r for r in usage["results"])

    util = owner.get("/api/v1/utilization", {**WINDOW, "group_by": "pool"}).json()
    allocated = {g["nodepool_id"]: g["allocated_gpu_hours"] for g in util["groups"]}
    # the same GPU-hours as usage's gpu_hours, pool by pool (the shared pool: 0.857142, not 6)
    assert allocated == {r["nodepool_id"]: r["gpu_hours"] for r in usage["results"]}

    text = owner.get("/api/v1/usage.csv", {**WINDOW, "group_by": "pool"}).content.decode()
    by_pool = {r["nodepool_name"]: r for r in csv.DictReader(io.StringIO(text))}
    assert (by_pool["shared"]["gpu_hours"], by_pool["shared"]["device_hours"]) == (
        "0.857142",
        "6.000000",
    )
    assert "allocated_hours" not in by_pool["shared"]


def test_the_docs_name_each_field_once():
    """docs/tenant/usage-and-invoices.md defines both names with the hand-worked numbers, and
    the usage API's own description (the OpenAPI schema) says device_hours is not GPU-hours."""
    from pathlib import Path

    from billing.api.views import UsageView, UtilizationView

    doc = (Path(__file__).resolve().parents[2] / "docs/tenant/usage-and-invoices.md").read_text()
    assert "## GPU-hours and device-hours" in doc
    assert "`device_hours` 6, `gpu_hours`\n6 x 0.142857 = 0.857142" in doc
    assert "``device_hours`` (not GPU-hours" in UsageView.__doc__
    assert "``allocated_gpu_hours`` (GPU-hours, weighted by the billable fraction" in (
        UtilizationView.__doc__
    )
