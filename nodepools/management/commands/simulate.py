"""``manage.py simulate …`` — SIMULATED infrastructure events for demos and manual tests.

* ``simulate drain-blockers NODE_NAME "default/trainer-0 (PDB trainer allows 0 disruptions)"``
  — pods on a node that cannot be evicted (``--clear`` removes them); a node upgrade then pauses
  on that node once its ``drain_timeout_s`` passes.
* ``simulate xid GPU_UUID XID`` — an Xid on a GPU, stored and handled exactly as if the host's
  agent had reported it (health interval, host cordon for host-wide actions, auto-repair).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from clusters.providers.simulated import simulate_drain_blockers
from fleet.health import handle_xid
from fleet.models import Gpu, XidEvent
from nodepools.models import Node


class Command(BaseCommand):
    help = "Simulate infrastructure events (blocking pods, Xid errors)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="what", required=True)
        blockers = sub.add_parser("drain-blockers", help="pods that block a node's drain")
        blockers.add_argument("node")
        blockers.add_argument("pods", nargs="*")
        blockers.add_argument("--clear", action="store_true")
        xid = sub.add_parser("xid", help="an Xid error on a GPU")
        xid.add_argument("gpu_uuid")
        xid.add_argument("xid", type=int)

    def handle(self, *args, what: str, **options):
        if what == "drain-blockers":
            node = Node.objects.filter(name=options["node"]).first()
            if node is None:
                raise CommandError(f"no node named {options['node']!r}")
            pods = [] if options["clear"] else options["pods"]
            if not options["clear"] and not pods:
                raise CommandError("name at least one pod, or use --clear")
            simulate_drain_blockers(node.id, pods)
            self.stdout.write(f"{node.name}: drain blockers {pods or 'cleared'} (simulated)")
            return
        gpu = Gpu.objects.select_related("host").filter(uuid=options["gpu_uuid"]).first()
        if gpu is None:
            raise CommandError(f"no GPU {options['gpu_uuid']!r}")
        now = timezone.now()
        with transaction.atomic():
            event = XidEvent.objects.create(
                host=gpu.host,
                gpu_uuid=gpu.uuid,
                ts=now,
                xid=options["xid"],
                message=f"Xid {options['xid']} (simulated)",
                report_seq=0,
            )
            result = handle_xid(gpu.host, event, now)
        self.stdout.write(f"Xid {options['xid']} on {gpu.uuid} ({gpu.host.hostname}): {result}")
