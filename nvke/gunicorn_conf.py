"""gunicorn settings for NVKE (``gunicorn -c python:nvke.gunicorn_conf nvke.wsgi``).

Everything can be overridden on the command line or with ``GUNICORN_CMD_ARGS``. With
``PROMETHEUS_MULTIPROC_DIR`` set, a dead worker's metric files are marked dead so its gauges
stop counting (prometheus-client multiprocess mode).

Each worker, once it has loaded the application, loads the URLconf (and with it every view,
serializer and filter module) and moves every object it holds then to the garbage
collector's permanent generation (``gc.freeze()``, Python's documented remedy for this:
https://docs.python.org/3.11/library/gc.html#gc.freeze). A worker holds about 250,000
objects after start-up, none of them garbage; without the freeze each full (generation 2)
collection walked all of them again: 150-210 ms of CPU, measured in-process on the 2-core
machine, once every few hundred list requests — the slowest 1 % of a list benchmark's
requests (issue 15). Objects made later are collected as before.
"""

from __future__ import annotations

import gc

from nvke.settings_registry import read

# one or more addresses, space-separated (the Helm chart: public 8000, internal 9000)
bind = read("GUNICORN_BIND").split()
# the internal listener: /metrics and /admin/ answer only there when set (nvke/internal_port.py)
if read("NVKE_INTERNAL_PORT"):
    _internal = f"0.0.0.0:{read('NVKE_INTERNAL_PORT')}"
    if not any(b.endswith(f":{read('NVKE_INTERNAL_PORT')}") for b in bind):
        bind.append(_internal)
workers = read("WEB_CONCURRENCY")
threads = read("GUNICORN_THREADS")
timeout = 60
graceful_timeout = 30
# no access log: the application writes one JSON line per request (request_finished), with
# invitation tokens and password-reset links redacted (nvke/redaction.py); gunicorn's own error
# log goes through the same redaction
accesslog = None
logger_class = "nvke.gunicorn_logging.RedactingLogger"
forwarded_allow_ips = read("FORWARDED_ALLOW_IPS")


def post_worker_init(worker) -> None:  # gunicorn server hook
    frozen = freeze_startup_objects()
    worker.log.info("gc: %d start-up objects frozen", frozen)


def freeze_startup_objects() -> int:
    """Load the URLconf, collect once, then ``gc.freeze()`` (module docstring); returns the
    number of objects frozen."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - imports every view module
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def child_exit(server, worker) -> None:  # gunicorn server hook
    if read("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
