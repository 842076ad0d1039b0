"""Test helpers: drive reconcilers to convergence, snapshot tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connection


def database_url() -> str:
    """``DATABASE_URL`` of the test database, for processes a test starts (worker, gunicorn).

    A Unix-socket host (the embedded PostgreSQL) is written the way django-environ reads it
    (:func:`nvke.embedded.postgres.database_url`); a TCP host as ``host:port``.
    """
    from nvke.embedded.postgres import database_url as socket_database_url

    s = connection.settings_dict
    host = s.get("HOST") or "127.0.0.1"
    if host.startswith("/"):
        return socket_database_url(host, s["NAME"], user=s["USER"], port=int(s.get("PORT") or 5432))
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{host}:{s.get('PORT') or 5432}/{s['NAME']}"


def broker_client():
    """A redis-py client on the Celery broker's database (``settings.CELERY_BROKER_URL``)."""
    import redis
    from django.conf import settings

    from nvke.observability import broker_redis_url

    return redis.Redis.from_url(broker_redis_url(settings.CELERY_BROKER_URL))


#: the inventory fields of one GPU in the agent's wire format (agent/README.md)
WIRE_GPU_FIELDS = (
    "uuid", "index", "pci_bus_id", "minor_number", "product_name", "memory_total_bytes",
    "mig_mode", "mig_devices", "attributes",
)  # fmt: skip


def wire_inventory_gpus(api_gpus: list[dict]) -> list[dict]:
    """The inventory an agent would send for GPUs read from the fleet API (``GET
    /api/v1/fleet/hosts/{id}``): the wire fields only, ``health`` being the agent's counters
    object (the API's ``health_counters``), not the API's ``HEALTHY``/``UNHEALTHY`` verdict."""
    return [
        {
            **{k: g[k] for k in WIRE_GPU_FIELDS if k in g},
            "health": g.get("health_counters") or {},
        }
        for g in api_gpus
    ]


def drive_cluster(cluster_id, max_steps: int = 20) -> int:
    """Call the cluster reconciler until it converges; returns the number of steps."""
    from clusters.reconcile import reconcile_cluster

    for step in range(1, max_steps + 1):
        if reconcile_cluster(cluster_id) is None:
            return step
    raise AssertionError(f"cluster {cluster_id} did not converge in {max_steps} steps")


def drive_pool(pool_id, max_steps: int = 20) -> int:
    """Call the node pool reconciler until it converges; returns the number of steps."""
    from nodepools.reconcile import reconcile_nodepool

    for step in range(1, max_steps + 1):
        if reconcile_nodepool(pool_id) is None:
            return step
    raise AssertionError(f"node pool {pool_id} did not converge in {max_steps} steps")


SNAPSHOT_TABLES = (
    "clusters_cluster",
    "clusters_operation",
    "nodepools_nodepool",
    "nodepools_node",
    "fleet_host",
    "fleet_gpu",
    "billing_ledgerentry",
)


def running_h100_pool(owner, make_host, *, hosts: int, nodes: int) -> tuple[str, str]:
    """``hosts`` 8-GPU H100 hosts in us-east-1a, a RUNNING cluster ``c1`` and a RUNNING node
    pool ``h100`` of ``nodes`` 8-GPU nodes on them; returns (cluster id, node pool id)."""
    for _ in range(hosts):
        make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    cluster = owner.post(
        "/api/v1/clusters", {"name": "c1", "kubernetes_version": "1.36", "region": "us-east-1"}
    ).json()["target_id"]
    drive_cluster(cluster)
    op = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {"name": "h100", "gpu_model": "h100-sxm5-80gb", "gpus_per_node": 8, "node_count": nodes},
    ).json()
    drive_pool(op["target_id"])
    return cluster, op["target_id"]


def running_exclusive_pool(principal, *, gpus_per_node: int, node_count: int) -> tuple:
    """Through the services as ``principal``: a RUNNING cluster ``llm`` (us-east-1) and a
    RUNNING exclusive H100 pool ``train`` on hosts the caller made; returns (cluster id, pool
    id)."""
    from clusters.services import create_cluster
    from nodepools.services import create_nodepool

    op = create_cluster(
        principal=principal, name="llm", kubernetes_version="1.36", region="us-east-1"
    )
    drive_cluster(op.target_id)
    pool_op = create_nodepool(
        principal=principal,
        cluster=op.cluster,
        name="train",
        gpu_model="h100-sxm5-80gb",
        gpus_per_node=gpus_per_node,
        node_count=node_count,
        isolation={"mode": "exclusive"},
    )
    drive_pool(pool_op.target_id)
    return op.target_id, pool_op.target_id


