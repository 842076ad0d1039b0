"""gunicorn settings for NVKE (``gunicorn -c python:nvke.gunicorn_conf nvke.wsgi``).

Everything can be overridden on the command line or with ``GUNICORN_CMD_ARGS``. With
``PROMETHEUS_MULTIPROC_DIR`` set, a dead worker's metric files are marked dead so its gauges
stop counting (prometheus-client multiprocess mode).
"""

from __future__ import annotations

import os

bind = [os.environ.get("GUNICORN_BIND", "0.0.0.0:8000")]
# the internal metrics listener (README "Metrics"): /metrics answers only here when set
if os.environ.get("NVKE_METRICS_PORT"):
    bind.append(f"0.0.0.0:{int(os.environ['NVKE_METRICS_PORT'])}")
workers = int(os.environ.get("WEB_CONCURRENCY", "4"))
threads = int(os.environ.get("GUNICORN_THREADS", "1"))
timeout = 60
graceful_timeout = 30
accesslog = "-"
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")


def child_exit(server, worker) -> None:  # gunicorn server hook
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
