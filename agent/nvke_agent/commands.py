"""What the server asks of the agent on a report's acknowledgement (``commands``).

Today one kind: ``{"type": "scrub", "scrub_id", "gpu_uuid", "gpu_index", "steps": [...]}``
— after a tenant released a GPU, clean it before anyone else gets it (DESIGN §4 host hygiene).
Steps, in order (each reported ``ok`` / ``failed`` / ``skipped`` / ``simulated`` with a detail):

* ``mig_teardown``: destroy the GPU's MIG compute and GPU instances
  (``nvidia-smi mig -dci -i N`` then ``nvidia-smi mig -dgi -i N``; "not found" means none left);
* ``gpu_reset``: ``nvidia-smi --gpu-reset -i N`` (needs root and no process on the GPU);
* ``memory_clear``: after the reset, NVML must list no compute process on the GPU
  (``nvmlDeviceGetComputeRunningProcesses``); the used memory is reported. The reset is what
  clears the tenant's data from the GPU; this step checks nothing of it is still running.

A source that cannot touch a GPU (``replay``, ``nvidia-smi-xml``: files) *simulates* the scrub
and says so in every step and in ``executor``. The server resends a command until its result
arrives, so a scrub interrupted by a restart simply runs again (every step is idempotent).

:class:`CommandRunner` runs scrubs on one background thread, so a slow GPU reset never delays
collection; results are handed to the next report (``scrub_results``), which is spooled like
any other data.
"""

from __future__ import annotations

import logging
import queue
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def run_command(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output (timeout 300 s)."""
    return subprocess.run(list(args), capture_output=True, text=True, timeout=300, check=False)


def simulated_scrub(command: dict[str, Any], source_name: str) -> dict[str, Any]:
    """The result of a scrub on a source that has no GPU to touch."""
    return {
        "scrub_id": command["scrub_id"],
        "gpu_uuid": command.get("gpu_uuid"),
        "ok": True,
        "executor": f"nvke-agent {source_name} (simulated: no GPU to reset)",
        "steps": [
            {"step": step, "status": "simulated", "detail": f"{source_name} source"}
            for step in command.get("steps") or []
        ],
    }


class CommandRunner:
    """Runs scrub commands one at a time on a daemon thread; collects their results."""

    def __init__(self, scrub: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self._scrub = scrub
        self._queue: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._results: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._seen: set[int] = set()  # scrub ids queued or finished in this run
        self._thread = threading.Thread(target=self._work, name="nvke-commands", daemon=True)
        self._thread.start()

    def submit(self, commands: Sequence[dict[str, Any]]) -> int:
        """Queue the scrubs not seen yet in this run; returns how many were queued."""
        queued = 0
        for command in commands:
            scrub_id = command.get("scrub_id")
            if command.get("type") != "scrub" or not isinstance(scrub_id, int):
                continue
            with self._lock:
                if scrub_id in self._seen:
                    continue
                self._seen.add(scrub_id)
            self._queue.put(command)
            queued += 1
        return queued

    def take_results(self) -> list[dict[str, Any]]:
        """The results finished since the last call."""
        with self._lock:
            results, self._results = self._results, []
        return results

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the scrub in progress (if any)."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _work(self) -> None:
        while True:
            command = self._queue.get()
            if command is None:
                return
            try:
                result = self._scrub(command)
            except Exception as exc:  # never let one scrub kill the agent
                log.exception("scrub %s failed", command.get("scrub_id"))
                result = {
                    "scrub_id": command["scrub_id"],
                    "gpu_uuid": command.get("gpu_uuid"),
                    "ok": False,
                    "executor": "nvke-agent",
                    "steps": [{"step": "scrub", "status": "failed", "detail": repr(exc)[:500]}],
                }
            log.info(
                "scrub %s of %s: %s",
                result["scrub_id"],
                result.get("gpu_uuid"),
                "done" if result.get("ok") else "FAILED",
                extra={"fields": {"scrub_id": result["scrub_id"], "ok": result.get("ok")}},
            )
            with self._lock:
                self._results.append(result)


def dcgm_diagnostics(
    level: int,
    *,
    runner: Runner | None = None,
    which: Callable[[str], str | None] | None = None,
) -> dict[str, Any] | None:
    """Run ``dcgmi diag -r LEVEL`` where DCGM is installed; None where it is not.

    ``{"command", "passed", "output"}``: passed when dcgmi exits 0 and no test line says
    ``Fail``; ``output`` is the end of what it printed (for the operator). Not verified against
    a DCGM installation on this project's machines (none has one); the server records the
    result as a ``dcgm_diag`` host check either way.
    """
    import re
    import shutil

    which = which or shutil.which
    if which("dcgmi") is None:
        log.info("dcgmi not found: no DCGM diagnostics on this host")
        return None
    args = ["dcgmi", "diag", "-r", str(level)]
    try:
        done = (runner or _run_long)(args)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"command": " ".join(args), "passed": False, "output": str(exc)}
    output = (done.stdout or "") + (done.stderr or "")
    passed = done.returncode == 0 and re.search(r"\bFail", output) is None
    return {"command": " ".join(args), "passed": passed, "output": output[-4000:]}


def _run_long(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=3600, check=False)
