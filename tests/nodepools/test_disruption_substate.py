"""One sub-state on ``Node`` says why it is being disrupted and how far it got (issue 28):
``disruption`` + ``disruption_step`` + the one drain clock, written only by
:mod:`nodepools.disruption`; the former per-caller fields are derived from it; the migration
maps every old row (forward and backward); and where two disruptions meet, the overlap rule
of ``Node``'s docstring holds (repair wins, the upgrade starts that node again afterwards)."""

from __future__ import annotations

import ast
import importlib
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from tests.helpers import announce_gpu_fault, running_h100_pool

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
MIGRATION = importlib.import_module("nodepools.migrations.0015_node_disruption")
BLOCKER = "default/trainer-0 (PodDisruptionBudget trainer allows 0 disruptions)"

#: every value the old fields took (the code's writers, before issue 28) and its new form
OLD_TO_NEW = [
    ({"config_state": "draining"}, ("isolation-change", "draining")),
    ({"config_state": "validating"}, ("isolation-change", "validating")),
    ({"upgrade_state": "draining"}, ("upgrade", "draining")),
    ({"upgrade_state": "verifying"}, ("upgrade", "verifying")),
    ({"upgrade_state": "drain-blocked"}, ("upgrade", "drain-blocked")),
    ({"upgrade_state": "rolling-back"}, ("upgrade", "rolling-back")),
    ({"repair_state": "requested"}, ("repair", "requested")),
    ({"repair_state": "rebooting"}, ("repair", "rebooting")),
    ({"repair_state": "replacing"}, ("repair", "replacing")),
    ({"move_state": "replacing"}, ("move", "replacing")),
    ({"move_state": "draining"}, ("move", "draining")),
    ({"move_state": "drain-blocked"}, ("move", "drain-blocked")),
    ({"move_state": "moved"}, ("move", "moved")),
    ({}, ("", "")),
]


@pytest.mark.parametrize(("old", "new"), OLD_TO_NEW)
def test_the_migration_maps_each_old_state_to_the_one_substate_and_back(old, new):
    assert MIGRATION.forward_values(old) == new
    blank = {"config_state": "", "upgrade_state": "", "repair_state": "", "move_state": ""}
    assert MIGRATION.backward_values(*new) == {**blank, **old}


def test_the_migration_keeps_the_disruption_that_wins_where_two_were_stored():
    both = {"upgrade_state": "draining", "repair_state": "requested"}
    assert MIGRATION.forward_values(both) == ("repair", "requested")
    assert MIGRATION.forward_values({"upgrade_state": "draining", "move_state": "replacing"}) == (
        "move",
        "replacing",
    )
    # scale-down and deletion had no field: backward, their nodes are DRAINING with none
    assert set(MIGRATION.backward_values("scale-down", "draining").values()) == {""}


