"""Benchmark: placement of 1,000 node requests on 10,000 hosts (DESIGN §9: < 2 s total),
against a naive first-fit in the same run (time and quality).

SIMULATED fleet (seeded): 10,000 8-GPU hosts in us-east-1a/b/c — 6,000 HGX H100 (NVSwitch: one
NVLink island of 8), 2,000 H100 NVL (NVLink bridges: islands of 2), 2,000 A100 HGX. It starts
fragmented: 97 % of the hosts are partly or wholly held by 300 tenants (random GPU sets, 1 to 8
GPUs held), 3 % are free. Then 1,000 requests arrive as node pools of 1-4 nodes of 1, 2, 4 or
8 GPUs from those tenants (a quarter of the pools asks for zone spreading).

Both algorithms get identical copies of the fleet and the same requests, in the same order, and
apply the same eligibility and tenancy rules; they differ in choice only: the planner (best fit,
NVLink islands, zone spreading) versus the first host in hostname order with enough free GPUs,
lowest GPU indexes. Quality: requests refused, whole hosts left free, nodes split across NVLink
islands (on hosts with more than one island).

A second table times the database path (``claim_gpus``: candidate query, plan, row locks,
guarded UPDATEs) for the same kind of pools on 10,000 hosts stored in PostgreSQL.

Run: ``make bench`` (or ``pytest tests/bench/test_bench_placement.py -s``).
"""

from __future__ import annotations

import copy
import random
import time
import uuid

import pytest

from fleet.placement import (
    GpuRequest,
    GpuSlot,
    HostView,
    InsufficientCapacity,
    Planner,
    naive_first_fit,
)
from tests.bench.fleets import HOSTS, MODELS
from tests.bench.fleets import build_fleet as shared_fleet
from tests.bench.model_copy import copy_rows
from tests.bench.size import judge, pick

REQUESTS = pick(1_000, 30)
TENANTS = [uuid.UUID(int=10_000 + i) for i in range(300)]
TARGET_S = 2.0
FREE_SHARE = 0.03  # hosts wholly free at the start


def build_fleet(rng: random.Random) -> list[HostView]:
    """The shared fleet (tests/bench/fleets.py), 97 % of its hosts partly or wholly held."""

    def occupy(gpus: list[GpuSlot]) -> None:
        if rng.random() >= FREE_SHARE:  # held by one tenant: 1..8 random GPUs as 1-GPU nodes
            tenant = rng.choice(TENANTS)
            for i in rng.sample(range(8), rng.randint(1, 8)):
                gpus[i].holder = uuid.uuid4()
                gpus[i].tenant = tenant

    return shared_fleet(occupy)


def islands(host: HostView) -> list[list[int]]:
    """NVLink islands of a fleet host: pairs on H100 NVL, one island of 8 elsewhere."""
    if host.gpu_model == "h100-nvl-94gb":
        return [[0, 1], [2, 3], [4, 5], [6, 7]]
    return [list(range(8))]


def build_requests(rng: random.Random) -> list[GpuRequest]:
    requests: list[GpuRequest] = []
    while len(requests) < REQUESTS:
        model = rng.choices([m for m, _, _ in MODELS], weights=[c for _, c, _ in MODELS])[0]
        size = rng.choices((1, 2, 4, 8), weights=(30, 30, 20, 20))[0]
        tenant = rng.choice(TENANTS)
        pool = uuid.uuid4()
        spread = rng.random() < 0.25
        for _ in range(min(rng.randint(1, 4), REQUESTS - len(requests))):
            requests.append(
                GpuRequest(
                    uuid.uuid4(),
                    tenant,
                    model,
                    size,
                    "us-east-1",
                    group_id=pool,
                    spread_zones=spread,
                )
            )
    return requests


