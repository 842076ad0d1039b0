"""``manage.py seed_demo --data-dir DIR``: operator key, demo tenant and key, demo hosts.

Idempotent: a second run reuses the keys written in DIR (when still valid) and the hosts
already imported. Writes ``DIR/operator-api-key``, ``DIR/demo-tenant-api-key`` and
``DIR/agents.json`` (``[{name, xml, bootstrap_token|null, state_dir, sim_state}]``, read by
``make run`` to start one agent per demo host).

Every demo host is a SIMULATED HOST (clusters/providers/simhosts.py): the A10G and T4 hosts
are imported from real ``nvidia-smi -q -x`` captures, the H100 host exists only in the
simulation (8 MIG-capable GPUs for the fault and repair demo), and so do four GB200 trays of
one multi-node NVLink domain: a SIMULATED *part* of a GB200 NVL72 rack (a full rack is 18
trays of 4 GPUs; four keep ``make run`` to four more agent processes), enough for
``same_nvlink_domain`` pools and reservations of a whole domain. Their agents run the
``simulated`` source over the host's state file, which the simulated provider changes when it
applies a MIG config, installs a driver or reboots, and ``manage.py simulate`` when it injects
a fault.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from clusters.providers import simhosts
from fleet import services as fleet_services
from fleet.models import Host
from tenants import services as tenant_services
from tenants.authentication import principal_for_key
from tenants.choices import Role
from tenants.models import Tenant

CAPTURES = Path(settings.BASE_DIR) / "fleet" / "captures"
#: (hostname, zone, capture): the A100 capture is left for the README tour to import.
DEMO_HOSTS = [
    ("gpu-a10g-01", "us-east-1b", "a10g.xml"),
    ("gpu-t4-01", "us-west-2a", "tesla-t4.xml"),
]
#: the NVLink domain (fabric cluster UUID, clique id) of the demo's SIMULATED GB200 trays; the
#: UUID is made up (uuid5 of a demo name), as NVML would report a real rack's
GB200_DEMO_DOMAIN = (uuid.uuid5(uuid.NAMESPACE_DNS, "gb200-nvl72-rack-1.demo.nvke"), 32766)
#: trays of that rack in the demo (of the 18 of a GB200 NVL72: catalog gpu_systems.yaml)
GB200_DEMO_TRAYS = 4
#: (hostname, zone, GPU model, GPUs, NVLink domain or None): SIMULATED hosts without a capture
SIMULATED_HOSTS = [
    ("gpu-h100-sim-01", "us-east-1a", "h100-sxm5-80gb", 8, None),
    *[
        (f"gb200-nvl72-sim-tray{i:02d}", "us-east-1a", "gb200", 4, GB200_DEMO_DOMAIN)
        for i in range(1, GB200_DEMO_TRAYS + 1)
    ],
]
DEMO_TENANT = "demo"


class Command(BaseCommand):
    help = "Create the demo operator key, tenant, tenant key and hosts (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument("--data-dir", default=".nvke")

    def handle(self, *args, data_dir: str, **options):
        root = Path(data_dir).resolve()
        root.mkdir(parents=True, exist_ok=True)
        self._key(root / "operator-api-key", tenant=None, name="demo-operator")
        tenant, _ = Tenant.objects.get_or_create(name=DEMO_TENANT)
        self._key(root / "demo-tenant-api-key", tenant=tenant, name="demo-owner", role=Role.OWNER)
        agents = []
        for hostname, zone, capture in DEMO_HOSTS:
            xml_path = CAPTURES / capture
            state_dir = root / "agents" / hostname
            token = None
            host = Host.objects.filter(hostname=hostname).first()
            if host is None:
                imported = fleet_services.import_host(
                    hostname=hostname, zone=zone, nvidia_smi_xml=xml_path.read_text()
                )
                host, token = imported.host, imported.bootstrap_token
            elif not (state_dir / "state.json").exists():
                token = fleet_services.reissue_bootstrap_token(host)
            agents.append(self._agent(host, str(xml_path), token, state_dir))
            self.stdout.write(f"host {hostname} ({host.gpu_model_id}, zone {zone})")
        for hostname, zone, model, gpus, domain in SIMULATED_HOSTS:
            state_dir = root / "agents" / hostname
            known = Host.objects.filter(hostname=hostname).exists()
            host = simhosts.create_simulated_host(
                hostname=hostname, zone=zone, gpu_model=model, gpus=gpus, nvlink_domain=domain
            )
            token = None
            if not known or not (state_dir / "state.json").exists():
                token = fleet_services.reissue_bootstrap_token(host)
            agents.append(self._agent(host, "", token, state_dir))
            where = f", NVLink domain {domain[0]}.{domain[1]}" if domain else ""
            self.stdout.write(f"host {hostname} ({model}, zone {zone}{where}, SIMULATED)")
        (root / "agents.json").write_text(json.dumps(agents, indent=2))
        self.stdout.write(self.style.SUCCESS(f"demo data ready in {root}"))

    @staticmethod
    def _agent(host: Host, xml: str, token: str | None, state_dir: Path) -> dict:
        """The host's ``agents.json`` entry: its agent reads the SIMULATED host's state."""
        simhosts.ensure(host)
        return {
            "name": host.hostname,
            "xml": xml,
            "bootstrap_token": token,
            "state_dir": str(state_dir),
            "sim_state": str(simhosts.state_path(host.id)),
        }

    def _key(self, path: Path, *, tenant, name: str, role: Role = Role.ADMIN) -> None:
        if path.exists() and principal_for_key(path.read_text().strip()) is not None:
            return
        _, key = tenant_services.create_api_key(tenant=tenant, name=name, role=role)
        path.write_text(key + "\n")
        path.chmod(0o600)
        self.stdout.write(f"wrote {path}")
