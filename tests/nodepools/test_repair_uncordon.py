"""A verified repair lifts the host cordon its fault placed: Xid 79 (fallen off the bus, the
catalog's RESTART_BM) cordons the whole host as the agent; once auto-repair has rebooted the
node and the agent's report after the reboot is clean, the host is schedulable again — unless
an operator's cordon holds it, another GPU of the host is still unhealthy, or the repair was
not verified (the node is replaced and the host stays cordoned for the hardware check)."""

from __future__ import annotations

import pytest

from tests.helpers import drive_pool, make_cluster, running_h100_pool

pytestmark = pytest.mark.django_db

REPAIRED = "auto-repair: rebooted, the agent's report is clean"


@pytest.fixture
def pool(owner, make_host):
    return running_h100_pool(owner, make_host, hosts=6, nodes=3)[1]


@pytest.fixture
def xid(django_capture_on_commit_callbacks):
    """``xid(uuid, code)``: the GPU's simulated driver logs the Xid and the host's agent
    reports it (``manage.py simulate xid``), fleet's signals run after commit."""
    from django.core.management import call_command

    def log(uuid: str, code: int = 79, **options) -> None:
        with django_capture_on_commit_callbacks(execute=True):
            call_command("simulate", "xid", uuid, str(code), **options)

    return log


def nodes(pool_id):
    from nodepools.models import Node

    return list(Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name"))


def host_of(uuid):
    from fleet.models import Gpu

    return Gpu.objects.select_related("host").get(uuid=uuid).host


def state(host):
    from fleet.models import Host

    return Host.objects.values_list("state", "state_reason", "state_actor").get(pk=host.pk)


def events_since(host, ts):
    from fleet.models import HostEvent

    return list(
        HostEvent.objects.filter(host=host, ts__gte=ts)
        .order_by("ts", "id")
        .values_list("kind", "actor", "from_state", "to_state", "message")
    )


def cordoned_by_agent(uuid):
    """The health path's cordon for Xid 79 on ``uuid``: ``(state, state_reason, state_actor)``."""
    what = "Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    return ("CORDONED", f"{what} on {uuid}: RESTART_BM", "agent")


def test_a_verified_repair_of_xid_79_lifts_the_cordon_the_agent_placed(pool, xid):
    from django.utils import timezone

    from fleet.breaker_models import CordonRecord
    from fleet.models import GpuHealthInterval, HostEvent
    from fleet.services import lift_repaired_cordon

    node = nodes(pool)[0]
    bad = node.gpu_uuids[0]
    host = host_of(bad)
    assert host.state == "ALLOCATED"
    xid(bad, 79)
    assert state(host) == cordoned_by_agent(bad)
    cordoned_at = HostEvent.objects.get(host=host, to_state="CORDONED").ts

    drive_pool(pool)

    repaired = nodes(pool)[0]
    assert (repaired.id, repaired.phase, repaired.host_id) == (node.id, "READY", host.pk)
    interval = GpuHealthInterval.objects.get(gpu_uuid=bad)
    assert (interval.xid, interval.ended_by) == (79, REPAIRED)
    lifted = f"uncordoned: repair of {bad} verified"
    assert state(host) == ("ALLOCATED", lifted, "system:auto-repair")  # its GPUs are held
    assert events_since(host, cordoned_at)[-2:] == [
        ("action", "system:auto-repair", "", "", lifted),
        ("state", "system:auto-repair", "CORDONED", "ALLOCATED", lifted),
    ]
    # lifting a cordon is no cordon: the breaker counts the node's repair only
    assert list(CordonRecord.objects.values_list("target", "automatic")) == [
        (f"node {node.name} ({node.pk})", True)
    ]
    # idempotent: asked again, nothing more happens

    count = HostEvent.objects.filter(host=host).count()
    assert not lift_repaired_cordon(host.pk, repaired=bad, now=timezone.now())
    assert HostEvent.objects.filter(host=host).count() == count


@pytest.mark.parametrize("when", ["before", "after"])
def test_an_operators_cordon_stays_after_the_verified_repair(pool, xid, when):
    from fleet.models import GpuHealthInterval, Host
    from fleet.services import cordon_host

    node = nodes(pool)[0]
    bad = node.gpu_uuids[0]
    host = host_of(bad)
    if when == "before":
        cordon_host(host, actor="apikey:ops01", reason="fan noise")
    xid(bad, 79)
    if when == "after":
        assert state(host) == cordoned_by_agent(bad)
        cordon_host(Host.objects.get(pk=host.pk), actor="apikey:ops01", reason="fan noise")
    operators = ("CORDONED", "cordoned by apikey:ops01: fan noise", "apikey:ops01")
    assert state(host) == operators

    drive_pool(pool)

    assert GpuHealthInterval.objects.get(gpu_uuid=bad).ended_by == REPAIRED
    assert nodes(pool)[0].phase == "READY"
    assert state(host) == operators


def test_a_second_unhealthy_gpu_keeps_the_host_cordoned_until_its_repair_is_verified(
    owner, make_host, xid, settings
):
    """Five 1-GPU nodes on one host (two of five may be repaired at once; the circuit
    breaker's window is 0 s, as one host's fleet budget allows one automatic cordon): Xid 79
    on two of them; the first repair verified leaves the host cordoned, the second lifts it."""
    from fleet.models import GpuHealthInterval
    from nodepools.reconcile import reconcile_nodepool

    settings.NVKE_BREAKER_WINDOW_S = 0
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a")
    cluster = make_cluster(owner, "c1")
    op = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {"name": "ones", "gpu_model": "h100-sxm5-80gb", "gpus_per_node": 1, "node_count": 5},
    ).json()
    pool = op["target_id"]
    drive_pool(pool)
    first, second = nodes(pool)[:2]
    host = host_of(first.gpu_uuids[0])
    assert {n.host_id for n in nodes(pool)} == {host.pk}
    xid(first.gpu_uuids[0], 79)
    xid(second.gpu_uuids[0], 79)  # the host is cordoned already: it stays the first's cordon
    assert state(host) == cordoned_by_agent(first.gpu_uuids[0])

    for _ in range(40):
        reconcile_nodepool(pool)
        done = [n for n in nodes(pool)[:2] if not n.repair_state]
        if done:
            break
    (verified,) = done
    (waiting,) = [n for n in (first, second) if n.pk != verified.pk]
    assert GpuHealthInterval.objects.get(gpu_uuid=verified.gpu_uuids[0]).ended_by == REPAIRED
    assert GpuHealthInterval.objects.get(gpu_uuid=waiting.gpu_uuids[0]).ended_at is None
    assert state(host) == cordoned_by_agent(first.gpu_uuids[0])

    drive_pool(pool)

    assert [n.phase for n in nodes(pool)] == ["READY"] * 5
    assert GpuHealthInterval.objects.get(gpu_uuid=waiting.gpu_uuids[0]).ended_by == REPAIRED
    lifted = f"uncordoned: repair of {waiting.gpu_uuids[0]} verified"
    assert state(host) == ("ALLOCATED", lifted, "system:auto-repair")


