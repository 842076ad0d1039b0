"""Supervise web, Celery worker, beat and the demo agents with honcho's Python API.

Each process runs as ``exec <argv>`` in its own session (honcho's default), so its pid is also
its process group id and honcho's SIGTERM/SIGKILL to the group reaches gunicorn workers and
Celery pool processes too. On top of honcho:

- every process gets SIGTERM when the runner dies (``PR_SET_PDEATHSIG``), even by SIGKILL;
- a process counts as stopped when its pid exits (honcho waits for its output pipe to close,
  which a grandchild that left the group could keep open forever);
- after honcho returns, any process still in those groups, and any other descendant of the
  runner (orphans are re-parented to it when it is a child subreaper), is stopped;
- a watcher thread records pids in ``services.json`` (again after every restart) and prints
  the URLs once ``/healthz`` answers;
- processes marked ``restart`` (worker, beat, agents) are started again with exponential
  backoff when they die (SIGKILL, a crash after a Redis restart), and each restart is logged;
  any other process dying (the web server) ends the run, and so does the death of an
  ``essential`` pid (the embedded PostgreSQL or Redis), with a message saying which.
"""

from __future__ import annotations

import datetime
import json
import logging
import multiprocessing
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import honcho.manager
import honcho.process
from honcho.printer import Message, Printer

from .datadir import StateFile
from .procutil import (
    _signal_group,
    descendants,
    group_members,
    pid_alive,
    process_create_time,
    reap_children,
    set_parent_death_signal,
    stop_process_group,
    terminate_processes,
)

log = logging.getLogger(__name__)

WORKER_QUEUES = "reconcile,telemetry,billing,default"
#: webhook deliveries wait on tenants' endpoints: their own worker, threads (I/O bound), so a
#: tenant's slow endpoints never hold the worker that reconciles clusters
WEBHOOK_QUEUE = "webhooks"
WEBHOOK_CONCURRENCY = 8
AGENT_INTERVAL_S = 10
SIGNAL_RETURN_CODES = (130, 143)  # honcho's return code after SIGINT / SIGTERM
OUTPUT_GRACE_S = 1.0  # after a process exits, how long its relay waits for the rest of its output
RESTART_BACKOFF_S = (1.0, 30.0)  # first delay, cap: 1, 2, 4 ... 30 s between restarts
ORPHAN_STOP_S = 5.0  # a dead process's leftover group members: SIGTERM, then SIGKILL after this
RESTART_STABLE_S = (
    60.0  # a process that ran this long starts its backoff again from the first delay
)


@dataclass(frozen=True)
class ProcessSpec:
    """One supervised process: a name for the log prefix and the argv to exec."""

    name: str
    argv: tuple[str, ...]
    restart: bool = False  # start it again (with backoff) when it dies, instead of stopping all

    @property
    def command(self) -> str:
        """The shell line honcho runs; ``exec`` so the pid is the program's (and its group's)."""
        return "exec " + shlex.join(self.argv)


@dataclass(frozen=True)
class AgentSpec:
    """One entry of ``$NVKE_DATA_DIR/agents.json`` (written by ``manage.py seed_demo``)."""

    name: str
    xml: str
    state_dir: str
    bootstrap_token: str | None = None
    #: a SIMULATED host's state file: the agent runs ``--source simulated`` over it
    sim_state: str = ""


