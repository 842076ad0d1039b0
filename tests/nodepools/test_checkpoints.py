"""Checkpoint-aware disruption (nodepools/checkpoints.py) on the simulated provider: a pool's
disruption hook, the request every planned drain asks first (CloudEvent
``nodepool.disruption.requested`` through the webhooks outbox), the wait for the ack (API or
pod annotation) or the deadline, and the emergencies that never wait. Each drain look is given
its instant, so the times asserted are exact."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.helpers import announce_gpu_fault, drive_pool, running_h100_pool

pytestmark = pytest.mark.django_db

PLANNED = ("upgrade", "isolation-change", "defrag-move", "host-maintenance", "scale-down")
EVENT = "nodepool.disruption.requested"


@pytest.fixture
def pool(owner, make_host, settings):
    """A RUNNING 3-node pool with a 300 s disruption hook and a webhook endpoint for the
    event (loopback: deliveries are rows here, no worker sends them)."""
    settings.NVKE_WEBHOOK_ALLOW_HTTP = True
    settings.NVKE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    cluster, pool_id = running_h100_pool(owner, make_host, hosts=4, nodes=3)
    url = f"/api/v1/clusters/{cluster}/nodepools/{pool_id}"
    resp = owner.put(f"{url}/disruption-hook", {"checkpoint_deadline_s": 300}, format="json")
    assert (resp.status_code, resp.json()) == (200, {"checkpoint_deadline_s": 300})
    hook = owner.post(
        "/api/v1/webhooks",
        {"url": "http://127.0.0.1:9/hook", "event_types": [EVENT]},
        format="json",
    )
    assert hook.status_code == 201, hook.content
    return cluster, pool_id, url


class Recording:
    """The pool's real backend (simulated provider), recording each eviction look."""

    def __init__(self, row):
        from clusters.providers import get_provider
        from nodepools import disruption
        from nodepools.specs import nodepool_spec

        self.inner = disruption.backend_for(get_provider(row.cluster.provider), nodepool_spec(row))
        self.evictions: list[str] = []

    def cordon(self, node):
        self.inner.cordon(node)

    def evict(self, node, *, force):
        self.evictions.append(node.name)
        return self.inner.evict(node, force=force)


def first_node(pool_id):
    from nodepools.models import Node, NodePool

    row = NodePool.objects.select_related("cluster").get(pk=pool_id)
    return row, Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name").first()


def events():
    from webhooks.models import WebhookDelivery

    return [
        d.event for d in WebhookDelivery.objects.filter(event_type=EVENT).order_by("created_at")
    ]