def quality(hosts: list[HostView], placements: list) -> dict:
    """Refused requests, wholly free hosts, and nodes spread over more NVLink islands than
    their size needs (a 4-GPU node on H100 NVL pairs needs 2 islands; on 3 it is split)."""
    whole = sum(1 for h in hosts if all(g.holder is None for g in h.gpus))
    by_id = {h.id: h for h in hosts}
    split = 0
    for p in placements:
        if p is None:
            continue
        host = by_id[p.host_id]
        sizes = {}
        for g in host.gpus:
            sizes[g.island] = sizes.get(g.island, 0) + 1
        needed = -(-len(p.gpu_indexes) // max(sizes.values()))
        used = len({g.island for g in host.gpus if g.index in p.gpu_indexes})
        split += used > needed
    return {
        "refused": sum(1 for p in placements if p is None),
        "whole_hosts_free": whole,
        "nvlink_split": split,
    }


def run_planner(hosts, requests):
    """``(wall s, CPU s, CPU s to build the index, placements)``."""
    wall, cpu = time.perf_counter(), time.process_time()
    planner = Planner(hosts)
    index_cpu = time.process_time() - cpu
    placements = [planner.place(request) for request in requests]
    return time.perf_counter() - wall, time.process_time() - cpu, index_cpu, placements


def run_first_fit(hosts, requests):
    """``(wall s, CPU s, placements)``."""
    wall, cpu = time.perf_counter(), time.process_time()
    by_model: dict[str, list[HostView]] = {}
    for h in sorted(hosts, key=lambda h: h.hostname):
        by_model.setdefault(h.gpu_model, []).append(h)
    placements = [naive_first_fit(by_model.get(r.gpu_model, []), r) for r in requests]
    return time.perf_counter() - wall, time.process_time() - cpu, placements


def test_placement_planner_against_first_fit():
    rng = random.Random(20261129)
    fleet = build_fleet(rng)
    requests = build_requests(rng)
    free_before = sum(1 for h in fleet if all(g.holder is None for g in h.gpus))
    fleet_a, fleet_b = copy.deepcopy(fleet), copy.deepcopy(fleet)
    planner_wall, planner_s, index_s, planned = run_planner(fleet_a, requests)
    naive_wall, naive_s, naive = run_first_fit(fleet_b, requests)
    q_planner, q_naive = quality(fleet_a, planned), quality(fleet_b, naive)
    asked = sum(r.gpus for r in requests)
    print()
    print(
        f"placement: {REQUESTS} requests ({asked} GPUs) on {HOSTS} hosts, "
        f"{free_before} wholly free at start"
    )
    print(
        f"{'algorithm':<18}{'CPU s':>8}{'wall s':>8}{'refused':>9}{'whole hosts free':>18}"
        f"{'NVLink-split':>14}"
    )
    for name, cpu, wall, q in (
        ("planner (NVKE)", planner_s, planner_wall, q_planner),
        ("naive first-fit", naive_s, naive_wall, q_naive),
    ):
        print(
            f"{name:<18}{cpu:>8.3f}{wall:>8.3f}{q['refused']:>9}{q['whole_hosts_free']:>18}"
            f"{q['nvlink_split']:>14}"
        )
    print(
        f"(planner CPU time includes building its index: {index_s:.3f} s; target < {TARGET_S} s "
        "CPU; wall time depends on what else the machine runs)"
    )
    judge(planner_s < TARGET_S, f"planner CPU {planner_s:.3f} s < {TARGET_S} s")
    judge(q_planner["refused"] <= q_naive["refused"], "planner refuses no more than first-fit")
    judge(
        q_planner["whole_hosts_free"] >= q_naive["whole_hosts_free"],
        "planner keeps at least as many whole hosts free",
    )
    judge(q_planner["nvlink_split"] <= q_naive["nvlink_split"], "planner splits fewer nodes")


@pytest.mark.django_db(transaction=True)
def test_claim_gpus_on_ten_thousand_hosts_in_postgresql():
    from django.db import connection, transaction

    from catalog.loader import load_catalog
    from catalog.models import GpuModel
    from fleet import placement
    from fleet.models import Gpu, Host
    from tenants.models import Tenant

    if not GpuModel.objects.filter(slug="h100-sxm5-80gb").exists():
        load_catalog()
    rng = random.Random(7)
    fleet = build_fleet(rng)
    Tenant.objects.bulk_create([Tenant(id=t, name=f"bench-{i}") for i, t in enumerate(TENANTS)])
    copy_rows(
        Host,
        (
            {
                "id": h.id,
                "hostname": h.hostname,
                "region": "us-east-1",
                "zone": h.zone,
                "state": "ALLOCATED" if any(g.holder for g in h.gpus) else "AVAILABLE",
                "topology": {"islands": islands(h)},
                "gpu_model_id": h.gpu_model,
                "gpu_count": 8,
            }
            for h in fleet
        ),
    )
    copy_rows(
        Gpu,
        (
            {
                "uuid": g.uuid,
                "host_id": h.id,
                "index": g.index,
                "pci_bus_id": f"00000000:{g.index:02X}:00.0",
                "gpu_model_id": h.gpu_model,
                "product_name": "bench",
                "health": "HEALTHY",
                "holder_id": g.holder,
                "holder_tenant_id": g.tenant,
                "nvlink_island": g.island,
                "scrub_state": "CLEAN",
            }
            for h in fleet
            for g in h.gpus
        ),
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE fleet_host")
        cursor.execute("ANALYZE fleet_gpu")
    requests = build_requests(rng)
    pools: dict = {}
    for r in requests:
        pools.setdefault(r.group_id, []).append(r)
    refused = 0
    spent = {"load": 0.0}
    real_load = placement.load_host_views

    def timed_load(batch):
        t = time.perf_counter()
        try:
            return real_load(batch)
        finally:
            spent["load"] += time.perf_counter() - t

    placement.load_host_views = timed_load
    started = time.perf_counter()
    for batch in pools.values():
        try:
            with transaction.atomic():
                placement.claim_gpus(batch)
        except InsufficientCapacity:
            refused += 1
    elapsed = time.perf_counter() - started
    placement.load_host_views = real_load
    print()
    print(
        f"claim_gpus in PostgreSQL: {len(requests)} requests in {len(pools)} pools "
        f"(one transaction each) on {HOSTS} hosts"
    )
    print(f"{'total s':>9}{'per pool ms':>13}{'candidate load s':>18}{'pools refused':>15}")
    print(f"{elapsed:>9.2f}{elapsed / len(pools) * 1000:>13.1f}{spent['load']:>18.2f}{refused:>15}")
