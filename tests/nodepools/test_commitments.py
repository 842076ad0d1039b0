"""Commitments are never broken silently: a host drain that would leave a pool short — on an
ACTIVE reservation, or any pool whose node would have no replacement — is refused (409 naming
the pool, and the reservation if any) unless forced; a forced
drain goes ahead, audited and sent to the tenant as ``commitment.broken``; a failing host's
drain (an emergency) and auto-repair of a GPU fallen off the bus are never refused or held.

Fleet: one simulated 8-GPU H100 host ``only``; tenant A reserves its 8 GPUs and runs a pool of
2 x 4 GPUs on the reservation, so both nodes sit on ``only``.
"""

from __future__ import annotations

import pytest

from tests.reservations.conftest import MODEL, pool_on_reservation

pytestmark = pytest.mark.django_db


@pytest.fixture
def reserved_pool(owner, make_host, settings):
    settings.NVKE_WEBHOOK_ALLOW_HTTP = True
    settings.NVKE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    host = make_host(MODEL, gpus=8, hostname="only")
    reservation, pool_id = pool_on_reservation(owner, reserved_gpus=8, nodes=2, gpus_per_node=4)
    from nodepools.models import Node

    assert sorted(Node.objects.live().values_list("host__hostname", "phase")) == [
        ("only", "READY"),
        ("only", "READY"),
    ]
    hook = owner.post(
        "/api/v1/webhooks",
        {"url": "http://127.0.0.1:9/hook", "event_types": ["commitment.broken"]},
        format="json",
    )
    assert hook.status_code == 201, hook.content
    return host, reservation, pool_id


def commitment_events():
    from webhooks.models import WebhookDelivery

    return list(WebhookDelivery.objects.filter(event_type="commitment.broken"))


def test_a_drain_that_would_short_a_reservation_pool_is_409_naming_it_and_touches_nothing(
    reserved_pool, operator
):
    from fleet.models import Host, HostEvent
    from tenants.models import AuditEvent

    host, reservation, pool_id = reserved_pool
    host.refresh_from_db()
    assert host.state == "ALLOCATED"
    resp = operator.post(f"/api/v1/fleet/hosts/{host.id}/drain", {}, format="json")
    body = resp.json()
    assert (resp.status_code, body["code"], body["field"]) == (
        409,
        "commitment_would_break",
        "force",
    )
    assert body["detail"] == (
        "draining host only would break reservation train-q4 (node pool r/trainers): 2 of 2 "
        f"node(s) (8 GPU(s)) have no other {MODEL} host in us-east-1. Drain with force to go "
        "ahead (the tenants are told)"
    )
    assert [(c["reservation_id"], c["nodepool_id"]) for c in body["commitments"]] == [
        (reservation["id"], pool_id)
    ]
    # nothing was touched: the host is as it was, no event, no audit, no webhook
    after = Host.objects.get(pk=host.pk)
    assert (after.state, after.drain_target) == ("ALLOCATED", "")
    assert not HostEvent.objects.filter(host=host, kind="ACTION").exists()
    assert not AuditEvent.objects.filter(action="host.drain.commitment_broken").exists()
    assert commitment_events() == []
    # the maintenance shortcut (no force) is refused the same way
    resp = operator.post(f"/api/v1/fleet/hosts/{host.id}/maintenance", {}, format="json")
    assert (resp.status_code, resp.json()["code"]) == (409, "commitment_would_break")


def test_with_another_host_for_its_nodes_the_drain_goes_ahead_unforced(
    reserved_pool, operator, make_host
):
    host, _reservation, _pool_id = reserved_pool
    make_host(MODEL, gpus=8, hostname="spare")
    resp = operator.post(f"/api/v1/fleet/hosts/{host.id}/drain", {}, format="json")
    assert (resp.status_code, resp.json()["drain_nodes"]) == (200, 2)
    assert commitment_events() == []


