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


def test_a_hosts_first_inventory_announces_no_gpu_facts_change_and_a_later_change_does(
    make_host, django_capture_on_commit_callbacks
):
    """A host recorded without MIG facts (``make_host``, as the reconcile benchmark's hosts)
    gets them from its first inventory; no node on it can be READY or in its cluster's API
    before that report (the observed-state gate waits for it), so ``gpu_facts_changed``
    stays silent: it woke every pool placed on the host for a step with nothing to do (the
    reconcile benchmark: 125 first reports, ~330 of 2,846 steps)."""
    from clusters.providers import simhosts
    from fleet.models import Gpu
    from fleet.signals import gpu_facts_changed

    host = make_host("h100-sxm5-80gb", gpus=2)
    assert Gpu.objects.get(host=host, index=0).mig_mode is None
    sent = []

    def record(sender, host_id, gpu_uuids, **kwargs):
        sent.append(sorted(gpu_uuids))

    gpu_facts_changed.connect(record)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            assert simhosts.report_in_process(host)
        assert (sent, Gpu.objects.get(host=host, index=0).mig_mode) == ([], "disabled")
        gpu0 = Gpu.objects.get(host=host, index=0).uuid
        simhosts.change(host, lambda state: simhosts.apply_mig(state, [gpu0], True, []))
        with django_capture_on_commit_callbacks(execute=True):
            simhosts.report_in_process(host)
        assert sent == [[gpu0]]
    finally:
        gpu_facts_changed.disconnect(record)
