"""``manage.py simulate …`` — SIMULATED infrastructure events for demos and manual tests.

Everything here changes the simulated infrastructure only (a SIMULATED host's hardware state,
:mod:`clusters.providers.simhosts`, or simulated pods); NVKE learns of it the way it would
from real hardware: through the host's agent (its ``simulated``-source process, or, for a
host with no agent registered, the same source's report run in-process through the ingestion
function of ``POST /api/v1/agent/reports``).

* ``simulate faults`` — the faults a host can be given;
* ``simulate show HOST`` — a host's simulated hardware (GPUs, MIG, driver, faults) as JSON;
* ``simulate fault HOST NAME`` (``--clear`` removes it) — the host disobeys from now on
  (``mig-manager-wedged``, ``driver-not-taken``, ``reboot-leaves-remap-pending`` …);
* ``simulate xid GPU_UUID XID`` (``--remap-pending``: the error leaves a row remap pending,
  which only a GPU reset clears; ``--fall-off-bus``: the GPU falls off the bus with it, as with
  Xid 79 — NVML answers NVML_ERROR_GPU_IS_LOST for it and the agent lists it lost
  (``health.gpu_is_lost``) until the host reboots) — the GPU's driver logs an Xid; the agent
  reports it;
* ``simulate mig GPU_UUID on|off`` — someone turns MIG mode on (no GPU instance) or off on a
  GPU behind NVKE's back (``nvidia-smi -i N -mig 1``): drift under a READY node, which the
  pool's ``NodesDrifted`` condition and the host's warning name;
* ``simulate drain-blockers NODE_NAME "default/trainer-0 (PDB trainer allows 0 disruptions)"``
  — pods on a node that cannot be evicted (``--clear`` removes them); a node upgrade then pauses
  on that node once its ``drain_timeout_s`` passes.
"""

from __future__ import annotations

import json

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from clusters.providers import simhosts
from clusters.providers.simulated import simulate_drain_blockers
from fleet.models import Gpu, Host
from nodepools.models import Node


class Command(BaseCommand):
    help = "Simulate infrastructure events (host faults, Xid errors, blocking pods)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="what", required=True)
        sub.add_parser("faults", help="list the faults a simulated host can be given")
        show = sub.add_parser("show", help="a simulated host's hardware state")
        show.add_argument("host", help="hostname or host id")
        fault = sub.add_parser("fault", help="give a simulated host a fault (or --clear it)")
        fault.add_argument("host", help="hostname or host id")
        fault.add_argument("name", choices=sorted(simhosts.FAULTS))
        fault.add_argument("--clear", action="store_true")
        xid = sub.add_parser("xid", help="an Xid error on a GPU of a simulated host")
        xid.add_argument("gpu_uuid")
        xid.add_argument("xid", type=int)
        xid.add_argument("--remap-pending", action="store_true", help="leaves a row remap pending")
        xid.add_argument(
            "--fall-off-bus",
            action="store_true",
            help="the GPU falls off the bus with it (lost to NVML until the host reboots)",
        )
        mig = sub.add_parser("mig", help="MIG mode turned on or off on a GPU behind NVKE's back")
        mig.add_argument("gpu_uuid")
        mig.add_argument("mode", choices=["on", "off"])
        blockers = sub.add_parser("drain-blockers", help="pods that block a node's drain")
        blockers.add_argument("node")
        blockers.add_argument("pods", nargs="*")
        blockers.add_argument("--clear", action="store_true")

    def handle(self, *args, what: str, **options):
        if what == "faults":
            for name, text in sorted(simhosts.FAULTS.items()):
                self.stdout.write(f"{name}: {text}")
        elif what == "show":
            state = simhosts.ensure(self._host(options["host"]))
            self.stdout.write(json.dumps(state, indent=2, sort_keys=True))
        elif what == "fault":
            host, on = self._host(options["host"]), not options["clear"]
            simhosts.change(host, lambda s: simhosts.set_fault(s, options["name"], on))
            self._reported(host, f"fault {options['name']} {'injected' if on else 'cleared'}")
        elif what == "mig":
            gpu, on = self._gpu(options["gpu_uuid"]), options["mode"] == "on"
            simhosts.change(gpu.host, lambda s: simhosts.apply_mig(s, [gpu.uuid], on, []))
            self._reported(gpu.host, f"MIG mode {options['mode']} on {gpu.uuid}")
        elif what == "xid":
            gpu = self._gpu(options["gpu_uuid"])
            pending, lost = options["remap_pending"], options["fall_off_bus"]

            def xid(state):
                event = simhosts.add_xid(state, gpu.uuid, options["xid"], remap_pending=pending)
                if lost:
                    simhosts.lose_gpu(state, gpu.uuid)
                return event

            event = simhosts.change(gpu.host, xid)
            done = (
                f"Xid {options['xid']} on {gpu.uuid}"
                + (" (row remap pending)" if pending else "")
                + (" (fallen off the bus until the host reboots)" if lost else "")
            )
            self._reported(gpu.host, done, events_after=event["id"] - 1)
        else:
            self._drain_blockers(options)

    def _reported(self, host: Host, done: str, events_after: int | None = None) -> None:
        inline = simhosts.report_in_process(host, events_after=events_after)
        how = (
            "reported in-process (no agent registered for it)"
            if inline
            else "its agent reports it with its next report"
        )
        self.stdout.write(f"SIMULATED host {host.hostname}: {done}; {how}")

    def _drain_blockers(self, options) -> None:
        node = Node.objects.filter(name=options["node"]).first()
        if node is None:
            raise CommandError(f"no node named {options['node']!r}")
        pods = [] if options["clear"] else options["pods"]
        if not options["clear"] and not pods:
            raise CommandError("name at least one pod, or use --clear")
        simulate_drain_blockers(node.id, pods)
        self.stdout.write(f"{node.name}: drain blockers {pods or 'cleared'} (simulated)")

    @staticmethod
    def _gpu(gpu_uuid: str) -> Gpu:
        gpu = Gpu.objects.select_related("host").filter(uuid=gpu_uuid).first()
        if gpu is None:
            raise CommandError(f"no GPU {gpu_uuid!r}")
        return gpu

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
