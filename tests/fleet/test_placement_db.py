"""Placement against PostgreSQL (fleet.placement.claim_gpus / release_gpus): all-or-nothing,
idempotent, row locks, scrub before reuse, drains completing."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection, connections, transaction

from fleet import placement
from fleet.models import Gpu, GpuScrub, Host
from fleet.placement import GpuRequest, InsufficientCapacity
from fleet.topology import parse_nvidia_smi_topo
from tests.fleet.test_topology import DATA

pytestmark = pytest.mark.django_db


def request(tenant, gpus, *, n=0, model="h100-sxm5-80gb", **kw):
    kw.setdefault("region", "us-east-1")
    return GpuRequest(uuid.UUID(int=n + 1), tenant.id, model, gpus, **kw)


def held(holder_n):
    return list(
        Gpu.objects.filter(holder_id=uuid.UUID(int=holder_n + 1))
        .order_by("index")
        .values_list("host__hostname", "index")
    )


def with_topology(host, name):
    topo = parse_nvidia_smi_topo((DATA / name).read_text())
    Host.objects.filter(pk=host.pk).update(topology=topo)
    for gpu in host.gpus.all():
        Gpu.objects.filter(pk=gpu.pk).update(nvlink_island=gpu.index // 2)
    return host


def test_claims_follow_best_fit_and_record_the_holder(make_host, tenant_a):
    make_host("h100-sxm5-80gb", gpus=8, hostname="h-a")
    make_host("h100-sxm5-80gb", gpus=4, hostname="h-b")
    group = uuid.uuid4()
    with transaction.atomic():
        [first] = placement.claim_gpus([request(tenant_a, 2, group_id=group)])
    # h-b (4 free) fits tighter than h-a (8 free)
    assert (first.hostname, first.gpu_indexes) == ("h-b", (0, 1))
    gpu = Gpu.objects.get(host__hostname="h-b", index=0)
    assert (gpu.holder_id, gpu.holder_tenant_id, gpu.holder_group_id) == (
        uuid.UUID(int=1),
        tenant_a.id,
        group,
    )
    assert Host.objects.get(hostname="h-b").state == "ALLOCATED"
    assert Host.objects.get(hostname="h-a").state == "AVAILABLE"


def test_a_batch_that_does_not_fit_holds_nothing_and_touches_no_one_else(
    make_host, tenant_a, tenant_b
):
    make_host("h100-sxm5-80gb", gpus=8, hostname="h-a")
    make_host("h100-sxm5-80gb", gpus=8, hostname="h-b")
    with transaction.atomic():
        placement.claim_gpus([request(tenant_b, 8, n=50)])  # B takes a whole host
    before = sorted(Gpu.objects.values_list("uuid", "holder_id", "holder_tenant_id"))
    with pytest.raises(InsufficientCapacity) as exc, transaction.atomic():
        placement.claim_gpus(
            [request(tenant_a, 4, n=1), request(tenant_a, 4, n=2), request(tenant_a, 4, n=3)]
        )
    assert (exc.value.placed, exc.value.total) == (2, 3)
    assert sorted(Gpu.objects.values_list("uuid", "holder_id", "holder_tenant_id")) == before
    assert held(50) == [("h-a", i) for i in range(8)]


def test_claiming_again_returns_what_the_holder_already_has(make_host, tenant_a):
    make_host("h100-sxm5-80gb", gpus=8, hostname="h-a")
    with transaction.atomic():
        first = placement.claim_gpus([request(tenant_a, 2)])
    with transaction.atomic():
        again = placement.claim_gpus([request(tenant_a, 2), request(tenant_a, 1, n=7)])
    assert again[0] == first[0]
    assert Gpu.objects.filter(holder_id__isnull=False).count() == 3


@pytest.mark.django_db(transaction=True)
def test_claim_must_run_in_a_transaction(make_host, tenant_a):
    with pytest.raises(RuntimeError, match="transaction"):
        placement.claim_gpus([request(tenant_a, 1)])


def test_nvlink_pairs_from_the_hosts_topology_are_used(make_host, tenant_a):
    host = with_topology(
        make_host("h100-nvl-94gb", gpus=8, hostname="nvl"), "h100-nvl-8gpu-topo.txt"
    )
    Gpu.objects.filter(host=host, index__in=[0, 2]).update(
        holder_id=uuid.uuid4(), holder_tenant=tenant_a
    )
    with transaction.atomic():
        [placed] = placement.claim_gpus([request(tenant_a, 2, model="h100-nvl-94gb")])
    assert (placed.gpu_indexes, placed.nvlink_split) == ((4, 5), False)


def test_unscrubbed_and_unhealthy_gpus_are_not_handed_out(make_host, tenant_a):
    host = make_host("h100-sxm5-80gb", gpus=3, hostname="h")
    Gpu.objects.filter(host=host, index=0).update(scrub_state="PENDING")
    Gpu.objects.filter(host=host, index=1).update(health="UNHEALTHY")
    with transaction.atomic():
        [placed] = placement.claim_gpus([request(tenant_a, 1)])
    assert placed.gpu_indexes == (2,)
    # GPU 0 is free but its scrub is not confirmed: not capacity now, nor a lack of it
    with pytest.raises(placement.PlacementScrubbing) as scrubbing, transaction.atomic():
        placement.claim_gpus([request(tenant_a, 1, n=1)])
    assert scrubbing.value.scrubbing == 1
    assert "1 free GPU(s) of the model are being scrubbed" in str(scrubbing.value)
    # an unhealthy GPU alone is a lack of capacity
    Gpu.objects.filter(host=host, index=0).update(health="UNHEALTHY")
    with pytest.raises(InsufficientCapacity), transaction.atomic():
        placement.claim_gpus([request(tenant_a, 1, n=1)])


def test_release_frees_the_gpus_scrubs_them_and_settles_the_host(make_host, tenant_a):
    make_host("h100-sxm5-80gb", gpus=2, hostname="h")
    with transaction.atomic():
        placement.claim_gpus([request(tenant_a, 2)])
    released = placement.release_gpus(uuid.UUID(int=1))
    assert len(released) == 2
    host = Host.objects.get(hostname="h")
    assert host.state == "AVAILABLE"
    # no agent registered: simulated infrastructure, scrubbed at once (and it says so)
    scrubs = list(GpuScrub.objects.filter(host=host).order_by("gpu__index"))
    assert [(s.status, s.previous_tenant_id) for s in scrubs] == [("DONE", tenant_a.id)] * 2
    assert scrubs[0].executor.startswith("control plane: no agent registered")
    assert [s["step"] for s in scrubs[0].steps] == ["gpu_reset", "memory_clear"]
    assert set(Gpu.objects.values_list("scrub_state", "last_tenant_id")) == {("CLEAN", tenant_a.id)}
    assert placement.release_gpus(uuid.UUID(int=1)) == []  # idempotent


def test_a_host_with_an_agent_keeps_released_gpus_until_the_agent_scrubs_them(
    make_host, tenant_a, tenant_b
):
    host = make_host("h100-sxm5-80gb", gpus=1, hostname="h")
    Host.objects.filter(pk=host.pk).update(credential_hash="x" * 64)
    with transaction.atomic():
        placement.claim_gpus([request(tenant_a, 1)])
    placement.release_gpus(uuid.UUID(int=1))
    assert Gpu.objects.get().scrub_state == "PENDING"
    # found by a new-user trial: a pool scaled 0 -> 1 right after 1 -> 0 went ERROR with
    # insufficient_capacity while its GPU waited for the agent's scrub report; it is a
    # retryable wait (fleet_claims turns it into placement_contended), not a lack of capacity
    with pytest.raises(placement.PlacementScrubbing) as scrubbing, transaction.atomic():
        placement.claim_gpus([request(tenant_b, 1, n=2)])
    assert scrubbing.value.scrubbing == 1
    Gpu.objects.update(scrub_state="CLEAN")  # what the agent's scrub report sets
    with transaction.atomic():
        [placed] = placement.claim_gpus([request(tenant_b, 1, n=2)])
    assert placed.gpu_indexes == (0,)


@pytest.mark.django_db(transaction=True)
def test_a_host_locked_by_another_transaction_is_skipped(make_host, tenant_a):
    make_host("h100-sxm5-80gb", gpus=4, hostname="h-a")  # best fit
    make_host("h100-sxm5-80gb", gpus=8, hostname="h-b")
    locked, release = threading.Event(), threading.Event()

    def hold_lock():
        try:
            with transaction.atomic():
                Host.objects.select_for_update().get(hostname="h-a")
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold_lock)
    thread.start()
    assert locked.wait(10)
    try:
        with transaction.atomic():
            [placed] = placement.claim_gpus([request(tenant_a, 2)])
        assert placed.hostname == "h-b"
    finally:
        release.set()
        thread.join()
    assert connection.is_usable()


@pytest.mark.django_db(transaction=True)
def test_when_the_only_fitting_host_is_locked_the_shortage_says_it_is_contended(
    make_host, tenant_a
):
    """An agent report being stored holds its host's row: a claim then finds no host, but
    says so (``PlacementContended``), so the reconciler retries instead of failing the pool."""
    make_host("h100-sxm5-80gb", gpus=4, hostname="h-only")
    locked, release = threading.Event(), threading.Event()

    def hold_lock():
        try:
            with transaction.atomic():
                Host.objects.filter(hostname="h-only").update(warnings=["busy"])  # as ingest
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold_lock)
    thread.start()
    assert locked.wait(10)
    try:
        with pytest.raises(placement.PlacementContended) as busy, transaction.atomic():
            placement.claim_gpus([request(tenant_a, 2)])
        assert busy.value.locked_hosts == 1
    finally:
        release.set()
        thread.join()
    with pytest.raises(placement.InsufficientCapacity) as full, transaction.atomic():
        placement.claim_gpus([request(tenant_a, 8)])  # more than any host has: truly full
    assert not isinstance(full.value, placement.PlacementContended)
    with transaction.atomic():
        [placed] = placement.claim_gpus([request(tenant_a, 2)])  # the lock is gone: it fits
    assert placed.hostname == "h-only"
