"""Test helpers: drive reconcilers to convergence, snapshot tables."""

from __future__ import annotations

from typing import Any

from django.db import connection


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


def child_database_url() -> str:
    """The test database's URL for child processes (a Unix-socket host in the form
    dj-database-url reads: ``postgres://user@/%2Fsocket%2Fdir/name``)."""
    from urllib.parse import quote

    from django.db import connection

    s = connection.settings_dict
    auth = s["USER"] + (f":{quote(s['PASSWORD'], safe='')}" if s.get("PASSWORD") else "")
    host = s.get("HOST") or "127.0.0.1"
    if host.startswith("/"):
        return f"postgres://{auth}@/{quote(host, safe='')}/{s['NAME']}"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{auth}@{host}{port}/{s['NAME']}"
