"""``manage.py seed_demo`` (what ``make run`` seeds): besides the imported A10G/T4 hosts and the
SIMULATED H100 host, four SIMULATED GB200 NVL72 trays of one multi-node NVLink domain, each with
an agent entry; idempotent."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_the_demo_has_a_simulated_part_of_a_gb200_nvl72_rack_in_one_domain(catalog, tmp_path):
    from clusters.management.commands.seed_demo import GB200_DEMO_DOMAIN
    from fleet.models import Host
    from fleet.nvlink_domains import domain_rooms
    from tenants.models import Tenant

    call_command("seed_demo", data_dir=str(tmp_path))
    trays = Host.objects.filter(gpu_model_id="gb200").order_by("hostname")
    assert [h.hostname for h in trays] == [f"gb200-nvl72-sim-tray0{i}" for i in range(1, 5)]
    assert {(h.nvlink_cluster_uuid, h.nvlink_clique_id) for h in trays} == {GB200_DEMO_DOMAIN}
    assert all(h.gpus.count() == 4 for h in trays)
    assert all("SIMULATED" in " ".join(h.warnings) for h in trays)
    # one domain: 4 trays, 16 free GPUs, room for 4 nodes of 4 GPUs
    demo = Tenant.objects.get(name="demo")
    (room,) = domain_rooms(
        gpu_model="gb200", region="us-east-1", tenant_id=demo.id, gpus_per_node=4
    )
    assert (room.domain.label, room.hosts, room.free_gpus, room.nodes) == (
        f"{GB200_DEMO_DOMAIN[0]}.{GB200_DEMO_DOMAIN[1]}",
        4,
        16,
        4,
    )
    agents = {a["name"] for a in json.loads((tmp_path / "agents.json").read_text())}
    assert {h.hostname for h in trays} <= agents
    call_command("seed_demo", data_dir=str(tmp_path))  # again: nothing new
    assert Host.objects.filter(gpu_model_id="gb200").count() == 4