def test_a_repair_not_verified_leaves_the_host_cordoned(pool, xid, settings):
    """The reboot leaves the GPU's row remap pending: the agent's reports after it are not
    clean, the node is replaced on healthy GPUs after the observed-state timeout, the GPU stays
    fenced and its host cordoned (the hardware needs a check)."""
    from clusters.providers import simhosts
    from fleet.models import Gpu, GpuHealthInterval

    settings.NVKE_OBSERVED_STATE_TIMEOUT_S = 0
    node = nodes(pool)[0]
    bad = node.gpu_uuids[0]
    host = host_of(bad)
    simhosts.change(host, lambda s: simhosts.set_fault(s, "reboot-leaves-remap-pending"))
    xid(bad, 79, remap_pending=True)
    assert state(host) == cordoned_by_agent(bad)

    drive_pool(pool)

    live = [n for n in nodes(pool) if n.phase != "DELETED"]
    assert node.id not in {n.id for n in live}  # replaced
    assert bad not in {u for n in live for u in n.gpu_uuids}
    assert Gpu.objects.get(uuid=bad).health_reason.startswith(
        f"not repaired by a reboot: node {node.name}"
    )
    assert GpuHealthInterval.objects.get(gpu_uuid=bad).ended_at is None
    assert state(host) == cordoned_by_agent(bad)
