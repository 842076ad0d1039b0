"""Process and environment helpers for the embedded-runner tests."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until(predicate: Callable[[], object], timeout: float = 10.0) -> bool:
    """Poll ``predicate`` until it is truthy or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def all_gone(pids: Iterable[int], timeout: float = 10.0) -> list[int]:
    """Wait for ``pids`` to exit; return the ones still running."""
    pids = list(pids)
    wait_until(lambda: not any(alive(p) for p in pids), timeout)
    return [p for p in pids if alive(p)]


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def processes_mentioning(text: str) -> list[str]:
    """Live processes (other than this one) whose command line contains ``text``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        if text in cmdline:
            found.append(f"{proc.pid}: {cmdline}")
    return found


def tcp_listen_ports(pid: int) -> list[int]:
    """TCP ports ``pid`` listens on."""
    try:
        conns = psutil.Process(pid).net_connections(kind="inet")
    except psutil.NoSuchProcess:
        return []
    return [c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN]


def python_env() -> dict[str, str]:
    """Environment for ``python -m nvke.embedded`` subprocesses: no external services."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "NVKE_DATA_DIR", "PORT"}
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


PYTHON = sys.executable