def project_root() -> Path:
    """The folder holding ``manage.py`` (the cwd of every process the runner starts)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "manage.py").exists() else Path.cwd()


def venv_command(script: str, module: str) -> list[str]:
    """``<venv>/bin/<script>`` next to ``sys.executable``, else ``python -m <module>``."""
    exe = Path(sys.executable).parent / script
    if exe.is_file() and os.access(exe, os.X_OK):
        return [str(exe)]
    return [sys.executable, "-m", module]


def setup_commands(data_dir: Path) -> list[list[str]]:
    """What runs, in order, before the processes start (each must exit 0)."""
    manage = [sys.executable, "manage.py"]
    return [
        [*manage, "migrate", "--noinput"],
        [*manage, "load_catalog"],
        [*manage, "collectstatic", "--noinput"],
        [*manage, "seed_demo", "--data-dir", str(data_dir)],
        # the portal's and console's demo logins (passwords in the data folder), H100 hosts
        # and demo prices: the banner prints where the passwords are
        [*manage, "portal_demo", "--data-dir", str(data_dir)],
    ]


class SetupError(RuntimeError):
    """A setup command failed."""


def run_setup(
    commands: Iterable[Sequence[str]],
    env: Mapping[str, str],
    cwd: Path,
    output: TextIO | None = None,
) -> None:
    """Run ``commands`` one by one with ``env``; raise :class:`SetupError` on the first failure.

    Their output goes straight to this process's stdout/stderr. An exception here (Ctrl-C,
    SIGTERM) kills the running command before it propagates.
    """
    out = output or sys.stdout
    for argv in commands:
        shown = shlex.join(["python", *argv[1:]] if argv[0] == sys.executable else argv)
        print(f"==> {shown}", file=out, flush=True)
        result = subprocess.run(list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise SetupError(f"`{shown}` failed with exit code {result.returncode}")


def load_agents(data_dir: Path) -> list[AgentSpec]:
    """Read ``agents.json`` (a list of ``{"name", "xml", "bootstrap_token", "state_dir",
    "sim_state"}``)."""
    path = data_dir / "agents.json"
    if not path.exists():
        log.warning("%s not found: no demo agents will run", path)
        return []
    entries = json.loads(path.read_text())
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a JSON list")
    return [
        AgentSpec(
            name=str(e["name"]),
            xml=str(e["xml"]),
            state_dir=str(e["state_dir"]),
            bootstrap_token=e.get("bootstrap_token") or None,
            sim_state=str(e.get("sim_state") or ""),
        )
        for e in entries
    ]


def _process_name(prefix: str, name: str, taken: set[str]) -> str:
    base = prefix + (re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "x")
    candidate, n = base, 2
    while candidate in taken:
        candidate, n = f"{base}-{n}", n + 1
    taken.add(candidate)
    return candidate


def _gunicorn_extra_args() -> list[str]:
    """``--no-control-socket`` where gunicorn has it (>= 25): its default socket is one
    shared ``~/.gunicorn/gunicorn.ctl`` for every gunicorn of the user, which two runs (or a
    run and another project) would fight over; the embedded runner does not use it."""
    try:
        from gunicorn.config import KNOWN_SETTINGS
    except ImportError:
        return []
    names = {getattr(setting, "name", None) for setting in KNOWN_SETTINGS}
    return ["--no-control-socket"] if "control_socket_disable" in names else []


def default_processes(
    *, data_dir: Path, port: int, agents: Iterable[AgentSpec] = ()
) -> list[ProcessSpec]:
    """web (gunicorn), worker, webhooks (the delivery worker) and beat (Celery), the
    control-plane manager (the one owner of every hosted control plane's processes:
    kube-apiserver, controller-manager, scheduler and the shared etcd are its children, in
    ``<data dir>/control-planes``), and one
    ``agent-<name>`` per agent."""
    celery = venv_command("celery", "celery")
    web = [
        *venv_command("gunicorn", "gunicorn"), "nvke.wsgi",
        "--bind", f"127.0.0.1:{port}",
        "--workers", "2",
        "--logger-class", "nvke.gunicorn_logging.RedactingLogger",  # tokens out of the log
        *_gunicorn_extra_args(),
    ]  # fmt: skip
    worker = [
        *celery, "-A", "nvke", "worker",
        "-Q", WORKER_QUEUES,
        "--concurrency", "2",
        "--loglevel", "INFO",
    ]  # fmt: skip
    webhooks = [
        *celery, "-A", "nvke", "worker",
        "-Q", WEBHOOK_QUEUE,
        "--pool", "threads",
        "--concurrency", str(WEBHOOK_CONCURRENCY),
        "--hostname", f"{WEBHOOK_QUEUE}@%h",
        "--loglevel", "INFO",
    ]  # fmt: skip
    beat = [
        *celery, "-A", "nvke", "beat",
        "--loglevel", "INFO",
        "--schedule", str(data_dir / "celerybeat-schedule"),
    ]  # fmt: skip
    control_planes = [
        sys.executable, "manage.py", "run_control_planes",
        "--data-dir", str(data_dir / "control-planes"),
    ]  # fmt: skip
    specs = [
        ProcessSpec("web", tuple(web)),
        ProcessSpec("worker", tuple(worker), restart=True),
        ProcessSpec("webhooks", tuple(webhooks), restart=True),
        ProcessSpec("beat", tuple(beat), restart=True),
        ProcessSpec("control-planes", tuple(control_planes), restart=True),
    ]
    agent = venv_command("nvke-agent", "nvke_agent")
    taken = {s.name for s in specs}
    for a in agents:
        argv = [
            *agent, "run",
            "--server", f"http://127.0.0.1:{port}",
            "--state-dir", a.state_dir,
            *(
                ("--source", "simulated", "--sim-state", a.sim_state, "--inventory-every", "1")
                if a.sim_state
                else ("--source", "nvidia-smi-xml", "--xml", a.xml)
            ),
            "--interval", str(AGENT_INTERVAL_S),
        ]  # fmt: skip
        if a.bootstrap_token:
            argv += ["--bootstrap-token", a.bootstrap_token]
        specs.append(ProcessSpec(_process_name("agent-", a.name, taken), tuple(argv), restart=True))
    return specs


# ---------------------------------------------------------------------- honcho glue
def _child_preexec() -> None:
    """In the child before exec: default SIGINT/SIGTERM (the relay ignores them, and ignored
    signals survive exec), and SIGTERM when the relay dies."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    set_parent_death_signal()