@pytest.mark.django_db(transaction=True)
def test_the_migration_round_trips_rows_in_the_database(owner, make_host):
    """The real migration on real rows: back to 0014 (old columns), rows written there, then
    forward (new sub-state, old names derived) and backward again."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    _, pool_id = running_h100_pool(owner, make_host, hosts=4, nodes=4)
    before, latest = ("nodepools", "0014_nodepool_gpu_publishing"), _latest()
    executor = MigrationExecutor(connection)
    try:
        executor.migrate([before])
        old = MigrationExecutor(connection).loader.project_state([before]).apps
        Node = old.get_model("nodepools", "Node")
        ids = list(Node.objects.filter(nodepool_id=pool_id).order_by("name").values_list("pk"))
        rows = [
            {"upgrade_state": "drain-blocked"},
            {"repair_state": "rebooting", "upgrade_state": "verifying"},
            {"move_state": "replacing"},
            {"config_state": "validating"},
        ]
        for (pk,), values in zip(ids, rows, strict=True):
            Node.objects.filter(pk=pk).update(**values)
        executor = MigrationExecutor(connection)
        executor.migrate([latest])
        new = MigrationExecutor(connection).loader.project_state([latest]).apps
        got = list(
            new.get_model("nodepools", "Node")
            .objects.filter(pk__in=[i for (i,) in ids])
            .order_by("name")
            .values_list("disruption", "disruption_step", "upgrade_state", "repair_state")
        )
        assert got == [
            ("upgrade", "drain-blocked", "drain-blocked", ""),
            ("repair", "rebooting", "", "rebooting"),  # the repair wins
            ("move", "replacing", "", ""),
            ("isolation-change", "validating", "", ""),
        ]
        executor = MigrationExecutor(connection)
        executor.migrate([before])
        Node = (
            MigrationExecutor(connection)
            .loader.project_state([before])
            .apps.get_model("nodepools", "Node")
        )
        back = list(
            Node.objects.filter(pk__in=[i for (i,) in ids])
            .order_by("name")
            .values_list("config_state", "upgrade_state", "repair_state", "move_state")
        )
        assert back == [
            ("", "drain-blocked", "", ""),
            ("", "", "rebooting", ""),
            ("", "", "", "replacing"),
            ("validating", "", "", ""),
        ]
    finally:
        MigrationExecutor(connection).migrate([latest])


def _latest() -> tuple[str, str]:
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    leaves = MigrationLoader(connection).graph.leaf_nodes("nodepools")
    return leaves[0]


#: the fields of the one sub-state
SUBSTATE = {"disruption", "disruption_step", "drain_started_at"}
WRITER = "nodepools/disruption.py"


def _writes(tree: ast.AST) -> list[int]:
    """Lines of ``tree`` that write a field of :data:`SUBSTATE`: an attribute assigned, a
    keyword of ``.update()`` / ``.create()`` / ``Node(...)``, a name in ``update_fields``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and t.attr in SUBSTATE:
                        lines.append(node.lineno)
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in ("update", "create", "Node", "get_or_create", "update_or_create"):
                lines += [node.lineno for k in node.keywords if k.arg in SUBSTATE]
            for k in node.keywords:
                if k.arg == "update_fields" and isinstance(k.value, ast.List | ast.Tuple):
                    names = {getattr(e, "value", None) for e in k.value.elts}
                    if names & SUBSTATE:
                        lines.append(node.lineno)
    return lines