def test_a_forced_drain_proceeds_is_audited_and_the_tenant_gets_a_webhook_event(
    reserved_pool, operator, tenant_a, django_capture_on_commit_callbacks
):
    from nodepools.models import NodePool
    from tenants.models import AuditEvent

    host, reservation, pool_id = reserved_pool
    with django_capture_on_commit_callbacks(execute=True):
        resp = operator.post(f"/api/v1/fleet/hosts/{host.id}/drain", {"force": True}, format="json")
    assert (resp.status_code, resp.json()["drain_target"], resp.json()["drain_force"]) == (
        200,
        "CORDONED",
        True,
    )
    (audit,) = AuditEvent.objects.filter(action="host.drain.commitment_broken")
    assert (audit.tenant_id, audit.target_type, audit.target_id) == (
        tenant_a.id,
        "reservation",
        reservation["id"],
    )
    assert (audit.after["why"], audit.after["host"], audit.after["nodepool_name"]) == (
        "force",
        "only",
        "trainers",
    )
    (event,) = commitment_events()
    assert event.tenant_id == tenant_a.id
    assert event.event["subject"] == str(host.id)
    data = event.event["data"]
    assert (data["why"], data["host"]) == ("force", "only")
    named = [(c["reservation_name"], c["nodepool_id"], c["missing"]) for c in data["commitments"]]
    assert named == [
        (
            "train-q4",
            pool_id,
            f"2 of 2 node(s) (8 GPU(s)) have no other {MODEL} host in us-east-1",
        )
    ]
    # the drain then runs as any other: the nodes move off, the pool runs short and says so
    from nodepools.reconcile import reconcile_nodepool

    for _ in range(10):
        reconcile_nodepool(pool_id)
    pool = NodePool.objects.get(pk=pool_id)
    short = next(c for c in pool.conditions if c["type"] == "CapacityShort")
    assert (pool.phase, short["status"]) == ("DEGRADED", "True")
    assert short["message"].startswith("runs 0 of 2 node(s)")
    # Ready and NodesReady count the same nodes as the phase (a trial read "2 of 2 nodes
    # ready" beside DEGRADED with no node left)
    conds = {c["type"]: c for c in pool.conditions}
    assert (conds["Ready"]["status"], conds["Ready"]["reason"], conds["Ready"]["message"]) == (
        "False",
        "CapacityShort",
        "0 of 2 nodes ready; 2 node(s) not placed",
    )
    assert (conds["NodesReady"]["status"], conds["NodesReady"]["message"]) == (
        "False",
        "0 of 2 nodes ready; 2 node(s) not placed",
    )


def test_an_emergency_drain_of_a_failing_host_is_never_refused_and_says_what_it_broke(
    reserved_pool, operator, django_capture_on_commit_callbacks
):
    from fleet.models import Host
    from tenants.models import AuditEvent

    host, _reservation, _pool_id = reserved_pool
    Host.objects.filter(pk=host.pk).update(state="NOT_READY")
    with django_capture_on_commit_callbacks(execute=True):
        resp = operator.post(f"/api/v1/fleet/hosts/{host.id}/drain", {}, format="json")
    assert resp.status_code == 200, resp.content
    (audit,) = AuditEvent.objects.filter(action="host.drain.commitment_broken")
    assert audit.after["why"] == "emergency"
    (event,) = commitment_events()
    assert event.event["data"]["why"] == "emergency"


def test_auto_repair_of_a_gpu_fallen_off_the_bus_never_waits_on_the_reservation(
    reserved_pool,
):
    """Xid 79: the node is replaced at once (released, its replacement looked for), with no
    spare host and a reservation it leaves short — the emergency path is never blocked."""
    from fleet.models import Gpu
    from nodepools.models import Node, NodePool
    from nodepools.reconcile import reconcile_nodepool
    from tests.nodepools.test_repair import fault

    _host, _reservation, pool_id = reserved_pool
    node = Node.objects.filter(nodepool_id=pool_id).order_by("name").first()
    Gpu.objects.filter(uuid=node.gpu_uuids[0]).update(health="UNHEALTHY")
    fault(node, "CONTACT_SUPPORT", 79)
    for _ in range(10):
        reconcile_nodepool(pool_id)
    node.refresh_from_db()
    assert node.phase == "DELETED"
    pool = NodePool.objects.get(pk=pool_id)
    assert Node.objects.live().filter(nodepool_id=pool_id).count() == 1
    short = next(c for c in pool.conditions if c["type"] == "CapacityShort")
    assert short["status"] == "True"
    assert commitment_events() == []


