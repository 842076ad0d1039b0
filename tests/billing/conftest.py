"""Billing fixtures: clusters, pools and nodes written directly (SIMULATED placement), so a
test can put allocations exactly where a hand-worked example needs them."""

from __future__ import annotations

import secrets
from datetime import datetime
from decimal import Decimal

import pytest


@pytest.fixture
def world(catalog, make_host):
    """Builders: ``world.pool(tenant, ...)``, ``world.node(pool, host, gpus, ready_at)``."""
    from clusters.choices import Phase
    from clusters.models import Cluster
    from nodepools.choices import NodePhase
    from nodepools.models import Node, NodePool

    host_factory = make_host

    class World:
        make_host = staticmethod(host_factory)

        @staticmethod
        def pool(
            tenant,
            *,
            name: str = "pool",
            cluster: str = "train",
            model: str = "h100-sxm5-80gb",
            isolation: dict | None = None,
            gpus_per_node: int = 8,
        ) -> NodePool:
            c = Cluster.objects.filter(tenant=tenant, name=cluster).first()
            if c is None:
                c = Cluster.objects.create(
                    tenant=tenant,
                    name=cluster,
                    kubernetes_version="1.36",
                    region="us-east-1",
                    phase=Phase.RUNNING,
                )
            return NodePool.objects.create(
                tenant=tenant,
                cluster=c,
                name=name,
                gpu_model_id=model,
                gpus_per_node=gpus_per_node,
                node_count=1,
                isolation=isolation or {"mode": "exclusive"},
                phase=Phase.RUNNING,
            )

        @staticmethod
        def node(pool, host, gpu_uuids: list[str], ready_at: datetime) -> Node:
            return Node.objects.create(
                tenant_id=pool.tenant_id,
                cluster_id=pool.cluster_id,
                nodepool=pool,
                name=f"{pool.name}-{secrets.token_hex(3)}",
                phase=NodePhase.READY,
                host=host,
                zone=host.zone,
                gpu_uuids=gpu_uuids,
                ready_at=ready_at,
            )

        @staticmethod
        def hold(pool, host, ready_at, end=None, gpus=None):
            """A node on ``host`` holding ``gpus`` (default: all) whole, opened (and closed)."""
            from billing.ledger import close_allocations, open_allocation

            uuids = gpus or list(host.gpus.order_by("index").values_list("uuid", flat=True))
            node = World.node(pool, host, uuids, ready_at)
            for uuid in uuids:
                open_allocation(node=node, gpu_uuid=uuid, start=ready_at)
            if end is not None:
                close_allocations(node, end)
            return node

    return World()


@pytest.fixture
def tenant_c(db):
    from tenants.models import Tenant

    return Tenant.objects.create(name="tenant-c")


@pytest.fixture
def list_prices(catalog):
    """List prices from 2026-01-01 UTC: H100 2.50 USD/GPU-h, A100 1.80, H200 3.20."""
    from datetime import UTC

    from billing.prices import set_price

    start = datetime(2026, 1, 1, tzinfo=UTC)
    for model, rate in [
        ("h100-sxm5-80gb", "2.50"),
        ("a100-sxm4-80gb", "1.80"),
        ("h200-sxm-141gb", "3.20"),
    ]:
        set_price(gpu_model=model, hourly_rate=Decimal(rate), effective_from=start, label="list")
