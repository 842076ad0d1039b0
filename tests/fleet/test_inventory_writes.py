"""An agent report that repeats the inventory the host already has writes no GPU row (issue
33 item 7): every UPDATE of ``fleet_gpu`` also rewrites and row-locks the host's summary row
(trigger of migration 0003) until the report commits, so rewriting 8 unchanged GPUs at every
report made placement's claims on the same host wait (the reconcile benchmark: 7,880 such
UPDATEs for 985 reports)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

pytestmark = pytest.mark.django_db


def test_a_repeated_inventory_updates_no_gpu_row(catalog, settings, tmp_path):
    from clusters.providers import simhosts
    from fleet.models import Gpu

    settings.NVKE_SIMULATED_HOSTS_DIR = tmp_path
    host = simhosts.create_simulated_host(
        hostname="sim-inv-1", zone="us-east-1a", gpu_model="h100-sxm5-80gb", gpus=8
    )
    assert simhosts.report_in_process(host)  # the first report: facts are written
    first = {g.uuid: (g.mig_mode, g.attributes) for g in Gpu.objects.filter(host=host)}
    with CaptureQueriesContext(connection) as queries:
        assert simhosts.report_in_process(host)
    updates = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "fleet_gpu"')]
    assert updates == []
    assert {g.uuid: (g.mig_mode, g.attributes) for g in Gpu.objects.filter(host=host)} == first
    # a fact that changes is still written: GPU 0's retired pages in the host's state file
    simhosts.change(
        host,
        lambda state: state["gpus"][0].setdefault("health", {}).update(retired_pages_sbe=3),
    )
    with CaptureQueriesContext(connection) as queries:
        simhosts.report_in_process(host)
    updates = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "fleet_gpu"')]
    assert len(updates) == 1
    assert Gpu.objects.get(host=host, index=0).health_counters["retired_pages_sbe"] == 3
