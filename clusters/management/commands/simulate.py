"""``manage.py simulate …``: change a SIMULATED host's hardware (faults, Xids) for demos.

SIMULATED INFRASTRUCTURE: this edits the state file of a simulated host
(:mod:`clusters.providers.simhosts`), as a failing part of real hardware would; NVKE learns of
it only through the host's agent (its ``simulated``-source process, or an in-process report
for a host with no agent registered). Nothing in the control plane is changed directly.

    manage.py simulate faults                         # the faults that can be injected
    manage.py simulate show HOST                      # the host's simulated hardware
    manage.py simulate fault HOST mig-manager-wedged  # inject (--clear: remove) a fault
    manage.py simulate xid HOST --gpu 0 --xid 94 --remap-pending
"""

from __future__ import annotations

import json

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from clusters.providers import simhosts
from fleet.models import Host


class Command(BaseCommand):
    help = "Inject faults and Xid errors into a SIMULATED host (simulated infrastructure)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("faults", help="list the faults that can be injected")
        show = sub.add_parser("show", help="print the host's simulated hardware state")
        show.add_argument("host", help="hostname or host id")
        fault = sub.add_parser("fault", help="inject (or --clear) a fault")
        fault.add_argument("host")
        fault.add_argument("name", choices=sorted(simhosts.FAULTS))
        fault.add_argument("--clear", action="store_true")
        xid = sub.add_parser("xid", help="the driver logs an Xid on one GPU")
        xid.add_argument("host")
        xid.add_argument("--gpu", required=True, help="GPU index or UUID")
        xid.add_argument("--xid", type=int, required=True)
        xid.add_argument(
            "--remap-pending", action="store_true", help="the error leaves a row remap pending"
        )

    def handle(self, *args, action: str, **options):
        if action == "faults":
            for name, text in sorted(simhosts.FAULTS.items()):
                self.stdout.write(f"{name}: {text}")
            return
        host = self._host(options["host"])
        if action == "show":
            self.stdout.write(json.dumps(simhosts.ensure(host), indent=2, sort_keys=True))
            return
        events_after = None
        if action == "fault":
            simhosts.change(
                host, lambda s: simhosts.set_fault(s, options["name"], not options["clear"])
            )
            done = f"fault {options['name']} {'cleared' if options['clear'] else 'injected'}"
        else:
            gpu = self._gpu(host, options["gpu"])
            event = simhosts.change(
                host,
                lambda s: simhosts.add_xid(
                    s, gpu, options["xid"], remap_pending=options["remap_pending"]
                ),
            )
            events_after = event["id"] - 1
            done = f"Xid {options['xid']} logged on {gpu}" + (
                " (row remap pending)" if options["remap_pending"] else ""
            )
        reported = simhosts.report_in_process(host, events_after=events_after)
        how = (
            "reported in-process (no agent registered)"
            if reported
            else "its agent reports it with its next report"
        )
        self.stdout.write(f"SIMULATED host {host.hostname}: {done}; {how}")

    @staticmethod
    def _host(text: str) -> Host:
        host = Host.objects.filter(hostname=text).first()
        if host is None:
            try:
                host = Host.objects.filter(pk=text).first()
            except (ValueError, ValidationError):  # not a UUID
                host = None
        if host is None:
            raise CommandError(f"no host {text!r}")
        return host

    @staticmethod
    def _gpu(host: Host, text: str) -> str:
        gpus = list(host.gpus.order_by("index").values_list("index", "uuid"))
        for index, gpu_uuid in gpus:
            if text in (str(index), gpu_uuid):
                return gpu_uuid
        raise CommandError(f"{host.hostname} has no GPU {text!r} (indexes 0..{len(gpus) - 1})")