def test_only_the_nodes_a_pool_would_lack_need_another_host(owner, make_host, operator):
    """Nodes of the pool on other hosts count (a defragmentation move's replacement is placed
    before its drain): the drain is refused for what the pool would lack, not for every node
    on the host."""
    from fleet.models import Host
    from nodepools.models import Node, NodePool

    make_host(MODEL, gpus=8, hostname="only")
    make_host(MODEL, gpus=4, hostname="small")
    _, pool_id = pool_on_reservation(owner, reserved_gpus=12, nodes=3, gpus_per_node=4, name="r12")
    assert sorted(Node.objects.live().values_list("host__hostname", flat=True)) == [
        "only",
        "only",
        "small",
    ]
    only = Host.objects.get(hostname="only")
    resp = operator.post(f"/api/v1/fleet/hosts/{only.id}/drain", {}, format="json")
    assert resp.status_code == 409
    (commitment,) = resp.json()["commitments"]
    assert commitment["missing"] == (
        f"2 of 3 node(s) (8 GPU(s)) have no other {MODEL} host in us-east-1"
    )
    # the pool asks for one node now: the one on ``small`` is enough, nothing breaks
    NodePool.objects.filter(pk=pool_id).update(node_count=1)
    resp = operator.post(f"/api/v1/fleet/hosts/{only.id}/drain", {}, format="json")
    assert resp.status_code == 200, resp.content


def test_a_drain_that_would_leave_a_pool_without_a_replacement_is_409_unless_forced(
    owner, make_host, operator, tenant_a, django_capture_on_commit_callbacks, settings
):
    """A pool on no reservation: its one node on the fleet's only H100 host would leave with
    nothing to take its place (a fresh-user trial drained such a host and the pool lost its
    node in 2 s). Refused naming cluster/pool and what is missing; with ``force`` the drain
    goes ahead, audited against the pool, and the tenant gets ``commitment.broken`` with no
    reservation; with a spare host it goes ahead unforced."""
    from fleet.models import Host
    from tenants.models import AuditEvent
    from tests.nodepools.test_host_drain import drive_all, make_pool

    settings.NVKE_WEBHOOK_ALLOW_HTTP = True
    settings.NVKE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    host = make_host(MODEL, gpus=8, hostname="lone")
    _cluster, pool_id = make_pool(owner, "plain")
    drive_all([pool_id])
    hook = owner.post(
        "/api/v1/webhooks",
        {"url": "http://127.0.0.1:9/hook", "event_types": ["commitment.broken"]},
        format="json",
    )
    assert hook.status_code == 201, hook.content

    resp = operator.post(f"/api/v1/fleet/hosts/{host.id}/drain", {}, format="json")
    body = resp.json()
    assert (resp.status_code, body["code"]) == (409, "commitment_would_break"), body
    assert body["detail"] == (
        "draining host lone would break node pool plain/h100: 1 of 1 node(s) (4 GPU(s)) have "
        f"no other {MODEL} host in us-east-1. Drain with force to go ahead (the tenants are told)"
    )
    (commitment,) = body["commitments"]
    assert (
        commitment["kind"],
        commitment["reservation_id"],
        commitment["nodepool_id"],
        commitment["cluster_name"],
    ) == ("no_replacement", None, pool_id, "plain")
    assert Host.objects.get(pk=host.pk).drain_target == ""

    with django_capture_on_commit_callbacks(execute=True):
        resp = operator.post(f"/api/v1/fleet/hosts/{host.id}/drain", {"force": True}, format="json")
    assert (resp.status_code, resp.json()["drain_force"]) == (200, True)
    (audit,) = AuditEvent.objects.filter(action="host.drain.commitment_broken")
    assert (audit.tenant_id, audit.target_type, str(audit.target_id)) == (
        tenant_a.id,
        "nodepool",
        pool_id,
    )
    (event,) = commitment_events()
    (item,) = event.event["data"]["commitments"]
    assert (item["kind"], item["reservation_id"], item["nodepool_name"]) == (
        "no_replacement",
        None,
        "h100",
    )


def test_with_a_spare_host_a_plain_pools_drain_is_not_refused(owner, make_host, operator):
    from tests.nodepools.test_host_drain import drive_all, make_pool

    host = make_host(MODEL, gpus=8, hostname="lone")
    _cluster, pool_id = make_pool(owner, "plain")
    drive_all([pool_id])
    make_host(MODEL, gpus=8, hostname="spare")
    resp = operator.post(f"/api/v1/fleet/hosts/{host.id}/drain", {}, format="json")
    assert (resp.status_code, resp.json()["drain_nodes"]) == (200, 1), resp.content