class _Popen(honcho.process.Popen):
    """honcho's Popen (own session, stdout+stderr piped) plus SIGTERM on parent death."""

    def __init__(self, cmd: str, **kwargs: Any) -> None:
        kwargs.setdefault("preexec_fn", _child_preexec)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        super().__init__(cmd, **kwargs)


class _StopFlag:
    """The supervisor is stopping: a flag shared with the forked relays through shared memory.

    Not a ``multiprocessing.Event``: its ``set()`` waits for every waiter to wake, and a relay
    that exited while waiting never does, so ``set()`` would hang the supervisor. A lock-free
    byte, polled, cannot.
    """

    POLL_S = 0.1

    def __init__(self) -> None:
        self._value = multiprocessing.Value("b", 0, lock=False)

    def set(self) -> None:
        self._value.value = 1

    def is_set(self) -> bool:
        return bool(self._value.value)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set (True) or ``timeout`` seconds passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(self.POLL_S)
        return True


class _Manager(honcho.manager.Manager):
    """honcho's Manager whose ``terminate`` first tells every relay to stop restarting."""

    def __init__(self, *args: Any, stopping: _StopFlag, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stopping = stopping

    def terminate(self) -> None:
        self.stopping.set()
        super().terminate()


class _Process(honcho.process.Process):
    """honcho's per-process relay (a forked helper) with three changes.

    - It dies with the runner (SIGKILL on parent death), and its child gets SIGTERM then.
    - The process counts as stopped when its pid exits, not when its output pipe closes:
      a grandchild that left the process group (``setsid``, a daemonizing double fork) would
      hold the pipe open and honcho's loop would wait for it forever. Such leftovers are
      stopped by :meth:`Supervisor.sweep` once the loop ends.
    - With ``restart`` set, a child that dies while the supervisor is not stopping has what it
      left in its process group stopped (a Celery worker's pool children) and is started
      again after a backoff (a new ``start`` message carries its pid); only then, or when
      stopping, does the relay report ``stop``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._child_ctor = _Popen
        self._child_lock = threading.Lock()
        self._runner_pid = os.getpid()
        self.restart = False  # set by the Supervisor from its ProcessSpec
        self.stopping: Any = None  # the Supervisor's _StopFlag, shared by all relays

    def run(self, events: Any = None, ignore_signals: bool = False) -> None:
        set_parent_death_signal(signal.SIGKILL)  # the relay has nothing to clean up
        forked = multiprocessing.get_start_method() == "fork"
        if forked and os.getppid() != self._runner_pid:  # the runner died before prctl
            os._exit(1)
        self._events = events
        if ignore_signals:  # as honcho: the relay only ends when its child does
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        threading.Thread(target=self._stop_on_request, daemon=True).start()
        failures = 0
        while True:
            started = time.monotonic()
            returncode = self._run_child()
            if not self.restart or self.stopping.is_set():
                break
            # What the dead process left in its group (a SIGKILLed Celery worker's prefork
            # children, reparented, still running its tasks) goes before the new one starts.
            stop_process_group(self._child.pid, ORPHAN_STOP_S)
            if time.monotonic() - started >= RESTART_STABLE_S:
                failures = 0
            first, cap = RESTART_BACKOFF_S
            delay = min(cap, first * 2**failures)
            failures += 1
            text = (
                f"{self.name} exited (rc={returncode}); restarting in {delay:.0f}s "
                f"(restart {failures} in a row)"
            )
            log.warning("%s", text)
            self._send_message(text + "\n")
            if self.stopping.wait(delay):
                break
        self._send_message({"returncode": returncode}, type="stop")

    def _run_child(self) -> int:
        """Start the command, relay its output until it exits; return its exit code."""
        with self._child_lock:
            self._child = self._child_ctor(self.cmd, env=self.env, cwd=self.cwd)
        self._send_message({"pid": self._child.pid}, type="start")
        if self.stopping.is_set():  # stopping began while it was starting: it missed the TERM
            _signal_group(self._child.pid, signal.SIGTERM)
        reader = threading.Thread(target=self._relay_output, daemon=True)
        reader.start()
        self._child.wait()
        reader.join(OUTPUT_GRACE_S)  # the rest of its output, unless a grandchild holds the pipe
        return int(self._child.returncode)

    def _stop_on_request(self) -> None:
        """When the supervisor stops, SIGTERM the current child (honcho may know an old pid)."""
        self.stopping.wait()
        with self._child_lock:
            child = self._child
        if child is not None and child.poll() is None:
            _signal_group(child.pid, signal.SIGTERM)

    def _relay_output(self) -> None:
        assert self._child is not None and self._child.stdout is not None
        for line in iter(self._child.stdout.readline, b""):
            if not self.quiet:
                self._send_message(line)
        self._child.stdout.close()


def _answers(opener: urllib.request.OpenerDirector, url: str) -> bool:
    """True when ``url`` answers 200 (proxies ignored: this is 127.0.0.1)."""
    try:
        with opener.open(url, timeout=2) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


class Supervisor:
    """Run ``specs`` under a honcho Manager until Ctrl-C/SIGTERM or until one of them exits.

    A spec with ``restart`` is started again when it dies (backoff :data:`RESTART_BACKOFF_S`);
    any other ending ends the run. ``protect`` returns pids (with their descendants) the final
    sweep must leave alone: the embedded PostgreSQL and Redis, which are stopped afterwards in
    their own order. ``essential`` returns ``{name: pid}`` of services whose death ends the run
    (return code 1, a message naming the service).
    """

    def __init__(
        self,
        specs: Sequence[ProcessSpec],
        env: Mapping[str, str],
        cwd: Path,
        *,
        state: StateFile | None = None,
        health_url: str | None = None,
        banner: str | None = None,
        output: TextIO | None = None,
        kill_wait: float = 10.0,
        health_timeout: float = 180.0,
        protect: Callable[[], Iterable[int]] = lambda: (),
        essential: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self.specs = list(specs)
        self.env = dict(env)
        self.cwd = cwd
        self.state = state
        self.health_url = health_url
        self.banner = banner
        self.output = output or sys.stdout
        self.kill_wait = kill_wait
        self.health_timeout = health_timeout
        self.protect = protect
        self.essential = essential
        self.manager: _Manager | None = None
        self._done = threading.Event()

    def run(self) -> int:
        """Supervise until done; return honcho's code (130/143 after SIGINT/SIGTERM)."""
        manager = _Manager(Printer(self.output), stopping=_StopFlag())
        manager._process_ctor = _Process
        honcho.manager.KILL_WAIT = self.kill_wait
        for spec in self.specs:
            proc = manager.add_process(spec.name, spec.command, env=self.env, cwd=str(self.cwd))
            proc.restart = spec.restart
            proc.stopping = manager.stopping
        self.manager = manager
        watcher = threading.Thread(target=self._watch, name="nvke-watch", daemon=True)
        watcher.start()
        try:
            manager.loop()
        finally:
            self._done.set()
            watcher.join(timeout=5)
            self.sweep()
        return manager.returncode if manager.returncode is not None else 0

    # -------------------------------------------------------------- watcher thread
    def _say(self, text: str) -> None:
        assert self.manager is not None
        now = datetime.datetime.now()
        self.manager.events.put(Message("line", text, now, "nvke", None))

    def _pids(self) -> dict[str, int]:
        assert self.manager is not None
        procs = self.manager._processes
        return {name: p["pid"] for name, p in list(procs.items()) if p.get("pid")}

    def _record_pids(self, pids: Mapping[str, int]) -> None:
        if self.state is not None:
            self.state.update(
                processes={
                    name: {"pid": pid, "create_time": process_create_time(pid)}
                    for name, pid in pids.items()
                }
            )

    def _watch(self) -> None:
        # 1. record pids (with start times, so a later run never signals a recycled pid)
        while not self._done.is_set() and len(self._pids()) < len(self.specs):
            self._done.wait(0.1)
        if self._done.is_set():
            return
        recorded = self._pids()
        self._record_pids(recorded)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + self.health_timeout
        announced = not self.health_url
        while not self._done.wait(0.5):
            # 2. a restarted process has a new pid
            pids = self._pids()
            if pids != recorded:
                recorded = pids
                self._record_pids(pids)
            # 3. an essential service died: nothing can work any more
            dead = [name for name, pid in self.essential().items() if not pid_alive(pid)]
            if dead:
                self._stop_run(f"{' and '.join(dead)} exited: stopping everything")
                return
            # 4. announce once the web server answers
            if not announced:
                assert self.health_url is not None
                if _answers(opener, self.health_url):
                    announced = True
                    if self.state is not None:
                        web = dict(self.state.data.get("web") or {})
                        self.state.update(web={**web, "ready": True})
                    if self.banner:
                        self._say(self.banner)
                elif time.monotonic() > deadline:
                    self._say(
                        f"{self.health_url} has not answered after {self.health_timeout:.0f}s"
                    )
                    announced = True

    def _stop_run(self, text: str) -> None:
        assert self.manager is not None
        log.error("%s", text)
        self._say(text)
        if self.manager.returncode is None:
            self.manager.returncode = 1
        self.manager.terminate()

    # -------------------------------------------------------------- cleanup
    def _leftovers(self) -> list[int]:
        """Descendants of the runner other than the protected services (and theirs)."""
        protected: set[int] = set()
        for pid in self.protect():
            protected.add(pid)
            protected.update(d.pid for d in descendants(pid))
        return [p.pid for p in descendants() if p.pid not in protected]

    def sweep(self, timeout: float = 5.0) -> None:
        """Stop anything honcho left: group members, relays, then any other descendant."""
        if self.manager is not None:
            for name, p in list(self.manager._processes.items()):
                pid = p.get("pid")
                if pid and group_members(pid):
                    log.warning("stopping what is left of %s (process group %s)", name, pid)
                    stop_process_group(pid, timeout)
            for p in list(self.manager._processes.values()):
                relay = p.get("process")
                if relay is not None:
                    relay.join(timeout)
                    if relay.is_alive():
                        relay.kill()
                        relay.join(timeout)
        left = self._leftovers()
        if left:
            log.warning("stopping leftover processes %s", left)
            terminate_processes(left, timeout)
        reap_children()
