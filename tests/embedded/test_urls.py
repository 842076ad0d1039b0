"""URL forms and command lines of the embedded runner (no servers started)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import environ
import pytest

from nvke.embedded.__main__ import child_env, resolve_port
from nvke.embedded.postgres import database_url
from nvke.embedded.redis import (
    broker_url_from_redis_url,
    celery_broker_url,
    redis_url,
    socket_path_for,
)
from nvke.embedded.services import mask_url
from nvke.embedded.supervisor import ProcessSpec, default_processes, load_agents


def test_database_url_puts_the_socket_dir_in_django_environ_host() -> None:
    url = database_url("/work/main/.nvke/postgres", "nvke")

    assert url == "postgres://postgres@/%2Fwork%2Fmain%2F.nvke%2Fpostgres/nvke"
    config = environ.Env.db_url_config(url)
    assert config["HOST"] == "/work/main/.nvke/postgres"
    assert config["NAME"] == "nvke"
    assert config["USER"] == "postgres"
    assert config["PORT"] == ""
    assert config["ENGINE"] == "django.db.backends.postgresql"


def test_database_url_keeps_odd_characters_and_a_non_default_socket_port() -> None:
    config = environ.Env.db_url_config(database_url("/tmp/a b+c", "nvke", port=5433))

    assert config["HOST"] == "/tmp/a b+c"
    assert config["PORT"] == 5433


def test_redis_and_broker_urls_use_each_clients_socket_form() -> None:
    assert redis_url("/d/redis.sock") == "unix:///d/redis.sock?db=0"
    assert celery_broker_url("/d/redis.sock") == "redis+socket:///d/redis.sock"
    assert celery_broker_url("/d/redis.sock", 2) == "redis+socket:///d/redis.sock?virtual_host=2"
    assert broker_url_from_redis_url("unix:///d/redis.sock?db=3") == (
        "redis+socket:///d/redis.sock?virtual_host=3"
    )
    assert broker_url_from_redis_url("redis://h:6380/1") == "redis://h:6380/1"


def test_a_too_long_redis_socket_path_moves_to_a_short_private_folder(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 120) / "redis"

    sock = socket_path_for(deep)

    assert len(str(sock)) <= 100
    assert sock.parent.stat().st_mode & 0o777 == 0o700
    assert socket_path_for(deep) == sock  # stable across runs


def test_mask_url_hides_passwords_only() -> None:
    assert mask_url("postgres://u:secret@h/db") == "postgres://u:***@h/db"
    assert mask_url("unix:///d/redis.sock?db=0") == "unix:///d/redis.sock?db=0"


def test_process_commands_exec_the_programs_from_this_virtualenv(tmp_path: Path) -> None:
    agents_json = tmp_path / "agents.json"
    agents_json.write_text(
        json.dumps(
            [
                {"name": "gpu a", "xml": "/x/a.xml", "bootstrap_token": "tok", "state_dir": "/s/a"},
                {"name": "gpu-b", "xml": "/x/b.xml", "bootstrap_token": None, "state_dir": "/s/b"},
            ]
        )
    )
    specs = {
        s.name: s
        for s in default_processes(data_dir=tmp_path, port=8123, agents=load_agents(tmp_path))
    }

    assert list(specs) == [
        "web", "worker", "webhooks", "beat", "control-planes", "agent-gpu-a", "agent-gpu-b"
    ]  # fmt: skip
    control_planes = specs["control-planes"]
    assert control_planes.restart and "run_control_planes" in control_planes.argv
    assert control_planes.argv[-1] == str(tmp_path / "control-planes")
    web = specs["web"].argv
    assert web[web.index("--bind") + 1] == "127.0.0.1:8123"
    # no gunicorn access log: one JSON line per request comes from the application
    assert "nvke.wsgi" in web and "--access-logfile" not in web
    worker = specs["worker"].argv
    assert worker[worker.index("-Q") + 1] == "reconcile,telemetry,billing,default"
    webhooks = specs["webhooks"].argv  # deliveries: their own worker (issue 26)
    assert webhooks[webhooks.index("-Q") + 1] == "webhooks"
    assert webhooks[webhooks.index("--pool") + 1] == "threads"
    beat = specs["beat"].argv
    assert beat[beat.index("--schedule") + 1] == str(tmp_path / "celerybeat-schedule")
    agent_a, agent_b = specs["agent-gpu-a"].argv, specs["agent-gpu-b"].argv
    assert agent_a[agent_a.index("--bootstrap-token") + 1] == "tok"
    assert "--bootstrap-token" not in agent_b
    assert agent_b[agent_b.index("--server") + 1] == "http://127.0.0.1:8123"
    assert specs["agent-gpu-a"].command.startswith("exec ")


def test_process_spec_command_is_shell_quoted() -> None:
    assert ProcessSpec("x", ("a b", "c")).command == "exec 'a b' c"


def test_missing_agents_json_means_no_agents(tmp_path: Path) -> None:
    assert load_agents(tmp_path) == []


def test_port_zero_picks_a_free_port_and_a_taken_port_fails_early() -> None:
    port = resolve_port(0)
    assert port > 0
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(SystemExit, match="in use"):
            resolve_port(busy.getsockname()[1])


def test_child_env_points_static_root_into_the_data_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("STATIC_ROOT", raising=False)

    env = child_env({"DATABASE_URL": "postgres://x"}, tmp_path, 8123)

    assert env["STATIC_ROOT"] == str(tmp_path / "static")
    assert env["NVKE_DATA_DIR"] == str(tmp_path)
    assert env["PORT"] == "8123"
    assert env["DATABASE_URL"] == "postgres://x"


def test_stale_socket_files_are_removed_only_once_the_postmaster_is_gone(tmp_path: Path) -> None:
    """A postmaster ended by SIGKILL leaves .s.PGSQL.5432 (+ .lock); stop() removes them."""
    import subprocess

    from nvke.embedded.postgres import remove_stale_socket

    sock = tmp_path / ".s.PGSQL.5432"
    lock = tmp_path / ".s.PGSQL.5432.lock"
    other = tmp_path / ".s.PGSQL.5433"
    for path in (sock, lock, other):
        path.write_text("")
    live = subprocess.Popen(["sleep", "30"])
    try:
        assert remove_stale_socket(tmp_path, 5432, live.pid) == []
        assert sock.exists() and lock.exists()
    finally:
        live.kill()
        live.wait()

    assert remove_stale_socket(tmp_path, 5432, live.pid) == [sock, lock]
    assert not sock.exists() and not lock.exists()
    assert other.exists()  # another port's socket is not ours
