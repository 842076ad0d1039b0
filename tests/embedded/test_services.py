"""Real embedded PostgreSQL + Redis: start, connect with every client, stop, restart, recover.

Nothing here needs Django settings; the servers listen on Unix sockets in a temp folder only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import environ
import psutil
import psycopg
import pytest
import redis
from kombu import Connection

from nvke.embedded import DataDirBusyError, EmbeddedServices
from nvke.embedded.procutil import pid_alive

from .support import (
    PYTHON,
    REPO_ROOT,
    all_gone,
    processes_mentioning,
    python_env,
    tcp_listen_ports,
    tree,
    wait_until,
)


def _connect(database_url: str) -> psycopg.Connection:
    """Connect the way Django would: through django-environ's parse of DATABASE_URL."""
    cfg = environ.Env.db_url_config(database_url)
    return psycopg.connect(
        host=cfg["HOST"], port=cfg["PORT"] or None, user=cfg["USER"], dbname=cfg["NAME"]
    )


def _listeners_on(port: int) -> set[int]:
    """Pids listening on TCP ``port`` on this machine (empty if we may not look)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return set()
    return {c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_services_start_connect_stop_and_reuse_the_cluster(data_dir: Path) -> None:
    services = EmbeddedServices(data_dir, environ={})
    env = services.start()
    try:
        assert services.postgres.pid > 0 and services.redis.pid > 0
        assert set(env) == {"NVKE_DATA_DIR", "DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"}
        pg_pids = tree(services.postgres.pid)
        redis_pid = services.redis.pid

        # PostgreSQL through DATABASE_URL as Django parses it
        assert environ.Env.db_url_config(env["DATABASE_URL"])["HOST"] == str(
            services.postgres.socket_dir
        )
        with _connect(env["DATABASE_URL"]) as conn:
            conn.execute("CREATE TABLE kept (v text)")
            conn.execute("INSERT INTO kept VALUES ('first run')")
            assert conn.execute("SELECT current_database()").fetchone() == ("nvke",)

        # Redis: redis-py and Django's cache read REDIS_URL ...
        client = redis.Redis.from_url(env["REDIS_URL"])
        assert client.ping()
        client.set("nvke:test", "1")
        assert client.get("nvke:test") == b"1"
        client.close()
        from django.core.cache.backends.redis import RedisCache

        cache = RedisCache(env["REDIS_URL"], {"KEY_PREFIX": "nvke"})
        cache.set("k", {"a": 1}, 30)
        assert cache.get("k") == {"a": 1}

        # ... and Celery/kombu reads CELERY_BROKER_URL
        with Connection(env["CELERY_BROKER_URL"]) as broker:
            queue = broker.SimpleQueue("nvke-test")
            queue.put({"task": "x"})
            message = queue.get(timeout=5)
            assert message.payload == {"task": "x"}
            message.ack()
            queue.close()

        # Unix sockets only: neither server listens on TCP, and 5432/6379 are not ours
        assert tcp_listen_ports(services.postgres.pid) == []
        assert tcp_listen_ports(redis_pid) == []
        assert not (_listeners_on(5432) | _listeners_on(6379)) & {*pg_pids, redis_pid}

        # services.json and env.sh describe what runs
        state = json.loads((data_dir / "services.json").read_text())
        assert state["running"] is True
        assert state["postgres"]["pid"] == services.postgres.pid
        assert state["redis"]["socket"] == str(services.redis.socket)
        assert state["env"]["REDIS_URL"] == env["REDIS_URL"]
        assert f"export CELERY_BROKER_URL={env['CELERY_BROKER_URL']}" in (
            (data_dir / "env.sh").read_text()
        )

        # one runner per data folder
        with pytest.raises(DataDirBusyError):
            EmbeddedServices(data_dir, environ={}).start()
    finally:
        services.stop()

    assert all_gone([*pg_pids, redis_pid]) == []
    assert processes_mentioning(str(data_dir)) == []
    assert not services.redis and not (data_dir / "redis" / "redis.sock").exists()
    assert json.loads((data_dir / "services.json").read_text())["running"] is False

    # Second start on the same folder: no initdb, the data is still there.
    pg_version_mtime = (data_dir / "postgres" / "PG_VERSION").stat().st_mtime_ns
    with EmbeddedServices(data_dir, environ={}) as again:
        assert again.postgres is not None and not again.postgres.reused
        second_pids = [*tree(again.postgres.pid), again.redis.pid]
        with _connect(again.env["DATABASE_URL"]) as conn:
            assert conn.execute("SELECT v FROM kept").fetchall() == [("first run",)]
    assert (data_dir / "postgres" / "PG_VERSION").stat().st_mtime_ns == pg_version_mtime
    assert all_gone(second_pids) == []
    assert processes_mentioning(str(data_dir)) == []


def test_given_urls_start_nothing(data_dir: Path) -> None:
    given = {
        "DATABASE_URL": "postgres://u:pw@db.example:5432/nvke",
        "REDIS_URL": "unix:///run/redis/redis.sock?db=2",
    }
    with EmbeddedServices(data_dir, environ=given) as services:
        assert services.postgres is None and services.redis is None
        assert services.env == {
            "NVKE_DATA_DIR": str(data_dir),
            "CELERY_BROKER_URL": "redis+socket:///run/redis/redis.sock?virtual_host=2",
        }
        state = json.loads((data_dir / "services.json").read_text())
        assert state["postgres"] == {"external": True} and state["redis"] == {"external": True}


def _start_cli(data_dir: Path) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """``python -m nvke.embedded services``; returns the process and its export lines."""
    log = data_dir.parent / "services.log"
    with log.open("a") as stderr:
        proc = subprocess.Popen(
            [PYTHON, "-m", "nvke.embedded", "services", "--data-dir", str(data_dir)],
            cwd=REPO_ROOT,
            env=python_env(),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    exports: dict[str, str] = {}
    assert proc.poll() is None  # the services command keeps running
    while "CELERY_BROKER_URL" not in exports:
        line = proc.stdout.readline()
        assert line, f"services exited early (rc={proc.wait(5)}):\n{log.read_text()}"
        name, _, value = line.strip().removeprefix("export ").partition("=")
        exports[name] = value.strip("'")
    return proc, exports


def test_cli_services_prints_exports_and_stops_everything_on_sigint(data_dir: Path) -> None:
    proc, exports = _start_cli(data_dir)
    state = json.loads((data_dir / "services.json").read_text())
    pids = [*tree(state["postgres"]["pid"]), state["redis"]["pid"]]
    assert exports["DATABASE_URL"] == state["postgres"]["database_url"]
    assert exports["REDIS_URL"].startswith("unix://")
    assert exports["CELERY_BROKER_URL"].startswith("redis+socket://")
    assert redis.Redis.from_url(exports["REDIS_URL"]).ping()

    proc.send_signal(signal.SIGINT)

    assert proc.wait(30) == 0
    assert all_gone(pids) == []
    assert processes_mentioning(str(data_dir)) == []


def test_a_killed_runner_leaves_postgres_which_the_next_run_reuses(data_dir: Path) -> None:
    proc, _ = _start_cli(data_dir)
    state = json.loads((data_dir / "services.json").read_text())
    pg_pid, redis_pid = state["postgres"]["pid"], state["redis"]["pid"]

    proc.kill()  # SIGKILL: no cleanup at all
    proc.wait(10)

    # Redis dies with its parent (PR_SET_PDEATHSIG); PostgreSQL is a daemon and stays.
    assert wait_until(lambda: not pid_alive(redis_pid), 10)
    assert pid_alive(pg_pid)

    with EmbeddedServices(data_dir, environ={}) as services:
        assert services.postgres.reused and services.postgres.pid == pg_pid
        pids = [*tree(pg_pid), services.redis.pid]
        with _connect(services.env["DATABASE_URL"]) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    assert all_gone(pids) == []
    assert processes_mentioning(str(data_dir)) == []


def test_cli_stop_cleans_up_after_a_killed_runner(data_dir: Path) -> None:
    proc, _ = _start_cli(data_dir)
    pg_pid = json.loads((data_dir / "services.json").read_text())["postgres"]["pid"]
    pids = tree(pg_pid)
    proc.kill()
    proc.wait(10)

    result = subprocess.run(
        [PYTHON, "-m", "nvke.embedded", "stop", "--data-dir", str(data_dir)],
        cwd=REPO_ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    assert "postgres" in result.stderr
    assert all_gone(pids) == []
    assert processes_mentioning(str(data_dir)) == []


def test_a_stale_postmaster_pid_of_another_program_does_not_block_start(data_dir: Path) -> None:
    with EmbeddedServices(data_dir, environ={}):
        pass
    # A crash can leave postmaster.pid behind; after a reboot its pid may be anything.
    pgdata = data_dir / "postgres"
    template = [str(os.getpid()), str(pgdata), "0", "5432", str(pgdata), "", "0 0", "ready"]
    (pgdata / "postmaster.pid").write_text("\n".join(template) + "\n")

    with EmbeddedServices(data_dir, environ={}) as services:
        assert services.postgres is not None and services.postgres.pid != os.getpid()
        pids = tree(services.postgres.pid)
    assert all_gone(pids) == []
