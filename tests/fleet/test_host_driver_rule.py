"""The host-driver rule (fleet/host_driver.py) in memory: who may go onto a host whose driver
it would change, for whole-GPU placement, the defragmentation planner and shared hosts.
Values by hand: ``R580`` matches any 580 release (580.95.05), not 570.172.08.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from fleet.defrag import plan_defrag
from fleet.host_driver import changes_driver, may_place
from fleet.placement import InsufficientCapacity, Planner
from tests.fleet.test_placement_planner import host, req

OLD, NEW = "570.172.08", "580.95.05"
NODE = uuid.UUID(int=500)


@pytest.mark.parametrize(
    ("pin", "reported", "held", "ok"),
    [
        ("R580", OLD, [], True),  # an empty host: the boot installs the pin, nobody else there
        ("R580", OLD, [""], False),  # another node runs 570 there
        ("R580", NEW, [""], True),  # the host already runs a 580 release
        ("580.95.05", NEW, ["R580"], True),
        ("", OLD, [""], True),  # no pin: takes the host's driver
        ("", OLD, ["R580"], False),  # a placed R580 node has not installed yet: 570 -> 580
        ("", NEW, ["R580"], True),  # installed: the unpinned node runs 580.95.05
        ("R580", OLD, ["R580", "R580"], True),  # joins the same pending install
        ("580.95.05", OLD, ["R580"], False),  # not the same install (branch vs release)
        ("R590", NEW, ["R580"], False),  # would change the R580 node's driver
    ],
)
def test_who_may_go_onto_a_host(pin, reported, held, ok):
    assert may_place(pin, reported, held) is ok


def test_no_pin_changes_nothing_and_a_pin_of_the_running_branch_neither():
    assert (changes_driver("", OLD), changes_driver("R570", OLD), changes_driver("R580", OLD)) == (
        False,
        False,
        True,
    )
    assert changes_driver("R580", "") is True  # a host that never reported a driver


def test_a_pinned_node_goes_to_the_empty_host_not_beside_a_node_on_another_driver():
    # h-a: 4 held (no pin), 4 free, 570; h-b: empty, 570. Best fit alone: h-a (leftover 0).
    planner = Planner(
        [
            replace(host("h-a", held={i: NODE for i in range(4)}), driver_version=OLD),
            replace(host("h-b"), driver_version=OLD),
        ]
    )
    assert planner.place(req(4, n=1)).hostname == "h-a"  # no pin: best fit
    planner = Planner(
        [
            replace(host("h-a", held={i: NODE for i in range(4)}), driver_version=OLD),
            replace(host("h-b"), driver_version=OLD),
        ]
    )
    placed = planner.place(req(4, n=2, driver_version="R580"))
    assert (placed.hostname, placed.gpu_indexes) == ("h-b", (0, 1, 2, 3))
    # a second node of the same pin joins the pending install on h-b; one without a pin does
    # not (h-a's 4 free GPUs are left for it)
    assert planner.place(req(2, n=3, driver_version="R580")).hostname == "h-b"
    assert planner.place(req(2, n=4)).hostname == "h-a"


def test_a_pinned_node_that_fits_only_beside_another_driver_is_not_placed():
    planner = Planner([replace(host("h-a", held={i: NODE for i in range(4)}), driver_version=OLD)])
    with pytest.raises(InsufficientCapacity):
        planner.place_all([req(4, n=1, driver_version="R580")])
    # the host on the pin's branch takes it
    planner = Planner([replace(host("h-a", held={i: NODE for i in range(4)}), driver_version=NEW)])
    assert planner.place_all([req(4, n=1, driver_version="R580")])[0].hostname == "h-a"


def test_defrag_never_moves_a_pinned_node_onto_a_host_of_another_driver():
    """h2's 2-GPU node pins R580 (its host runs 580.95.05); h1 (570, a node without a pin on
    6 GPUs) has room for it. Without the pin the plan empties h2 into h1; with it, h2's node
    stays, and h1 is emptied instead: its node pins nothing and takes h2's 580.95.05."""
    pinned = uuid.UUID(int=103)
    h1 = replace(host("h1", held={i: uuid.UUID(int=101) for i in range(6)}), driver_version=OLD)
    h2 = replace(host("h2", held={0: pinned, 1: pinned}), driver_version=NEW)
    assert [s.hostname for s in plan_defrag([h1, h2], move_hours=0.25).steps] == ["h2"]
    for g in h2.gpus[:2]:
        g.pin = "R580"
    [step] = plan_defrag([h1, h2], move_hours=0.25).steps
    assert (step.hostname, [m.holder_id for m in step.moves]) == ("h1", [uuid.UUID(int=101)])


@pytest.mark.django_db
def test_a_pinned_vm_node_goes_to_the_empty_shared_host_not_the_opened_one(catalog):
    """Shared hosts sv-a (one 1g.10gb of a node without a pin, 570) and sv-b (empty, 570):
    an opened host is preferred (rule 3), but a 1g.10gb VM node pinning R580 goes to sv-b;
    without the pin it goes beside the other node on sv-a."""
    from catalog.mig import MigTable
    from catalog.mig import Placement as MigPlacement
    from catalog.models import GpuModel
    from fleet.shared_hosts import GpuInstanceRequest, SharedGpu, SharedHost, plan_gpu_instances

    table = MigTable.from_gpu_model(GpuModel.objects.get(slug="h100-sxm5-80gb"))

    def hosts():
        opened = SharedGpu("GPU-a0", 0, True, [MigPlacement("1g.10gb", 0, 1)])
        return [
            SharedHost(uuid.UUID(int=1), "sv-a", "us-east-1a", [opened], OLD, [""]),
            SharedHost(
                uuid.UUID(int=2), "sv-b", "us-east-1a", [SharedGpu("GPU-b0", 0, True, [])], OLD
            ),
        ]

    request = GpuInstanceRequest(
        holder_id=uuid.UUID(int=9),
        tenant_id=uuid.UUID(int=1),
        gpu_model="h100-sxm5-80gb",
        region="us-east-1",
        instances=("1g.10gb",),
    )
    assert plan_gpu_instances(hosts(), request, table)[0].hostname == "sv-a"
    pinned = replace(request, driver_version="R580")
    assert plan_gpu_instances(hosts(), pinned, table)[0].hostname == "sv-b"