@pytest.mark.parametrize("caller", PLANNED)
def test_every_planned_disruption_asks_waits_and_evicts_only_after_the_ack(owner, pool, caller):
    from nodepools import disruption
    from nodepools.models import DisruptionRequest

    cluster, pool_id, url = pool
    row, node = first_node(pool_id)
    backend = Recording(row)
    policy = disruption.policy_for(caller, timeout_s=60 if caller == "upgrade" else None)
    t0 = timezone.now().replace(microsecond=0)
    deadline = t0 + timedelta(seconds=300)

    first = disruption.drain(node, policy, backend, t0)
    waiting = f"waiting for checkpoint (deadline {deadline.isoformat()})"
    assert (first.outcome, first.blockers, first.gated) == ("waiting", [waiting], True)
    node.refresh_from_db()
    assert (node.phase, node.drain_started_at) == ("DRAINING", t0)  # cordoned before asking
    assert backend.evictions == []  # nothing evicted while the tenant checkpoints
    (asked,) = DisruptionRequest.objects.filter(nodepool_id=pool_id)
    assert (asked.nodes, asked.reason, asked.requested_at, asked.deadline, asked.state) == (
        [node.name],
        caller,
        t0,
        deadline,
        "waiting",
    )
    (event,) = events()
    assert (event["type"], event["subject"], event["source"]) == (
        f"dev.nvke.{EVENT}",
        str(asked.id),
        url,
    )
    assert event["data"] == {
        "id": str(asked.id),
        "cluster_id": cluster,
        "nodepool_id": pool_id,
        "nodepool": "h100",
        "nodes": [node.name],
        "reason": caller,
        "requested_at": t0.isoformat(),
        "deadline": deadline.isoformat(),
        "ack": {
            "url": f"{url}/disruption-requests/{asked.id}/ack",
            "annotation": {"nvke.io/checkpointed": str(asked.id)},
        },
    }

    later = disruption.drain(node, policy, backend, t0 + timedelta(seconds=120))
    assert (later.outcome, later.blockers) == ("waiting", [waiting])  # the same request
    assert DisruptionRequest.objects.filter(nodepool_id=pool_id).count() == 1
    assert len(events()) == 1 and backend.evictions == []

    listed = owner.get(f"{url}/disruption-requests").json()["results"]
    assert [(r["id"], r["state"], r["nodes"]) for r in listed] == [
        (str(asked.id), "waiting", [node.name])
    ]
    before_ack = timezone.now()
    acked = owner.post(f"{url}/disruption-requests/{asked.id}/ack")
    assert acked.status_code == 200, acked.content
    body = acked.json()
    assert (body["state"], body["acknowledged_via"], body["released_at"]) == (
        "acknowledged",
        "api",
        None,
    )
    assert body["acknowledged_by"].startswith("apikey:")
    assert owner.post(f"{url}/disruption-requests/{asked.id}/ack").json() == body  # idempotent
    asked.refresh_from_db()
    assert before_ack <= asked.acknowledged_at <= timezone.now()

    t1 = t0 + timedelta(seconds=130)
    done = disruption.drain(node, policy, backend, t1)
    assert done.outcome == "drained"
    assert backend.evictions == [node.name]  # evicted at the first look after the ack
    asked.refresh_from_db()
    node.refresh_from_db()
    assert (asked.released_at, node.drain_started_at) == (t1, t1)  # pods' drain clock restarts
    # later looks of the same drain ask nothing more
    assert disruption.drain(node, policy, backend, t1 + timedelta(seconds=1)).outcome == "drained"
    assert DisruptionRequest.objects.filter(nodepool_id=pool_id).count() == 1


def test_the_drain_goes_on_at_the_deadline_when_no_ack_comes(owner, pool):
    from nodepools import disruption
    from nodepools.models import DisruptionRequest

    _, pool_id, url = pool
    row, node = first_node(pool_id)
    backend = Recording(row)
    policy = disruption.policy_for("upgrade", timeout_s=60)
    t0 = timezone.now().replace(microsecond=0)
    assert disruption.drain(node, policy, backend, t0).outcome == "waiting"
    just_before = disruption.drain(node, policy, backend, t0 + timedelta(seconds=299))
    assert (just_before.outcome, backend.evictions) == ("waiting", [])
    at_deadline = t0 + timedelta(seconds=300)
    assert disruption.drain(node, policy, backend, at_deadline).outcome == "drained"
    assert backend.evictions == [node.name]
    (asked,) = DisruptionRequest.objects.filter(nodepool_id=pool_id)
    assert (asked.state, asked.acknowledged_at, asked.released_at) == (
        "expired",
        None,
        at_deadline,
    )
    late = owner.post(f"{url}/disruption-requests/{asked.id}/ack")
    assert (late.status_code, late.json()["code"]) == (409, "disruption_request_expired")


def test_a_pod_annotation_carrying_the_request_id_acknowledges(pool):
    from clusters.providers.simulated import simulate_pod_annotations
    from nodepools import disruption
    from nodepools.models import DisruptionRequest

    _, pool_id, _ = pool
    row, node = first_node(pool_id)
    backend = Recording(row)
    policy = disruption.policy_for("scale-down")
    t0 = timezone.now().replace(microsecond=0)
    assert disruption.drain(node, policy, backend, t0).outcome == "waiting"
    (asked,) = DisruptionRequest.objects.filter(nodepool_id=pool_id)
    try:  # another request's id, then another annotation: not an ack
        simulate_pod_annotations(
            node.id,
            {
                "train/worker-0": {"nvke.io/checkpointed": "00000000-0000-0000-0000-000000000000"},
                "train/worker-1": {"example.com/other": str(asked.id)},
            },
        )
        assert disruption.drain(node, policy, backend, t0 + timedelta(seconds=5)).outcome == (
            "waiting"
        )
        simulate_pod_annotations(
            node.id, {"train/worker-0": {"nvke.io/checkpointed": f" {asked.id}\n"}}
        )
        t1 = t0 + timedelta(seconds=10)
        assert disruption.drain(node, policy, backend, t1).outcome == "drained"
    finally:
        simulate_pod_annotations(node.id, {})
    asked.refresh_from_db()
    assert (asked.state, asked.acknowledged_via, asked.acknowledged_by, asked.released_at) == (
        "acknowledged",
        "annotation",
        "train/worker-0",
        t1,
    )
    assert backend.evictions == [node.name]


