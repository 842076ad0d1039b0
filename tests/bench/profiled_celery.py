"""``celery`` under cProfile, for the reconcile benchmark's ``NVKE_BENCH_PROFILE_DIR``.

Run as ``python -m tests.bench.profiled_celery -A nvke worker …`` (the same arguments as the
``celery`` command). Each pool process profiles itself from ``worker_process_init`` and writes
``<dir>/worker-<pid>.prof`` at most every 5 s after a task (and so at the end of a run, since
the benchmark stops workers with SIGTERM, which does not run exit handlers in prefork children).
"""

from __future__ import annotations

import cProfile
import os
import sys
import time
from pathlib import Path

from celery.signals import task_postrun, worker_process_init

DIRECTORY = Path(os.environ["NVKE_BENCH_PROFILE_DIR"])
_state: dict = {}


@worker_process_init.connect(weak=False)
def _start(**_: object) -> None:
    profile = cProfile.Profile()
    _state.update(profile=profile, dumped=time.monotonic())
    profile.enable()


@task_postrun.connect(weak=False)
def _dump(**_: object) -> None:
    profile = _state.get("profile")
    if profile is None or time.monotonic() - _state["dumped"] < 5:
        return
    profile.disable()
    profile.dump_stats(DIRECTORY / f"worker-{os.getpid()}.prof")
    _state["dumped"] = time.monotonic()
    profile.enable()


if __name__ == "__main__":
    from celery.__main__ import main

    sys.argv[0] = "celery"
    sys.exit(main())
