"""``nvke-agent`` command line: ``register``, ``run`` and ``record``.

Every option can also come from the environment: ``--state-dir`` is ``NVKE_STATE_DIR``,
``--bootstrap-token`` is ``NVKE_BOOTSTRAP_TOKEN`` and so on (``NVKE_`` + the option name in
upper case with ``_`` for ``-``); flags take ``1``/``true``/``yes``. And from a TOML file given
by ``--config FILE`` (or ``NVKE_CONFIG``), with the option names as keys (``state-dir`` or
``state_dir``; flags as booleans). The command line wins over the environment, which wins over
the file.

Exit status: 0 done (or stopped by SIGTERM/SIGINT), 1 refused by the API (bad bootstrap token,
401 on reports) or unusable state, 2 bad usage or a source that cannot start (for ``nvml``
the message is NVML's own, e.g. "NVML Shared Library Not Found").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nvke_agent import __version__
from nvke_agent.agent import DEFAULT_INVENTORY_EVERY, Agent
from nvke_agent.client import ApiClient, Backoff, RegistrationRefused, Stopped
from nvke_agent.commands import dcgm_diagnostics
from nvke_agent.config_keys import unknown_keys
from nvke_agent.jsonlog import setup_logging
from nvke_agent.ops import start_ops
from nvke_agent.record import record
from nvke_agent.sources import SOURCE_NAMES, Source, SourceUnavailable, open_source
from nvke_agent.spool import DEFAULT_MAX_BYTES, Spool
from nvke_agent.state import StateError, StateStore
from nvke_agent.storage import StorageHealth, describe

log = logging.getLogger("nvke_agent.cli")

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
DEFAULT_INTERVAL_S = 10.0
_TRUE = {"1", "true", "yes", "on"}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nvke-agent`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config = load_config(_config_path(argv))
    except ConfigError as exc:
        _say(str(exc))
        return EXIT_USAGE
    parser = build_parser(config)
    unknown = unknown_keys(config, parser)
    if unknown:
        where = _config_path(argv)
        _say(f"{where}: unknown configuration key(s): {', '.join(unknown)}")
        return EXIT_USAGE
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        return int(args.handler(args))
    except StateError as exc:
        _say(str(exc))
        return EXIT_REFUSED


# --- configuration file -----------------------------------------------------------------------


class ConfigError(ValueError):
    """The configuration file cannot be read."""


def _config_path(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return os.environ.get("NVKE_CONFIG") or None


def load_config(path: str | None) -> dict[str, Any]:
    """The TOML file's settings as ``{option-name: value}`` (``{}`` without a file)."""
    if not path:
        return {}
    import tomllib

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the configuration file {path}: {exc}") from exc
    out = {}
    for key, value in data.items():
        if isinstance(value, dict | list):
            raise ConfigError(f"{path}: {key} must be a plain value, not a table or list")
        out[key.replace("_", "-")] = value
    return out


# --- parser ---------------------------------------------------------------------------------


def environment_options() -> dict[str, dict[str, Any]]:
    """Every environment variable the agent reads, for the docs and the settings test:
    ``{"NVKE_SERVER": {"flag": "--server", "commands": ["record", "register", "run"],
    "help": "NVKE API base URL"}, ...}`` (``NVKE_CONFIG`` included)."""
    found: dict[str, dict[str, Any]] = {
        "NVKE_CONFIG": {
            "flag": "--config",
            "commands": ["record", "register", "run"],
            "help": "TOML file with the options as keys (the environment wins over it)",
        }
    }
    parser = build_parser({})
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, subparser in sorted(sub.choices.items()):
        for action in subparser._actions:
            marker = " [env NVKE_"
            if not action.help or marker not in action.help:
                continue
            text, env = action.help.rsplit(" [env ", 1)
            entry = found.setdefault(
                env.rstrip("]"),
                {"flag": action.option_strings[0], "commands": [], "help": text},
            )
            if command not in entry["commands"]:
                entry["commands"].append(command)
    return found