@pytest.mark.parametrize("caller", ["repair", "deletion"])
def test_emergency_drains_never_ask(pool, caller):
    from nodepools import disruption
    from nodepools.models import DisruptionRequest

    _, pool_id, _ = pool
    row, node = first_node(pool_id)
    backend = Recording(row)
    result = disruption.drain(node, disruption.policy_for(caller), backend, timezone.now())
    assert (result.outcome, backend.evictions) == ("drained", [node.name])
    assert not DisruptionRequest.objects.exists() and events() == []


def test_an_xid_79_repair_of_a_pool_with_a_hook_does_not_wait(pool):
    """A GPU fallen off the bus (Xid 79): the node is replaced at once, nothing is asked."""
    from fleet.models import Gpu
    from nodepools.models import DisruptionRequest, Node

    _, pool_id, _ = pool
    _, node = first_node(pool_id)
    Gpu.objects.filter(uuid=node.gpu_uuids[0]).update(health="UNHEALTHY")
    announce_gpu_fault(node, xid=79, action="CONTACT_SUPPORT", needs_operator=True)
    drive_pool(pool_id)
    assert Node.objects.get(pk=node.pk).phase == "DELETED"
    live = Node.objects.live().filter(nodepool_id=pool_id)
    assert live.count() == 3 and {n.phase for n in live} == {"READY"}
    assert not DisruptionRequest.objects.exists() and events() == []


def test_a_pool_without_a_hook_does_not_ask(owner, pool):
    from nodepools import disruption
    from nodepools.models import DisruptionRequest

    _, pool_id, url = pool
    assert owner.delete(f"{url}/disruption-hook").status_code == 204
    assert owner.get(url).json()["disruption_hook"] == {}
    row, node = first_node(pool_id)
    result = disruption.drain(
        node, disruption.policy_for("scale-down"), Recording(row), timezone.now()
    )
    assert result.outcome == "drained"
    assert not DisruptionRequest.objects.exists()


def test_the_hook_defaults_to_600_s_is_bounded_by_the_operator_and_audited(owner, pool, settings):
    from tenants.models import AuditEvent

    _, pool_id, url = pool
    settings.NVKE_CHECKPOINT_DEADLINE_MAX_S = 900
    assert owner.put(f"{url}/disruption-hook", {}, format="json").json() == {
        "checkpoint_deadline_s": 600
    }
    assert owner.get(url).json()["disruption_hook"] == {"checkpoint_deadline_s": 600}
    assert owner.get(f"{url}/disruption-hook").json() == {"checkpoint_deadline_s": 600}
    too_long = owner.put(f"{url}/disruption-hook", {"checkpoint_deadline_s": 901}, format="json")
    body = too_long.json()
    assert (too_long.status_code, body["code"], body["field"]) == (
        400,
        "checkpoint_deadline_too_long",
        "checkpoint_deadline_s",
    )
    assert "900" in body["detail"] and "NVKE_CHECKPOINT_DEADLINE_MAX_S" in body["detail"]
    unknown = owner.put(f"{url}/disruption-hook", {"webhook": "x"}, format="json")
    assert unknown.status_code == 400
    settings.NVKE_CHECKPOINT_DEADLINE_MAX_S = 120
    assert owner.put(f"{url}/disruption-hook", {}, format="json").json() == {
        "checkpoint_deadline_s": 120
    }
    audits = AuditEvent.objects.filter(action="nodepool.disruption_hook", target_id=pool_id)
    assert audits.count() == 3  # the fixture's, 600, 120 (the refused ones changed nothing)


