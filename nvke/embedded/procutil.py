"""Process helpers for the embedded runner: parent-death signals, process trees, cleanup.

Linux features are used when present (``prctl(PR_SET_PDEATHSIG)`` so a child dies with its
parent, ``PR_SET_CHILD_SUBREAPER`` so orphaned grandchildren are re-parented to the runner and
can be found and stopped); on other systems these helpers do nothing and the explicit
process-group and process-tree sweeps below still apply.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import signal
import sys
import time
from collections.abc import Iterable

import psutil

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    """Call ``prctl(option, value)``; return False where prctl is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when the thread that forked it exits.

    Meant for ``subprocess.Popen(preexec_fn=...)`` (it survives ``exec``), so a service started
    by the runner never outlives a runner that was killed with SIGKILL.
    """
    _prctl(_PR_SET_PDEATHSIG, int(sig))


def become_child_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux), so a final sweep finds them."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def pid_alive(pid: int | None, create_time: float | None = None) -> bool:
    """True when ``pid`` runs and is not a zombie (and, if given, was created at create_time)."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) < 0.05
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def process_create_time(pid: int) -> float | None:
    """The start time psutil reports for ``pid`` (to recognise it later), or None."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def reap_zombie(pid: int) -> None:
    """Collect the exit status of ``pid`` if it is a finished child of ours."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` runs (zombies count as gone and are reaped); return survivors."""
    remaining = [p for p in pids if p]
    deadline = time.monotonic() + timeout
    while True:
        for pid in remaining:
            reap_zombie(pid)
        remaining = [p for p in remaining if pid_alive(p)]
        if not remaining or time.monotonic() >= deadline:
            return remaining
        time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """True while any process of process group ``pgid`` exists (zombies of others included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.EPERM):
            raise


def stop_process_group(pgid: int, timeout: float = 5.0) -> bool:
    """SIGTERM every process of group ``pgid``, SIGKILL what is left after ``timeout``.

    Returns True when something had to be signalled.
    """
    members = group_members(pgid)
    if not members:
        return False
    _signal_group(pgid, signal.SIGTERM)
    survivors = wait_gone(members, timeout)
    if survivors:
        _signal_group(pgid, signal.SIGKILL)
        for pid in survivors:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        wait_gone(survivors, 5.0)
    return True


def group_members(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def terminate_processes(pids: Iterable[int], timeout: float = 5.0) -> list[int]:
    """SIGTERM ``pids``, SIGKILL those still alive after ``timeout``; return the pids signalled."""
    alive = [p for p in dict.fromkeys(pids) if pid_alive(p)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    survivors = wait_gone(alive, timeout)
    for pid in survivors:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    wait_gone(survivors, 5.0)
    return alive


def descendants(pid: int | None = None) -> list[psutil.Process]:
    """All live descendants of ``pid`` (default: this process), children first."""
    try:
        procs = psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    live = []
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                live.append(proc)
        except psutil.NoSuchProcess:
            continue
    return live


def reap_children() -> None:
    """Collect every finished direct child (zombie) of this process."""
    try:
        children = psutil.Process().children()
    except psutil.NoSuchProcess:
        return
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                reap_zombie(child.pid)
        except psutil.NoSuchProcess:
            continue
