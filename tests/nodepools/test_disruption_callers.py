"""Every caller that takes a node out of service, started through its real entry point (the
API, or the signal a fleet fault sends), driven by the reconciler as a Celery worker would,
in each situation a drain meets: each goes through the one primitive
(:func:`nodepools.disruption.drain`) with its own policy, and says what happened in its own
terms (operation status and error, the node's phase, where the blocking pod is named).

Situations (the blocking pod is :data:`BLOCKER` on every node of the disrupted pool(s),
simulated by :func:`clusters.providers.simulated.simulate_drain_blockers`):

- ``drained``: nothing blocks;
- ``blocked -> pause`` / ``evict`` / ``fail``: the pod stays past the drain timeout (60 s:
  ``NVKE_SCALE_DOWN_DRAIN_TIMEOUT_S``, ``NVKE_HOST_DRAIN_TIMEOUT_S``, an upgrade's
  ``drain_timeout_s``) and the primitive is handed that ``on_timeout``. Where it is the
  caller's own configuration (``*`` in :data:`EXPECTED`) nothing is changed; otherwise a
  wrapper around :func:`nodepools.disruption.policy_for` gives the caller's real policy with
  that ``on_timeout`` (no caller configures ``fail`` today), to show what the caller's own
  code makes of the outcome. Immediate callers (repair, deletion) never reach a timeout;
- ``force``: the operator's ``force`` where the caller has one (an upgrade's request, a
  host drain, a defragmentation move's host drained again with force); a scale-down and an
  isolation change have none: the cell is what they do with the pod there.

Time: the first looks run at the wall clock; in the blocked situations the next ones each 61 s
after the one before (the reconciler's ``now``: every drain started is past its timeout at the
next look), then the wall clock again until the caller settles.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.helpers import announce_gpu_fault, running_h100_pool
from tests.nodepools.test_host_drain import BLOCKER, make_pool

pytestmark = pytest.mark.django_db

TIMEOUT_S = 60
SITUATIONS = ("drained", "blocked -> pause", "blocked -> evict", "blocked -> fail", "force")

SCALE_DOWN_BLOCKED = ("condition ScaleDownBlocked", "operation stage")
UPGRADE_PAUSED = ("condition UpgradeBlocked", "condition Upgrading", "operation stage")
#: what each caller shows (a caller, or ``caller (variant)``), written out by hand (not read
#: from ``disruption.POLICIES``):
#: ``(status of its operation, error code, phase of the node it disrupted, where the blocking
#: pod is named at the end)``. ``*``: the caller's own ``on_timeout``.
EXPECTED: dict[str, dict[str, tuple[str, str, str, tuple[str, ...]]]] = {
    # set-size 2 -> 1: the newest node drains; at its timeout the pod is evicted (*evict) and
    # the node DELETED, the operation DONE. A pause or fail answer leaves the operation RUNNING
    # with the node DRAINING, ScaleDownBlocked and the operation's stage naming the pod (a
    # scale-down has no pause state, nor a way to fail). No force on a scale-down:
    # the pod is waited for up to the timeout, then evicted, as in *evict.
    "scale-down": {
        "drained": ("DONE", "", "DELETED", ()),
        "blocked -> pause": ("RUNNING", "", "DRAINING", SCALE_DOWN_BLOCKED),
        "blocked -> evict": ("DONE", "", "DELETED", ()),  # *
        "blocked -> fail": ("RUNNING", "", "DRAINING", SCALE_DOWN_BLOCKED),
        "force": ("DONE", "", "DELETED", ()),
    },
    # an upgrade with drain_timeout_s 60: at the timeout the rollout pauses (*pause) on the
    # node (DRAINING, upgrade_state drain-blocked), the operation RUNNING with stage "paused:
    # …", UpgradeBlocked and Upgrading (reason Paused) naming the pod. Evicted, the rollout
    # goes on and is DONE with the node upgraded and READY. A FAILED drain pauses it as a
    # blocked one does (the operation is not failed: an operator resumes it). force in the
    # request: no wait, DONE.
    "upgrade": {
        "drained": ("DONE", "", "READY", ()),
        "blocked -> pause": ("RUNNING", "", "DRAINING", UPGRADE_PAUSED),  # *
        "blocked -> evict": ("DONE", "", "READY", ()),
        "blocked -> fail": ("RUNNING", "", "DRAINING", UPGRADE_PAUSED),
        "force": ("DONE", "", "READY", ()),
    },
    # an isolation change (time-slicing): its timeout is infinite (*pause never reached), so
    # whatever on_timeout says the pod is waited for: the operation RUNNING naming it in its
    # stage, the node DRAINING; nothing is evicted. No force on an isolation change.
    "isolation-change": {
        "drained": ("DONE", "", "READY", ()),
        "blocked -> pause": ("RUNNING", "", "DRAINING", ("operation stage",)),  # *
        "blocked -> evict": ("RUNNING", "", "DRAINING", ("operation stage",)),
        "blocked -> fail": ("RUNNING", "", "DRAINING", ("operation stage",)),
        "force": ("RUNNING", "", "DRAINING", ("operation stage",)),
    },
    # a GPU fault whose catalog action reboots the node (Xid 48): an emergency, immediate
    # drain: the pod never holds it, whatever the situation: rebooted, verified, READY;
    # REPAIR_NODES DONE
    "repair (reboot)": {situation: ("DONE", "", "READY", ()) for situation in SITUATIONS},
    # a hardware fault (Xid 79, CONTACT_SUPPORT): the node is released at once (DELETED) under
    # the repair policy (not the deletion one) and replaced on healthy GPUs; REPAIR_NODES DONE
    "repair (replace)": {situation: ("DONE", "", "DELETED", ()) for situation in SITUATIONS},
    # the operator drains the node's host to MAINTENANCE (a replacement is placed on the
    # other host first): at the timeout the move pauses (*pause) on the node (DRAINING,
    # move_state drain-blocked), the HOST_MAINTENANCE operation RUNNING and HostDrainBlocked
    # naming the pod; a FAILED drain is paused the same way. Evicted or forced (the drain
    # requested with force): the node is released (DELETED), the operation DONE.
    "host-maintenance": {
        "drained": ("DONE", "", "DELETED", ()),
        "blocked -> pause": ("RUNNING", "", "DRAINING", ("condition HostDrainBlocked",)),  # *
        "blocked -> evict": ("DONE", "", "DELETED", ()),
        "blocked -> fail": ("RUNNING", "", "DRAINING", ("condition HostDrainBlocked",)),
        "force": ("DONE", "", "DELETED", ()),
    },
    # a defragmentation run moves the node off its host (host step: the host is drained to
    # CORDONED): at the timeout the move pauses (*pause) and the run FAILS with move_blocked
    # naming the pod, the node DRAINING; a FAILED drain does the same. Evicted, or the host
    # drained again with force (the run's own advice): the node is released, the run DONE.
    "defrag-move": {
        "drained": ("DONE", "", "DELETED", ()),
        "blocked -> pause": (
            "FAILED",
            "move_blocked",
            "DRAINING",
            ("condition HostDrainBlocked", "run error"),
        ),  # *
        "blocked -> evict": ("DONE", "", "DELETED", ()),
        "blocked -> fail": (
            "FAILED",
            "move_blocked",
            "DRAINING",
            ("condition HostDrainBlocked", "run error"),
        ),
        "force": ("DONE", "", "DELETED", ()),
    },
    # the pool deleted through the API: its machines go, the pods with them (immediate), in
    # every situation: the node DELETED, DELETE_NODE_POOL DONE
    "deletion": {situation: ("DONE", "", "DELETED", ()) for situation in SITUATIONS},
}

#: each caller's own ``on_timeout`` (what the starred cells use), written out by hand
OWN_ON_TIMEOUT = {
    "scale-down": "evict",
    "upgrade": "pause",
    "isolation-change": "pause",
    "host-maintenance": "pause",
    "defrag-move": "pause",
    "repair": "evict",
    "deletion": "evict",
}
IMMEDIATE = {"repair", "deletion"}
#: callers the operator cannot force: their force cell waits past the timeout like the others
NO_FORCE = {"scale-down", "isolation-change"}
#: callers with a force of their own (an upgrade's request, a host drain, a host drained again)
FORCE = {"upgrade", "host-maintenance", "defrag-move"}

#: what a blocked drain shows within its timeout (before the first look past it), written out
#: by hand: the operation (the run) RUNNING, the node DRAINING, and where the pod is named
WAITING = {
    "scale-down": ("RUNNING", "", "DRAINING", SCALE_DOWN_BLOCKED),
    # "0 of 2 nodes; n: draining, waiting for default/trainer-0 (…)"
    "upgrade": ("RUNNING", "", "DRAINING", ("condition Upgrading", "operation stage")),
    "isolation-change": ("RUNNING", "", "DRAINING", ("operation stage",)),
    "host-maintenance": (
        "RUNNING",
        "",
        "DRAINING",
        ("condition HostMaintenance", "operation stage"),
    ),
    # the run says "0 of 1 node(s) moved"; the pool's HOST_MAINTENANCE condition names the pod
    "defrag-move": ("RUNNING", "", "DRAINING", ("condition HostMaintenance",)),
}


def two_node_pool(owner, make_host) -> dict:
    """A RUNNING pool of two 8-GPU H100 nodes (three hosts)."""
    cluster, pool_id = running_h100_pool(owner, make_host, hosts=3, nodes=2)
    return {"url": f"/api/v1/clusters/{cluster}/nodepools/{pool_id}", "pools": [pool_id]}


def two_hosts_of_one_tenant(owner, make_host) -> dict:
    """Tenant A's two clusters, each a one-node pool (4 GPUs) on its own 8-GPU host: ``a-1``
    (the pool disrupted) and ``a-2`` (4 GPUs free: where a replacement or a move goes)."""
    from fleet.services import cordon_host, uncordon_host
    from tests.nodepools.test_host_drain import drive_all

    first = make_host("h100-sxm5-80gb", gpus=8, hostname="a-1")
    pool_1 = make_pool(owner, "a1")[1]
    drive_all([pool_1])
    cordon_host(first, actor="test")
    make_host("h100-sxm5-80gb", gpus=8, hostname="a-2")
    pool_2 = make_pool(owner, "a2")[1]
    drive_all([pool_2])
    uncordon_host(first, actor="test")
    return {"host": first, "pools": [pool_1, pool_2]}


def start(case: str, fleet: dict, force: bool, clients: dict) -> dict:
    """Start the disruption of ``case`` (a key of :data:`EXPECTED`) through its entry point;
    what :func:`drive` and :func:`seen` need (``op``: how to find the caller's operation)."""
    from nodepools.models import Node

    owner, operator = clients["owner"], clients["operator"]
    pool_id = fleet["pools"][0]
    if case == "scale-down":
        resp = owner.post(f"{fleet['url']}/set-size", {"node_count": 1})
    elif case == "upgrade":
        body = {"driver_version": "580.95.05", "drain_timeout_s": TIMEOUT_S, "force": force}
        resp = owner.post(f"{fleet['url']}/upgrade", body, format="json")
    elif case == "isolation-change":
        change = {"isolation": {"mode": "time-slicing", "replicas": 4}}
        resp = owner.patch(fleet["url"], change, format="json")
    elif case.startswith("repair"):
        from fleet.models import Gpu

        node = Node.objects.filter(nodepool_id=pool_id).order_by("created_at", "name").first()
        if case == "repair (reboot)":
            announce_gpu_fault(node, xid=48, action="WORKFLOW_XID_48", needs_operator=True)
        else:  # the GPU is fenced: the replacement goes on healthy ones
            Gpu.objects.filter(uuid=node.gpu_uuids[0]).update(health="UNHEALTHY")
            announce_gpu_fault(node, xid=79, action="CONTACT_SUPPORT", needs_operator=True)
        return {"op": ("REPAIR_NODES", pool_id)}
    elif case == "host-maintenance":
        body = {"target": "MAINTENANCE", "force": force}
        resp = operator.post(f"/api/v1/fleet/hosts/{fleet['host'].id}/drain", body, format="json")
        assert resp.status_code == 200, resp.content
        return {"op": ("HOST_MAINTENANCE", pool_id)}
    elif case == "defrag-move":
        from nodepools.defrag import advance_run

        resp = operator.post("/api/v1/fleet/defrag/runs", {}, format="json")
        assert resp.status_code == 202, resp.content
        run_id = resp.json()["id"]
        assert advance_run(run_id) is not None  # the step starts: a-1 drained to CORDONED
        if force:  # the run's advice for a blocked move: drain the host again with force
            body = {"target": "CORDONED", "force": True}
            again = operator.post(
                f"/api/v1/fleet/hosts/{fleet['host'].id}/drain", body, format="json"
            )
            assert again.status_code == 200, again.content
        return {"run": run_id}
    else:
        assert case == "deletion"
        resp = owner.delete(fleet["url"])
    assert resp.status_code == 202, resp.content
    return {"op": (resp.json()["type"], pool_id)}


def drive(fleet: dict, started: dict, *, since=None, step_s: float = 0, rounds: int = 25) -> None:
    """The reconcilers (and the defragmentation run's task) in turn until they all settle or
    ``rounds`` pass (a blocked drain never settles: it is looked at again and again): at the
    wall clock, or with ``since`` at ``since + step_s``, ``since + 2 * step_s`` … (each round
    past the timeout of a drain started the round before)."""
    from nodepools.defrag import advance_run
    from nodepools.reconcile import reconcile_nodepool

    for i in range(1, rounds + 1):
        now = since + timedelta(seconds=i * step_s) if since is not None else None
        delays = [reconcile_nodepool(p, now=now) for p in fleet["pools"]]
        if "run" in started:
            delays.append(advance_run(started["run"], now=now))
        if all(d is None or d >= 30 for d in delays):
            return


def seen(fleet: dict, started: dict, node_id) -> tuple[str, str, str, tuple[str, ...]]:
    """What the caller shows: its operation's (or run's) status and error code, the phase of
    the node it disrupted, and where the blocking pod is named."""
    from clusters.models import Operation
    from nodepools.defrag_models import DefragRun
    from nodepools.models import Node, NodePool

    named = []
    if "run" in started:
        run = DefragRun.objects.get(pk=started["run"])
        status, error, stage = run.status, run.error or {}, run.progress.get("stage", "")
        if BLOCKER in error.get("message", ""):
            named.append("run error")
    else:
        type_, pool_id = started["op"]
        op = Operation.objects.filter(target_id=pool_id, type=type_).latest("created_at")
        status, error, stage = op.status, op.error or {}, (op.progress or {}).get("stage", "")
        if BLOCKER in stage:
            named.append("operation stage")
        if BLOCKER in error.get("message", ""):
            named.append("operation error")
    pool = NodePool.objects.get(pk=fleet["pools"][0])
    named += [
        f"condition {c['type']}"
        for c in pool.conditions
        if c.get("status") == "True" and BLOCKER in c.get("message", "")
    ]
    phase = Node.objects.get(pk=node_id).phase
    return (status, error.get("code", ""), phase, tuple(sorted(named)))


@pytest.mark.parametrize("situation", SITUATIONS)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_every_caller_drains_through_the_one_primitive_and_says_what_happened(
    case, situation, owner, operator, make_host, monkeypatch, settings
):
    from clusters.providers.simulated import simulate_drain_blockers
    from nodepools import disruption
    from nodepools.models import Node

    settings.NVKE_SCALE_DOWN_DRAIN_TIMEOUT_S = TIMEOUT_S
    settings.NVKE_HOST_DRAIN_TIMEOUT_S = TIMEOUT_S
    caller = case.split(" (")[0]  # the POLICIES row it drains under
    assert set(disruption.POLICIES) == {c.split(" (")[0] for c in EXPECTED}  # a row per caller
    moves = caller in ("host-maintenance", "defrag-move")
    fleet = (two_hosts_of_one_tenant if moves else two_node_pool)(owner, make_host)
    pool_id = fleet["pools"][0]
    blocked = situation.startswith("blocked") or situation == "force"
    nodes = list(Node.objects.filter(nodepool_id=pool_id))
    for node in nodes:
        simulate_drain_blockers(node.id, [BLOCKER] if blocked else [])

    # every drain, recorded on its way to the real primitive
    drains: list[tuple] = []
    real_drain, real_policy_for = disruption.drain, disruption.policy_for

    def recording_drain(node, policy, backend, now):
        result = real_drain(node, policy, backend, now)
        drains.append((node.pk, policy, result.outcome))
        return result

    monkeypatch.setattr(disruption, "drain", recording_drain)
    on_timeout = situation.removeprefix("blocked -> ") if situation.startswith("blocked") else ""
    if on_timeout and on_timeout != OWN_ON_TIMEOUT[caller]:

        def policy_answering(caller_, **kwargs):  # the caller's policy, another on_timeout
            policy = real_policy_for(caller_, **kwargs)
            return policy if caller_ != caller else replace(policy, on_timeout=on_timeout)

        monkeypatch.setattr(disruption, "policy_for", policy_answering)
    try:
        started = start(case, fleet, situation == "force", {"owner": owner, "operator": operator})
        t0 = timezone.now()
        drive(fleet, started, rounds=6)
        if blocked and caller not in IMMEDIATE and not (situation == "force" and caller in FORCE):
            # within the timeout: the node is cordoned and draining, and the pod is named
            first = next(pk for pk, p, _ in drains if p.caller == caller)
            assert seen(fleet, started, first) == WAITING[caller], (caller, situation)
        past_timeout = situation.startswith("blocked") or (
            situation == "force" and caller in NO_FORCE
        )
        if past_timeout and caller not in IMMEDIATE:
            drive(fleet, started, since=t0, step_s=TIMEOUT_S + 1, rounds=8)
        drive(fleet, started, rounds=15)
    finally:
        for node in nodes:
            simulate_drain_blockers(node.id, [])

    # the caller's drains went through the primitive, under its policy
    ours = [(pk, policy, outcome) for pk, policy, outcome in drains if policy.caller == caller]
    assert ours, (caller, situation, [p.caller for _, p, _ in drains])
    disrupted = ours[0][0]
    assert {pk for pk, _, _ in ours} <= {n.pk for n in nodes}
    policy = ours[0][1]
    assert policy.immediate == (caller in IMMEDIATE)
    outcomes = [outcome for _, _, outcome in ours]
    if caller in IMMEDIATE:  # never waits: the pod does not hold it for one look
        assert set(outcomes) == {"drained"}
    elif on_timeout and caller != "isolation-change":  # its timeout is never reached
        answer = {"pause": "blocked", "evict": "drained", "fail": "failed"}[on_timeout]
        assert outcomes[0] == "waiting" and answer in outcomes
    if case == "scale-down":  # both healthy: the newest leaves (disruption.removal_order)
        newest = max(nodes, key=lambda n: (n.created_at, n.name))
        assert disrupted == newest.pk
    if situation == "force" and caller in FORCE:
        assert any(p.force for _, p, _ in ours)
    if on_timeout and caller not in IMMEDIATE:
        assert {p.on_timeout for _, p, _ in ours} == {on_timeout}
    # no other caller drains these nodes, except the machine's deletion (release_nodes, the
    # deletion policy) looking once more at a node a scale-down or a move released
    others = {p.caller for pk, p, _ in drains if pk in {n.pk for n in nodes}} - {caller}
    assert others <= (
        {"deletion"} if caller in ("scale-down", "host-maintenance", "defrag-move") else set()
    )

    assert seen(fleet, started, disrupted) == EXPECTED[case][situation], (case, situation)
