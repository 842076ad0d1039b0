"""gunicorn settings for NVKE (``gunicorn -c python:nvke.gunicorn_conf nvke.wsgi``).

Everything can be overridden on the command line or with ``GUNICORN_CMD_ARGS``. With
``PROMETHEUS_MULTIPROC_DIR`` set, a dead worker's metric files are marked dead so its gauges
stop counting (prometheus-client multiprocess mode).
"""

from __future__ import annotations

import os

# one or more addresses, space-separated (the Helm chart: public 8000, internal 9000)
bind = os.environ.get("GUNICORN_BIND", "0.0.0.0:8000").split()
# the internal listener: /metrics and /admin/ answer only there when set (nvke/internal_port.py)
if os.environ.get("NVKE_INTERNAL_PORT"):
    _internal = f"0.0.0.0:{int(os.environ['NVKE_INTERNAL_PORT'])}"
    if not any(b.endswith(f":{int(os.environ['NVKE_INTERNAL_PORT'])}") for b in bind):
        bind.append(_internal)
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
