"""Benchmark: defragmentation of a 10,000-host fleet after churn (fleet/defrag.py), against
the same fleet placed by naive first-fit in the same run.

SIMULATED fleet (seeded), plain data (no database: the planner works on snapshots): 10,000
8-GPU hosts in us-east-1a/b/c — 6,000 HGX H100 (one NVSwitch island of 8), 2,000 H100 NVL
(NVLink bridges: islands of 2), 2,000 A100 HGX — all free at the start. Churn: node pools of
1-4 nodes of 1, 2, 4 or 8 GPUs from 300 tenants arrive, and after every batch random live nodes
are deleted, until CREATES nodes were asked for. The same events in the same order go to two
copies of the fleet: one placed by NVKE's planner (fleet.placement.Planner: best fit, NVLink,
dedicated hosts), one by naive first-fit (same eligibility and tenancy rules, first host in
hostname order). A node refused by one fleet is simply absent there (its deletion is skipped).

Then the defragmentation plan is made for each fleet; the table shows, before and after the
plan: whole hosts free, free GPUs stranded for 8- and 4-GPU nodes (free GPUs no node of that
shape can use, inside NVLink islands), NVLink islands (of 2) wholly free, the moves, the
disruption in GPU-hours (15 min a move) and the planner's CPU time.

Run: ``make bench`` (or ``pytest tests/bench/test_bench_defrag.py -s``).
"""

from __future__ import annotations

import copy
import random
import time
import uuid

from fleet.defrag import plan_defrag
from fleet.placement import GpuRequest, HostView, Planner, naive_first_fit
from tests.bench.fleets import MODELS, build_fleet
from tests.bench.size import judge, pick

TENANTS = [uuid.UUID(int=20_000 + i) for i in range(300)]
CREATES = pick(24_000, 720)  # nodes asked for over the churn
DELETE_SHARE = 0.35  # after each pool, this share of its size in random live nodes is deleted
PLAN_TARGET_S = 10.0  # CPU seconds for one plan of the 10,000-host fleet (2 shared cores)


def build_events(rng: random.Random) -> list[tuple[str, object]]:
    """``[("create", GpuRequest) | ("delete", index of an earlier create)]``."""
    events: list[tuple[str, object]] = []
    live: list[int] = []
    created = 0
    while created < CREATES:
        model = rng.choices([m for m, _, _ in MODELS], weights=[c for _, c, _ in MODELS])[0]
        size = rng.choices((1, 2, 4, 8), weights=(35, 30, 20, 15))[0]
        tenant = rng.choice(TENANTS)
        pool = uuid.uuid4()
        count = rng.randint(1, 4)
        for _ in range(count):
            events.append(("create", GpuRequest(uuid.uuid4(), tenant, model, size, "us-east-1")))
            live.append(created)
            created += 1
        for _ in range(int(count * DELETE_SHARE + rng.random())):
            if live:
                events.append(("delete", live.pop(rng.randrange(len(live)))))
        del pool
    return events


def churn_planner(hosts: list[HostView], events) -> None:
    planner = Planner(hosts)
    placed: dict[int, object] = {}
    n = 0
    for kind, what in events:
        if kind == "create":
            placement = planner.place(what)  # type: ignore[arg-type]
            if placement is not None:
                placed[n] = placement
            n += 1
        elif what in placed:
            planner.unplace(placed.pop(what))  # type: ignore[arg-type]


def churn_first_fit(hosts: list[HostView], events) -> None:
    by_model: dict[str, list[HostView]] = {}
    for h in sorted(hosts, key=lambda h: h.hostname):
        by_model.setdefault(h.gpu_model, []).append(h)
    by_id = {h.id: h for h in hosts}
    placed: dict[int, object] = {}
    n = 0
    for kind, what in events:
        if kind == "create":
            request: GpuRequest = what  # type: ignore[assignment]
            placement = naive_first_fit(by_model.get(request.gpu_model, []), request)
            if placement is not None:
                placed[n] = placement
            n += 1
        elif what in placed:
            placement = placed.pop(what)
            host = by_id[placement.host_id]  # type: ignore[attr-defined]
            for g in host.gpus:
                if g.holder == placement.holder_id:  # type: ignore[attr-defined]
                    g.holder = g.tenant = g.group = None
            host.refresh()


def test_defragmentation_after_churn_against_first_fit():
    rng = random.Random(20261202)
    events = build_events(rng)
    fleet = build_fleet()
    nvke, naive = copy.deepcopy(fleet), copy.deepcopy(fleet)
    churn_planner(nvke, events)
    churn_first_fit(naive, events)
    rows = []
    for name, hosts in (("NVKE placement", nvke), ("naive first-fit", naive)):
        cpu = time.process_time()
        plan = plan_defrag(hosts)
        spent = time.process_time() - cpu
        rows.append((name, plan, spent, sum(1 for h in hosts for g in h.gpus if g.holder)))
    deletes = sum(1 for kind, _ in events if kind == "delete")
    print()
    print(
        f"defragmentation: {len(fleet)} hosts ({len(fleet) * 8} GPUs) after churn: "
        f"{CREATES} nodes asked for, {deletes} deleted"
    )
    print(
        f"{'placement':<17}{'GPUs held':>10}{'whole hosts free':>18}{'stranded 8-GPU':>16}"
        f"{'stranded 4-GPU':>16}{'islands free':>14}{'moves':>7}{'GPU-h':>8}{'plan CPU s':>11}"
    )
    for name, plan, spent, held in rows:
        b, a = plan.before, plan.after
        print(
            f"{name:<17}{held:>10}{f'{b.whole_hosts_free} -> {a.whole_hosts_free}':>18}"
            f"{f'{b.stranded_gpus[8]} -> {a.stranded_gpus[8]}':>16}"
            f"{f'{b.stranded_gpus[4]} -> {a.stranded_gpus[4]}':>16}"
            f"{f'{b.islands_free} -> {a.islands_free}':>14}"
            f"{len(plan.moves):>7}{plan.gpu_hours:>8.1f}{spent:>11.2f}"
        )
    print(
        f"(before -> after the plan; stranded: free GPUs no node of that shape can use; "
        f"target < {PLAN_TARGET_S:g} s CPU per plan)"
    )
    (_, ours, ours_s, _), (_, theirs, theirs_s, _) = rows
    judge(ours_s < PLAN_TARGET_S and theirs_s < PLAN_TARGET_S, f"plans < {PLAN_TARGET_S:g} s")
    for plan in (ours, theirs):
        assert plan.after.free_gpus == plan.before.free_gpus  # moves neither add nor lose GPUs
        judge(
            plan.after.whole_hosts_free > plan.before.whole_hosts_free,
            "the plan frees whole hosts",
        )
        judge(
            plan.after.stranded_gpus[8] < plan.before.stranded_gpus[8],
            "the plan strands fewer GPUs for 8-GPU nodes",
        )
    judge(
        ours.before.whole_hosts_free >= theirs.before.whole_hosts_free,
        "NVKE placement keeps at least as many whole hosts free as first-fit",
    )