def snapshot() -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the control-plane tables, ordered, for before/after comparisons."""
    out = {}
    with connection.cursor() as cursor:
        for table in SNAPSHOT_TABLES:
            cursor.execute(f"SELECT * FROM {table} ORDER BY 1")
            out[table] = cursor.fetchall()
    return out


def seat_on_shared_host(node, host) -> None:
    """TEST SET-UP (simulated placement): move a PROVISIONING node's GPU claim onto ``host``
    beside another tenant's node, as a shared-host placement would.

    Whole-GPU placement keeps a dedicated host to one tenant (``tenancy: shared`` pools go to
    shared hosts as MIG instances, fleet/shared_hosts.py), so the tests that need two
    tenants' whole-GPU nodes on one host seat the second one by hand: its GPUs
    where placement put them are freed (clean, never used: the node is not READY, so no ledger
    row exists yet) and as many free GPUs of ``host`` are claimed for it.
    """
    from django.utils import timezone

    from fleet.models import Gpu
    from fleet.services import settle_host_state

    assert node.phase == "PROVISIONING" and node.ready_at is None
    now = timezone.now()
    old_host = node.host_id
    Gpu.objects.filter(holder_id=node.id).update(
        holder_id=None, holder_tenant=None, holder_group_id=None, claimed_at=None
    )
    free = list(Gpu.objects.filter(host=host, holder_id__isnull=True).order_by("index"))
    chosen = free[: len(node.gpu_uuids)]
    assert len(chosen) == len(node.gpu_uuids), "no room on the shared host"
    Gpu.objects.filter(pk__in=[g.pk for g in chosen]).update(
        holder_id=node.id,
        holder_tenant_id=node.tenant_id,
        holder_shares_host=True,
        holder_group_id=node.nodepool_id,
        claimed_at=now,
    )
    node.host = host
    node.zone = host.zone
    node.gpu_uuids = [g.uuid for g in chosen]
    node.save(update_fields=["host", "zone", "gpu_uuids"])
    settle_host_state(old_host, now=now)
    settle_host_state(host.pk, now=now)


def run_at_once(
    count: int,
    work: Callable[[int, Callable[[], None]], Any],
    *,
    hook: tuple[Any, str] | None = None,
    barrier_timeout_s: float = 60.0,
    join_s: float = 90.0,
) -> list[Any]:
    """The race harness: ``work(i, wait)`` in ``count`` threads at once (each on its own
    PostgreSQL connection, closed when it ends), released together by a barrier.

    ``wait`` is the barrier: ``work`` calls it where every actor must be in flight (say, with
    its transaction open) before any goes on. With ``hook=(module, "name")`` the barrier is set
    as ``module.name`` while the actors run (code under test calls such a hook between its read
    and its write, to line every actor up there) and ``wait`` does nothing. Returns, in actor
    order, what ``work`` returned or the exception it raised (see :func:`race_outcome`).
    """
    import threading

    from django.db import connections

    barrier = threading.Barrier(count, timeout=barrier_timeout_s)
    outcomes: list[Any] = [None] * count
    wait = (lambda: None) if hook else barrier.wait

    def actor(i: int) -> None:
        try:
            outcomes[i] = work(i, wait)
        except Exception as exc:  # an outcome, shown by the caller's assertion
            outcomes[i] = exc
        finally:
            connections.close_all()

    if hook:
        setattr(hook[0], hook[1], barrier.wait)
    threads = [threading.Thread(target=actor, args=(i,)) for i in range(count)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(join_s)
    finally:
        if hook:
            setattr(hook[0], hook[1], None)
    return outcomes


def race_outcome(outcome: Any) -> Any:
    """An actor's outcome of :func:`run_at_once` in words: an API refusal's stable ``code``
    (``quota_exceeded``), another exception's ``repr``, a result as it is."""
    if isinstance(outcome, Exception):
        code = getattr(outcome, "code", None)
        return code if isinstance(code, str) else repr(outcome)
    return outcome