def _env_name(flag: str) -> str:
    return "NVKE_" + flag.lstrip("-").replace("-", "_").upper()


_CONFIG: dict[str, Any] = {}


def _option(parser: argparse.ArgumentParser, flag: str, **kwargs: Any) -> None:
    """Add ``flag`` with its default (and requiredness) taken from ``NVKE_<FLAG>`` or the
    configuration file (the environment wins)."""
    env = _env_name(flag)
    value: Any = os.environ.get(env)
    if value is None and flag.lstrip("-") in _CONFIG:
        value = _CONFIG[flag.lstrip("-")]
        if isinstance(value, bool) and kwargs.get("action") != "store_true":
            value = str(value).lower()
    help_text = kwargs.pop("help", "")
    kwargs["help"] = f"{help_text} [env {env}]".strip()
    if kwargs.get("action") == "store_true":
        if value is not None:
            kwargs["default"] = (
                value if isinstance(value, bool) else str(value).strip().lower() in _TRUE
            )
    elif value is not None:
        kwargs["default"] = str(value)  # argparse converts string defaults with `type`
        kwargs["required"] = False
    parser.add_argument(flag, **kwargs)


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _add_common(parser: argparse.ArgumentParser) -> None:
    _option(parser, "--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    parser.add_argument("--config", help="TOML file of options (names as keys) [env NVKE_CONFIG]")


def _add_source_options(parser: argparse.ArgumentParser) -> None:
    _option(
        parser, "--source", choices=SOURCE_NAMES, required=True, help="where GPU facts come from"
    )
    _option(parser, "--xml", help="nvidia-smi -q -x file (re-read every interval)")
    _option(parser, "--replay", help="replay file written by `nvke-agent record`")
    _option(parser, "--sim-state", help="simulated: the SIMULATED host's state file")
    _option(
        parser,
        "--slice-scrub-dir",
        help="nvml on a shared (hypervisor) host: where the clear tool records slice scrubs",
    )
    _option(
        parser,
        "--no-rebase",
        action="store_true",
        help="replay: keep the file's timestamps instead of moving them to now",
    )


def build_parser(config: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """The argparse parser (exposed for tests and docs); ``config`` is the file's settings."""
    _CONFIG.clear()
    _CONFIG.update(config or {})
    parser = argparse.ArgumentParser(
        prog="nvke-agent",
        description="NVKE node agent: reports GPU inventory, telemetry and Xid events.",
    )
    parser.add_argument("--version", action="version", version=f"nvke-agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    register = commands.add_parser("register", help="exchange a bootstrap token for a credential")
    _option(register, "--server", required=True, help="NVKE API base URL")
    _option(register, "--bootstrap-token", required=True, help="one-time bootstrap token")
    _option(register, "--state-dir", required=True, help="where state and spool live")
    _option(register, "--hostname", default=socket.gethostname(), help="name to register")
    _add_common(register)
    register.set_defaults(handler=cmd_register)

    run = commands.add_parser("run", help="collect and report until stopped")
    _option(run, "--server", required=True, help="NVKE API base URL")
    _option(run, "--state-dir", required=True, help="where state and spool live")
    _add_source_options(run)
    _option(
        run,
        "--interval",
        type=_positive_float,
        help=f"seconds between collections (default: the server's, else {DEFAULT_INTERVAL_S:g})",
    )
    _option(run, "--bootstrap-token", help="registers first if the state has no credential")
    _option(run, "--hostname", default=socket.gethostname(), help="name to register")
    _option(run, "--max-reports", type=_positive_int, help="stop after N reports (flushed)")
    _option(run, "--loop", action="store_true", help="replay: start over when the file ends")
    _option(
        run,
        "--inventory-every",
        type=_positive_int,
        default=DEFAULT_INVENTORY_EVERY,
        help="send the inventory at least every N-th report (and whenever it changes)",
    )
    _option(
        run,
        "--spool-max-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_BYTES,
        help="drop the oldest batches past this size (default 256 MiB)",
    )
    _option(
        run,
        "--metrics-address",
        help="serve /metrics and /healthz on HOST:PORT, e.g. 127.0.0.1:9401 (default: off)",
    )
    _option(run, "--retry-base-s", type=_positive_float, default=1.0, help="backoff base (s)")
    _option(run, "--retry-cap-s", type=_positive_float, default=60.0, help="backoff cap (s)")
    _option(
        run,
        "--dcgm-diag",
        type=int,
        default=0,
        choices=(0, 1, 2, 3),
        help="run `dcgmi diag -r N` once at start where DCGM is installed (0: never)",
    )
    _add_common(run)
    run.set_defaults(handler=cmd_run)

    rec = commands.add_parser("record", help="write a replay file from any source")
    _add_source_options(rec)
    _option(rec, "--out", required=True, help="replay file to write")
    _option(rec, "--duration", type=_non_negative_float, required=True, help="seconds to record")
    _option(
        rec, "--interval", type=_positive_float, default=DEFAULT_INTERVAL_S, help="seconds apart"
    )
    _add_common(rec)
    rec.set_defaults(handler=cmd_record)
    return parser


# --- commands -------------------------------------------------------------------------------


def cmd_register(args: argparse.Namespace) -> int:
    """``nvke-agent register``: store host id and credential in the state dir."""
    store = StateStore(args.state_dir)
    with store.exclusive():
        if store.state.registered:
            log.warning("already registered as host %s; registering again", store.state.host_id)
        with _stop_on_signals() as stop:
            return _register(args, store, stop)


def cmd_run(args: argparse.Namespace) -> int:
    """``nvke-agent run``: register if needed, then collect and report."""
    store = StateStore(args.state_dir)
    with store.exclusive():
        return _run(args, store)


def _run(args: argparse.Namespace, store: StateStore) -> int:
    if args.loop and args.no_rebase:
        _say("--loop needs rebased timestamps; drop --no-rebase")
        return EXIT_USAGE
    if not store.state.registered and not args.bootstrap_token:
        _say(f"{store.path} has no credential: pass --bootstrap-token (or NVKE_BOOTSTRAP_TOKEN)")
        return EXIT_USAGE
    source = _open_source(args)
    if source is None:
        return EXIT_USAGE
    try:
        with _stop_on_signals() as stop:
            if not store.state.registered:
                status = _register(args, store, stop)
                if status != EXIT_OK or stop.is_set():
                    return status
            interval = args.interval or store.state.report_interval_s or DEFAULT_INTERVAL_S
            client = ApiClient(args.server)
            spool = Spool(args.state_dir, max_bytes=args.spool_max_bytes)
            storage = _check_writable(store, spool)
            source, observed_client, close_ops = start_ops(
                address=args.metrics_address,
                source=source,
                client=client,
                spool=spool,
                store=store,
                interval_s=float(interval),
                stop=stop,
                storage=storage,
            )
            try:
                agent = Agent(
                    source=source,
                    client=observed_client,
                    store=store,
                    spool=spool,
                    interval_s=float(interval),
                    backoff=Backoff(
                        base_s=args.retry_base_s, cap_s=max(args.retry_cap_s, args.retry_base_s)
                    ),
                    stop=stop,
                    max_reports=args.max_reports,
                    inventory_every=args.inventory_every,
                    diagnostics=(
                        (lambda: dcgm_diagnostics(args.dcgm_diag)) if args.dcgm_diag else None
                    ),
                    storage=storage,
                )
                log.info(
                    "running",
                    extra={
                        "fields": {
                            "host_id": store.state.host_id,
                            "source": source.name,
                            "interval_s": interval,
                            "next_seq": store.state.next_seq,
                        }
                    },
                )
                return agent.run()
            finally:
                close_ops()
                client.close()
                spool.close()
    finally:
        source.close()


def cmd_record(args: argparse.Namespace) -> int:
    """``nvke-agent record``: write a replay file and print a one-line summary."""
    source = _open_source(args, loop=False)
    if source is None:
        return EXIT_USAGE
    try:
        with _stop_on_signals() as stop:
            summary = record(
                source, args.out, duration_s=args.duration, interval_s=args.interval, stop=stop
            )
    except OSError as exc:  # --out in a missing folder, a directory, no permission
        print(f"nvke-agent record: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        source.close()
    print(summary.line(), flush=True)
    return EXIT_OK


# --- helpers --------------------------------------------------------------------------------


def _check_writable(store: StateStore, spool: Spool) -> StorageHealth:
    """Write the state file once at start: a state dir that cannot be written (read-only,
    full) gets one clear line here, and the agent runs without making reports
    (:mod:`nvke_agent.storage`)."""
    storage = StorageHealth()
    try:
        store.save()
    except OSError as exc:
        storage.error = describe(exc)
        _say(
            f"state dir {store.state_dir} cannot be written ({exc.strerror or exc}): making no "
            f"new reports (each counted as dropped), delivering the {len(spool)} spooled "
            "batch(es); /healthz and the reports say so until it can be written"
        )
    return storage


def _spooled_max_seq(state_dir: str) -> int:
    """The highest seq of a batch still waiting in the spool (0 when none)."""
    if not (Path(state_dir) / "spool").is_dir():
        return 0
    spool = Spool(state_dir)
    try:
        return max(spool.pending(), default=0)
    finally:
        spool.close()


def _register(args: argparse.Namespace, store: StateStore, stop: threading.Event) -> int:
    client = ApiClient(args.server)
    try:
        registration = client.register(
            bootstrap_token=args.bootstrap_token,
            hostname=args.hostname,
            agent_version=__version__,
            backoff=Backoff(
                base_s=getattr(args, "retry_base_s", 1.0),
                cap_s=max(getattr(args, "retry_cap_s", 60.0), getattr(args, "retry_base_s", 1.0)),
            ),
            stop=stop,
        )
    except RegistrationRefused as exc:
        _say(f"registration refused (HTTP {exc.status}, {exc.code or 'no code'}): {exc.detail}")
        return EXIT_REFUSED
    except Stopped:
        return EXIT_OK
    finally:
        client.close()
    # numbered above what the server holds and above batches still in the spool (a state
    # file lost beside a kept spool)
    spooled = _spooled_max_seq(args.state_dir)
    store.set_registration(
        registration.host_id,
        registration.credential,
        registration.report_interval_s,
        seq_baseline=max(registration.seq_baseline, spooled),
    )
    log.info(
        "registered",
        extra={
            "fields": {
                "host_id": registration.host_id,
                "seq_baseline": registration.seq_baseline,
                "next_seq": store.state.next_seq,
            }
        },
    )
    print(json.dumps({"host_id": registration.host_id, "state": str(store.path)}), flush=True)
    return EXIT_OK


def _open_source(args: argparse.Namespace, *, loop: bool | None = None) -> Source | None:
    try:
        return open_source(
            args.source,
            xml=args.xml,
            replay=args.replay,
            rebase=not args.no_rebase,
            loop=getattr(args, "loop", False) if loop is None else loop,
            sim_state=args.sim_state,
            slice_scrub_dir=getattr(args, "slice_scrub_dir", None),
        )
    except SourceUnavailable as exc:
        _say(f"cannot start source {args.source}: {exc}")
    except ValueError as exc:
        _say(str(exc))
    return None


def _say(message: str) -> None:
    print(f"nvke-agent: {message}", file=sys.stderr, flush=True)


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM/SIGINT; a second signal acts as usual (default handler)."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handle(signum: int, _frame: Any) -> None:
        log.info(
            "signal %s: finishing the current send, then stopping", signal.Signals(signum).name
        )
        stop.set()
        signal.signal(
            signum, signal.SIG_DFL if signum == signal.SIGTERM else signal.default_int_handler
        )

    for sig in previous:
        signal.signal(sig, handle)
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
