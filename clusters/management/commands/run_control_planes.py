"""``manage.py run_control_planes``: the control-plane manager (clusters/hosted/manager.py).

Runs until SIGTERM / SIGINT, then stops every control plane and the shared etcd. ``make run``
supervises it (restarted with backoff if it dies); its children die with it.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run every hosted control plane (kube-apiserver, controller-manager, scheduler, etcd)."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--data-dir",
            default=settings.NVKE_CONTROL_PLANES_DIR,
            help="folder of the shared etcd and the control planes' files "
            "(default: NVKE_CONTROL_PLANES_DIR)",
        )
        parser.add_argument("--poll", type=float, default=1.0, help="seconds between passes")

    def handle(self, *args, **options) -> None:
        from clusters.hosted.manager import ControlPlaneManager

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        manager = ControlPlaneManager(Path(options["data_dir"]), poll_s=options["poll"])

        def stop(signum, frame) -> None:
            manager.request_stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        manager.run()
