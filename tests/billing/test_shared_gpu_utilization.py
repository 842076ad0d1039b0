"""Shared-GPU side channel (issue 26, item 5): two tenants hold one MIG GPU instance each on
one physical H100. Tenant B's utilization figures come from its own instance's samples only —
the whole-GPU samples include tenant A's memory (the report: one agent report moved B's
headroom from 100/100 to 75/50) — and nothing in B's answers names A."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

pytestmark = pytest.mark.django_db

GIB = 2**30
START = datetime(2026, 11, 9, 10, tzinfo=UTC)
END = START + timedelta(hours=2)


@pytest.fixture
def shared(world, tenant_a, tenant_b, list_prices):
    """A holds GPU instance 1, B GPU instance 2 of one H100, 10:00-12:00. Samples at 10:10 and
    11:10: A's instance 20 then 36 GiB of 40 used, B's 10 of 40 both times; the whole GPU
    (both tenants' memory) 30, 50 and 46 GiB of 80 at 10:10, 10:40, 11:10."""
    from billing.aggregation import aggregate_usage
    from billing.ledger import close_allocations, open_allocation
    from fleet.ingest import ingest_report

    host = world.make_host("h100-sxm5-80gb", gpus=1)
    (gpu,) = host.gpus.values_list("uuid", flat=True)
    pools = {}
    for tenant, gi in ((tenant_a, 1), (tenant_b, 2)):
        pool = world.pool(tenant, name=f"mig-{gi}")
        node = world.node(pool, host, [gpu], START)
        open_allocation(
            node=node,
            gpu_uuid=gpu,
            start=START,
            mig_gpu_instance_id=gi,
            mig_profile="3g.40gb",
            billable_fraction=Decimal("0.428571"),
        )
        close_allocations(node, END)
        pools[gi] = pool

    def sample(minute, gi, used, total):
        return {
            "ts": (START + timedelta(minutes=minute)).isoformat(),
            "gpu_uuid": gpu,
            "mig_gpu_instance_id": gi,
            "memory_used_bytes": used * GIB,
            "memory_total_bytes": total * GIB,
        }

    samples = [
        sample(10, None, 30, 80),
        sample(40, None, 50, 80),
        sample(70, None, 46, 80),
        sample(10, 1, 20, 40),
        sample(70, 1, 36, 40),
        sample(10, 2, 10, 40),
        sample(70, 2, 10, 40),
    ]
    ack = ingest_report(host, {"seq": 1, "samples": samples}, now=END)
    assert ack.samples_stored == 7
    for tenant in (tenant_a, tenant_b):  # utilization counts up to where usage is aggregated
        aggregate_usage(tenant.id, START, END, now=END)
    return {"gpu": gpu, "a": pools[1], "b": pools[2]}


def utilization(client, group_by="cluster"):
    resp = client.get(
        "/api/v1/utilization",
        {"start": START.isoformat(), "end": END.isoformat(), "group_by": group_by},
    )
    assert resp.status_code == 200, resp.content
    return resp.json()


def test_each_tenant_sees_its_own_instance_memory_only(owner, outsider, shared):
    (b,) = utilization(outsider)["groups"]
    # B: 10 of 40 GiB in both hours -> 75 % headroom, the least 75 %
    assert (b["memory_headroom_pct"], b["min_memory_headroom_pct"]) == ("75.00", "75.00")
    # 0.428571 x 2 h
    assert b["allocated_gpu_hours"] == "0.857142"
    (a,) = utilization(owner)["groups"]
    # A: 20/40 (10:00 hour) and 36/40 (11:00 hour), weighted equally -> 30 % headroom, least 10 %
    assert (a["memory_headroom_pct"], a["min_memory_headroom_pct"]) == ("30.00", "10.00")


def test_the_cluster_usage_counts_the_instances_own_samples(outsider, shared):
    cluster = shared["b"].cluster_id
    body = outsider.get(
        f"/api/v1/clusters/{cluster}/usage", {"start": START.isoformat(), "end": END.isoformat()}
    ).json()
    assert body["sample_count"] == 2  # B's instance: 2 samples (the whole GPU had 3)


def test_nothing_in_b_answers_names_its_co_tenant(outsider, shared, tenant_a):
    from billing.models import LedgerEntry

    a_ids = {
        str(tenant_a.id),
        str(shared["a"].id),
        str(shared["a"].cluster_id),
        *(
            str(pk)
            for pk in LedgerEntry.objects.filter(tenant=tenant_a).values_list("id", flat=True)
        ),
    }
    for group_by in ("cluster", "pool"):
        text = json.dumps(utilization(outsider, group_by))
        assert not [i for i in a_ids if f'"{i}"' in text or f": {i}," in text], group_by
    ledger = outsider.get("/api/v1/ledger").json()["results"]
    # B's own GPU instance only: its instance id, never A's
    assert [(r["mig_gpu_instance_id"], r["mig_profile"]) for r in ledger] == [(2, "3g.40gb")]
