"""The README's billing example (section "Billing"), built exactly as written there: tenant
acme, November 2026 (UTC, USD). If this test changes, change the README with it."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

pytestmark = pytest.mark.django_db


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_the_readme_invoice(world, catalog):
    from billing.invoices import build_invoice
    from billing.ledger import close_allocations, open_allocation
    from billing.prices import set_price
    from fleet.health import handle_xid, mark_healthy
    from fleet.models import XidEvent
    from tenants.models import Tenant

    acme = Tenant.objects.create(name="acme")
    set_price(
        gpu_model="h100-sxm5-80gb",
        hourly_rate=Decimal("2.50"),
        effective_from=utc(2026, 1, 1),
        label="list",
    )
    set_price(
        gpu_model="h100-sxm5-80gb",
        hourly_rate=Decimal("3.00"),
        effective_from=utc(2026, 11, 10, 14, 30),
        label="list",
    )
    set_price(
        gpu_model="h100-sxm5-80gb",
        mig_profile="1g.10gb",
        hourly_rate=Decimal("2.80"),
        effective_from=utc(2026, 1, 1),
        label="list 1g.10gb",
    )
    hosts = [world.make_host("h100-sxm5-80gb", gpus=8, hostname=f"h100-{i}") for i in range(4)]
    train = world.pool(acme, cluster="train", name="h100")
    batch = world.pool(acme, cluster="batch", name="h100")
    shared = world.pool(
        acme,
        cluster="infer",
        name="mig",
        isolation={"mode": "mig", "mig_profile": "1g.10gb", "sharing": "cross-tenant"},
    )
    # (1) 2 nodes x 8 H100, 2 Nov 10:40-12:10
    world.hold(train, hosts[0], utc(2026, 11, 2, 10, 40), utc(2026, 11, 2, 12, 10))
    world.hold(train, hosts[1], utc(2026, 11, 2, 10, 40), utc(2026, 11, 2, 12, 10))
    # (2) 8 H100, 5 Nov 10:00-13:00; Xid 79 on GPU index 3 at 11:35, recovered 12:00
    world.hold(train, hosts[2], utc(2026, 11, 5, 10), utc(2026, 11, 5, 13))
    bad = hosts[2].gpus.get(index=3).uuid
    event = XidEvent.objects.create(
        host=hosts[2], gpu_uuid=bad, ts=utc(2026, 11, 5, 11, 35), xid=79, report_seq=1
    )
    handle_xid(hosts[2], event, event.ts)  # the fleet's unhealthy interval opens at 11:35
    mark_healthy(hosts[2], [bad], actor="operator", now=utc(2026, 11, 5, 12))  # ... and ends
    # (3) 8 H100, 10 Nov 12:00-16:00, across the 14:30 price change
    world.hold(batch, hosts[3], utc(2026, 11, 10, 12), utc(2026, 11, 10, 16))
    # (4) one 1g.10gb GPU instance (NVML GI id 9) of a GPU shared with other tenants, 3 Nov 10-11
    gpu = hosts[0].gpus.get(index=0).uuid
    node = world.node(shared, hosts[0], [gpu], utc(2026, 11, 3, 10))
    open_allocation(
        node=node,
        gpu_uuid=gpu,
        start=utc(2026, 11, 3, 10),
        mig_gpu_instance_id=9,
        mig_profile="1g.10gb",
    )
    close_allocations(node, utc(2026, 11, 3, 11))

    invoice = build_invoice(acme.id, "2026-11", now=utc(2026, 12, 2))
    got = [
        (ln.kind, ln.gpu_seconds.normalize(), ln.gpu_hours, ln.unit_price.normalize(), ln.amount)
        for ln in invoice.lines.all()
    ]
    for ln in invoice.lines.all():
        print(ln.position, ln.description, ln.amount)
    assert got == [
        ("USAGE", Decimal(72000), Decimal(20), Decimal("2.5"), Decimal("50.00")),
        ("USAGE", Decimal(43200), Decimal(12), Decimal(3), Decimal("36.00")),
        ("USAGE", Decimal("514.2852"), Decimal("0.142857"), Decimal("2.8"), Decimal("0.40")),
        ("USAGE", Decimal(172800), Decimal(48), Decimal("2.5"), Decimal("120.00")),
        ("SLA_CREDIT", Decimal(-12000), Decimal("-3.333333"), Decimal("2.5"), Decimal("-8.33")),
    ]
    assert (invoice.usage_amount, invoice.credit_amount, invoice.total) == (
        Decimal("206.40"),
        Decimal("-8.33"),
        Decimal("198.07"),
    )

    from billing.models import UsageRecord
    from billing.reports import usage_rows

    rows, _ = usage_rows(
        UsageRecord.objects.filter(tenant=acme), ["pool"], utc(2026, 11, 1), utc(2026, 12, 1)
    )
    assert sorted(
        (r["nodepool_name"], r["gpu_hours"], r["sla_credit_gpu_hours"]) for r in rows
    ) == [
        ("h100", Decimal(32), Decimal(0)),  # batch / h100
        ("h100", Decimal(48), Decimal("3.333333")),  # train / h100
        ("mig", Decimal("0.142857"), Decimal(0)),
    ]
