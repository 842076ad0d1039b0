"""Global serial ids leak co-tenant activity (issue 26, item 5): ledger rows were numbered by
one sequence for everyone, so tenant B reading its rows ``7, 11`` learned that someone else
allocated three GPUs in between. B's ledger (API and CSV) now names rows by a random public UUID
(nvke/public_ids.py): nothing B reads changes when A allocates."""

from __future__ import annotations

import csv
import io
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 9, 10, tzinfo=UTC)


@pytest.fixture
def hosts(world):
    return world.make_host("h100-sxm5-80gb", gpus=4), world.make_host("h100-sxm5-80gb", gpus=4)


def allocate(world, tenant, host, index, start, name):
    """One node of ``tenant`` holding GPU ``index`` of ``host`` for an hour from ``start``."""
    gpu = host.gpus.get(index=index).uuid
    pool = world.pool(tenant, name=name)
    world.hold(pool, host, start, start + timedelta(hours=1), gpus=[gpu])
    return pool, gpu


def b_views(client) -> tuple[list[dict], list[dict]]:
    """What B reads: the ledger (JSON, every page) and ledger.csv."""
    body = client.get("/api/v1/ledger", {"limit": 100}).json()
    assert body["next"] is None
    text = client.get("/api/v1/ledger.csv").content.decode()
    return body["results"], list(csv.DictReader(io.StringIO(text)))


def expected_row(tenant, pool, host, gpu, start):
    """B's row computed from what B did, not read back from the API; ``id`` checked apart."""
    from billing.models import LedgerEntry

    node = pool.nodes.get()
    public_id = LedgerEntry.objects.get(node=node).public_id
    assert public_id.version == 4  # random: no sequence behind it
    return {
        "id": str(public_id),
        "tenant": str(tenant.id),
        "cluster": str(pool.cluster_id),
        "nodepool": str(pool.id),
        "node": str(node.id),
        "host": str(host.id),
        "gpu_uuid": gpu,
        "gpu_model": "h100-sxm5-80gb",
        "mig_profile": "",
        "mig_gpu_instance_id": None,
        "billable_fraction": "1.000000",
        "start": start.isoformat(),
        "end": (start + timedelta(hours=1)).isoformat(),
    }


def test_b_reads_nothing_that_changes_when_a_allocates(world, hosts, tenant_a, tenant_b, outsider):
    from billing.models import LedgerEntry

    h1, h2 = hosts
    b1 = allocate(world, tenant_b, h1, 0, T0, "b1")
    before_a = b_views(outsider)
    # A allocates three GPUs (on B's host too) between B's two allocations, and more after
    for i in (1, 2, 3):
        allocate(world, tenant_a, h1 if i == 1 else h2, i, T0, f"a{i}")
    assert b_views(outsider) == before_a  # byte for byte: A's allocations are invisible
    b2 = allocate(world, tenant_b, h2, 0, T0 + timedelta(hours=2), "b2")
    after_b2 = b_views(outsider)
    allocate(world, tenant_a, h1, 3, T0 + timedelta(hours=2), "a4")
    assert b_views(outsider) == after_b2

    rows, csv_rows = after_b2
    want = [
        expected_row(tenant_b, b1[0], h1, b1[1], T0),
        expected_row(tenant_b, b2[0], h2, b2[1], T0 + timedelta(hours=2)),
    ]
    assert rows == want
    assert [r["id"] for r in csv_rows] == [w["id"] for w in want]
    assert [(r["node_id"], r["gpu_uuid"]) for r in csv_rows] == [
        (w["node"], w["gpu_uuid"]) for w in want
    ]
    # no serial of any ledger row (B's or A's) is anywhere in what B reads
    serials = {str(pk) for pk in LedgerEntry.objects.values_list("id", flat=True)}
    assert len(serials) == 6
    values = {str(v) for r in rows for v in r.values()} | {v for r in csv_rows for v in r.values()}
    assert not serials & values
    for r in rows:
        uuid.UUID(r["id"])
    assert "public_id" not in json.dumps(rows)


def test_the_migration_rewrites_serials_in_stored_credit_details_even_when_finalized(
    world, hosts, tenant_b
):
    """Credit lines stored before public ids named ledger rows and health intervals by their
    serials; migration billing 0008 rewrites them (finalized invoices too), nothing else."""
    import importlib
    from decimal import Decimal

    from django.db import DatabaseError, connection, transaction

    from billing.models import Invoice, InvoiceLine, LedgerEntry
    from fleet.models import GpuHealthInterval

    h1, _ = hosts
    pool, gpu = allocate(world, tenant_b, h1, 0, T0, "b1")
    entry = LedgerEntry.objects.get(nodepool=pool)
    interval = GpuHealthInterval.objects.create(
        gpu=h1.gpus.get(uuid=gpu), gpu_uuid=gpu, host=h1, started_at=T0, reason="xid", xid=48
    )
    invoice = Invoice.objects.create(
        tenant=tenant_b,
        number="INV-B-1",
        period_label="2026-11",
        period_start=datetime(2026, 11, 1, tzinfo=UTC),
        period_end=datetime(2026, 12, 1, tzinfo=UTC),
        time_zone="UTC",
        currency="USD",
    )
    old = [
        {"gpu_uuid": gpu, "ledger_entry_id": entry.id, "health_interval_id": interval.pk},
        {"gpu_uuid": gpu, "ledger_entry_id": 999_999, "health_interval_id": 0},
    ]
    line = InvoiceLine.objects.create(
        invoice=invoice,
        position=1,
        kind="SLA_CREDIT",
        gpu_model="h100-sxm5-80gb",
        unit_price=Decimal(2),
        gpu_seconds=Decimal(-60),
        gpu_hours=Decimal("-0.016667"),
        amount=Decimal("-0.0333"),
        description="credit",
        details=old,
    )
    Invoice.objects.filter(pk=invoice.pk).update(status="FINALIZED")
    migration = importlib.import_module("billing.migrations.0008_ledgerentry_public_id")
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the test's own deferred FK checks
        cursor.execute(migration.REWRITE_DETAILS)
    line.refresh_from_db()
    assert line.details == [
        {
            "gpu_uuid": gpu,
            "ledger_entry_id": str(entry.public_id),
            "health_interval_id": str(interval.public_id),
        },
        {"gpu_uuid": gpu, "ledger_entry_id": None, "health_interval_id": None},
    ]
    assert line.amount == Decimal("-0.0333")
    with pytest.raises(DatabaseError), transaction.atomic():  # the trigger is back on
        InvoiceLine.objects.filter(pk=line.pk).update(description="changed")