def test_the_substate_is_written_in_one_place():
    """``grep`` finds the sub-state written only by nodepools/disruption.py (its migrations
    aside): every caller goes through its start / advance / end / cordon."""
    found = {}
    for path in ROOT.glob("*/**/*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("tests/", ".venv/")) or "/migrations/" in rel or rel == WRITER:
            continue
        if lines := _writes(ast.parse(path.read_text(), rel)):
            found[rel] = lines
    assert found == {}
    assert _writes(ast.parse((ROOT / WRITER).read_text()))  # and there it is written


def test_the_old_fields_are_derived_from_the_one_substate(owner, make_host):
    from nodepools import disruption
    from nodepools.models import Node

    cluster, pool_id = running_h100_pool(owner, make_host, hosts=2, nodes=1)
    node = Node.objects.get(nodepool_id=pool_id)
    for why, field in (
        ("isolation-change", "config_state"),
        ("upgrade", "upgrade_state"),
        ("repair", "repair_state"),
        ("move", "move_state"),
    ):
        disruption.start(node, why, "draining")
        row = Node.objects.values(
            "config_state", "upgrade_state", "repair_state", "move_state"
        ).get(pk=node.pk)
        assert row == {f: ("draining" if f == field else "") for f in row}
    body = owner.get(f"/api/v1/clusters/{cluster}/nodepools/{pool_id}").json()
    (shown,) = body["nodes"]
    assert (shown["disruption"], shown["disruption_step"], shown["move_state"]) == (
        "move",
        "draining",
        "draining",
    )
    assert shown["config_state"] == ""
    listed = owner.get(f"/api/v1/clusters/{cluster}/nodepools").json()["results"]
    (row,) = listed[0]["nodes"]
    assert {k: row[k] for k in shown} == shown  # the list page (SQL) says the same


def test_a_repair_during_an_upgrade_drain_wins_and_the_upgrade_takes_the_node_again(
    owner, make_host
):
    """The overlap rule: a GPU fault on the node an upgrade is draining makes it a repair at
    once (the emergency does not wait for the pods the upgrade waits for), no other node
    starts upgrading meanwhile, and once the node is back in service the upgrade drains it
    again from the start and finishes."""
    from clusters.models import Operation
    from clusters.providers.simulated import simulate_drain_blockers
    from nodepools.models import Node
    from nodepools.reconcile import reconcile_nodepool

    cluster, pool_id = running_h100_pool(owner, make_host, hosts=4, nodes=3)
    first = Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name").first()
    simulate_drain_blockers(first.id, [BLOCKER])
    try:
        op = owner.post(
            f"/api/v1/clusters/{cluster}/nodepools/{pool_id}/upgrade",
            {"driver_version": "580.95.05", "drain_timeout_s": 300},
        ).json()
        t0 = timezone.now()
        assert reconcile_nodepool(pool_id, now=t0) == 2.0  # draining, the pod waited for
        first.refresh_from_db()
        assert (first.phase, first.disruption, first.disruption_step) == (
            "DRAINING",
            "upgrade",
            "draining",
        )
        assert first.upgrade_state == "draining"

        announce_gpu_fault(first, xid=48, action="WORKFLOW_XID_48", needs_operator=False)
        first.refresh_from_db()
        assert (first.disruption, first.disruption_step, first.repair_action) == (
            "repair",
            "requested",
            "reboot",
        )
        assert (first.upgrade_state, first.repair_state) == ("", "requested")

        # the repair's drain is immediate: the pod that holds the upgrade does not hold it
        assert reconcile_nodepool(pool_id, now=t0 + timedelta(seconds=1)) == 5.0
        first.refresh_from_db()
        assert (first.phase, first.disruption, first.disruption_step) == (
            "REPAIRING",
            "repair",
            "rebooting",
        )
        others = Node.objects.filter(nodepool_id=pool_id).exclude(pk=first.pk)
        assert set(others.values_list("disruption", "phase")) == {("", "READY")}
    finally:
        simulate_drain_blockers(first.id, [])

    seen = []
    for _ in range(60):
        delay = reconcile_nodepool(pool_id)
        first.refresh_from_db()
        seen.append((first.disruption, first.disruption_step))
        if delay is None:
            break
    else:
        raise AssertionError("did not converge")
    # repaired (back in service with no disruption), then drained again by the upgrade
    back = seen.index(("", ""))
    assert ("repair", "rebooting") not in seen[back:]
    assert ("upgrade", "verifying") in seen[back:] or ("upgrade", "draining") in seen[back:]
    nodes = Node.objects.filter(nodepool_id=pool_id, phase="READY")
    assert set(nodes.values_list("driver_version", "disruption")) == {("580.95.05", "")}
    assert nodes.count() == 3 and first.pk in {n.pk for n in nodes}
    assert Operation.objects.get(pk=op["id"]).status == "DONE"
    assert Operation.objects.get(target_id=pool_id, type="REPAIR_NODES").status == "DONE"


def test_a_move_never_replaces_a_repair(owner, make_host):
    """A node being repaired on a host an operator drains keeps its repair; it starts moving
    once it is back in service."""
    from fleet.models import Host
    from nodepools import host_moves
    from nodepools.models import Node, NodePool
    from nodepools.repair import request_repair

    _, pool_id = running_h100_pool(owner, make_host, hosts=4, nodes=2)
    node = Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name").first()
    assert request_repair(node.id, action="reboot", reason="test", at=timezone.now())
    Host.objects.filter(pk=node.host_id).update(drain_target="MAINTENANCE")
    pool = NodePool.objects.get(pk=pool_id)
    host_moves.mark_moving(pool, list(pool.nodes.live()), timezone.now())
    node.refresh_from_db()
    assert (node.disruption, node.disruption_step, node.move_state) == ("repair", "requested", "")
    from nodepools import disruption

    disruption.end(node, phase="READY")  # repaired
    host_moves.mark_moving(pool, list(pool.nodes.live()), timezone.now())
    node.refresh_from_db()
    assert (node.disruption, node.disruption_step, node.move_state) == (
        "move",
        "replacing",
        "replacing",
    )