def test_another_tenant_cannot_read_or_acknowledge_a_request(owner, outsider, viewer, pool):
    from nodepools import disruption
    from nodepools.models import DisruptionRequest

    _, pool_id, url = pool
    row, node = first_node(pool_id)
    disruption.drain(node, disruption.policy_for("scale-down"), Recording(row), timezone.now())
    (asked,) = DisruptionRequest.objects.filter(nodepool_id=pool_id)
    missing = "00000000-0000-0000-0000-000000000000"
    for path in (f"disruption-requests/{asked.id}/ack", f"disruption-requests/{missing}/ack"):
        resp = outsider.post(f"{url}/{path}")
        assert resp.status_code == 404, resp.content
    assert outsider.get(f"{url}/disruption-requests").status_code == 404
    assert outsider.get(f"{url}/disruption-requests/{asked.id}").status_code == 404
    assert outsider.put(f"{url}/disruption-hook", {}, format="json").status_code == 404
    assert viewer.post(f"{url}/disruption-requests/{asked.id}/ack").status_code == 403
    asked.refresh_from_db()
    assert (asked.state, asked.acknowledged_at) == ("waiting", None)
    assert owner.get(f"{url}/disruption-requests/{asked.id}").json()["state"] == "waiting"


def test_an_upgrade_shows_it_waits_for_the_checkpoint_and_goes_on_after_the_ack(owner, pool):
    """The driver upgrade through the API and the pool's reconciler: the node stays cordoned
    and draining, the operation's progress and the Upgrading condition say what it waits
    for; the ack lets the next step take the node on (installed, then verified)."""
    from clusters.models import Operation
    from nodepools.models import DisruptionRequest, Node, NodePool
    from nodepools.reconcile import reconcile_nodepool

    _, pool_id, url = pool
    resp = owner.post(f"{url}/upgrade", {"driver_version": "580.95.05"}, format="json")
    assert resp.status_code == 202, resp.content
    for _ in range(3):
        reconcile_nodepool(pool_id)
    (asked,) = DisruptionRequest.objects.filter(nodepool_id=pool_id)
    (draining,) = Node.objects.filter(nodepool_id=pool_id, upgrade_state="draining")
    assert (asked.reason, asked.nodes, draining.phase) == ("upgrade", [draining.name], "DRAINING")
    waiting = f"{draining.name}: waiting for checkpoint (deadline {asked.deadline.isoformat()})"
    op = Operation.objects.get(pk=resp.json()["id"])
    assert op.progress["stage"] == f"upgrading {draining.name}; {waiting}"
    upgrading = next(
        c for c in NodePool.objects.get(pk=pool_id).conditions if c["type"] == "Upgrading"
    )
    assert upgrading["message"] == f"0 of 3 nodes; {waiting}"

    assert owner.post(f"{url}/disruption-requests/{asked.id}/ack").status_code == 200
    reconcile_nodepool(pool_id)
    draining.refresh_from_db()
    asked.refresh_from_db()
    assert draining.upgrade_state == "verifying"  # drained and installed
    assert asked.acknowledged_at <= asked.released_at


def test_a_scale_down_says_it_waits_for_the_checkpoint_and_removes_the_node_after_the_ack(
    owner, pool
):
    from clusters.models import Operation
    from nodepools.models import DisruptionRequest, Node, NodePool
    from nodepools.reconcile import reconcile_nodepool

    _, pool_id, url = pool
    resp = owner.post(f"{url}/set-size", {"node_count": 2}, format="json")
    assert resp.status_code == 202, resp.content
    for _ in range(3):
        reconcile_nodepool(pool_id)
    (asked,) = DisruptionRequest.objects.filter(nodepool_id=pool_id)
    (leaving,) = asked.nodes
    assert (asked.reason, Node.objects.get(name=leaving).phase) == ("scale-down", "DRAINING")
    waiting = f"{leaving}: waiting for checkpoint (deadline {asked.deadline.isoformat()})"
    blocked = next(
        c for c in NodePool.objects.get(pk=pool_id).conditions if c["type"] == "ScaleDownBlocked"
    )
    assert (blocked["status"], blocked["reason"], blocked["message"]) == (
        "True",
        "WaitingForCheckpoint",
        waiting,
    )
    op = Operation.objects.get(pk=resp.json()["id"])
    assert (op.status, op.progress["stage"]) == ("RUNNING", f"removing 1 node(s): {waiting}")

    assert owner.post(f"{url}/disruption-requests/{asked.id}/ack").status_code == 200
    drive_pool(pool_id)
    assert Node.objects.get(name=leaving).phase == "DELETED"
    assert Operation.objects.get(pk=resp.json()["id"]).status == "DONE"
    asked.refresh_from_db()
    assert asked.acknowledged_at <= asked.released_at
