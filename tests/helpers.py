"""Test helpers: drive reconcilers to convergence, snapshot tables."""

from __future__ import annotations

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

    from nvke.embedded.redis import redis_url_from_broker_url

    return redis.Redis.from_url(redis_url_from_broker_url(settings.CELERY_BROKER_URL))


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


def snapshot() -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the control-plane tables, ordered, for before/after comparisons."""
    out = {}
    with connection.cursor() as cursor:
        for table in SNAPSHOT_TABLES:
            cursor.execute(f"SELECT * FROM {table} ORDER BY 1")
            out[table] = cursor.fetchall()
    return out
