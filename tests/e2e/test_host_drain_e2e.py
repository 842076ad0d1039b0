"""A host holding two tenants' nodes is drained to MAINTENANCE over real HTTP, and a real
Celery worker process moves the nodes: every pool ends RUNNING on other hosts (or, without
capacity, short with a condition), the host ends MAINTENANCE and empty, the ledger closes the
old nodes' rows and opens the new ones'.

Hosts are SIMULATED rows; the second tenant's node is seated on the shared host by hand
(:func:`tests.helpers.seat_on_shared_host`: placement keeps hosts dedicated to one tenant).
"""

from __future__ import annotations

import pytest
import requests

from tests.e2e.conftest import wait_for
from tests.helpers import seat_on_shared_host
from tests.nodepools.test_host_drain import drive_all, make_pool, step

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def shared_host(owner, outsider, make_host):
    from nodepools.models import Node

    busy = make_host("h100-sxm5-80gb", gpus=8, hostname="busy")
    pool_a = make_pool(owner, "a")
    drive_all([pool_a[1]])
    b_home = make_host("h100-sxm5-80gb", gpus=8, hostname="b-home")
    pool_b = make_pool(outsider, "b")
    step(pool_b[1])
    seat_on_shared_host(Node.objects.get(nodepool_id=pool_b[1]), busy)
    b_home.delete()
    drive_all([pool_b[1]])
    nodes = {str(n.nodepool_id): n for n in Node.objects.filter(phase="READY", host=busy)}
    assert set(nodes) == {pool_a[1], pool_b[1]}
    assert len({n.tenant_id for n in nodes.values()}) == 2
    return busy, [pool_a, pool_b], nodes


def operator_session() -> requests.Session:
    from tenants.services import create_api_key

    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {create_api_key(tenant=None, name='op')[1]}"
    return session


def drain_over_http(live_server, host, force: bool = False) -> dict:
    resp = operator_session().post(
        f"{live_server.url}/api/v1/fleet/hosts/{host.id}/drain",
        json={"target": "MAINTENANCE", "force": force},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def pool_state(pool_id):
    from nodepools.models import NodePool

    pool = NodePool.objects.get(pk=pool_id)
    ready = [
        (n.host.hostname, n.phase)
        for n in pool.nodes.exclude(phase="DELETED").select_related("host")
    ]
    short = next((c for c in pool.conditions if c["type"] == "CapacityShort"), {})
    return pool.phase, ready, short.get("status")


def test_a_drain_to_maintenance_moves_two_tenants_nodes_to_other_hosts(
    shared_host, make_host, live_server, request
):
    from billing.models import LedgerEntry
    from clusters.models import Operation
    from fleet.models import Gpu, Host
    from nodepools.models import Node

    busy, pools, old_nodes = shared_host
    request.getfixturevalue("worker")  # the real worker process from here on
    make_host("h100-sxm5-80gb", gpus=8, hostname="spare-1")
    make_host("h100-sxm5-80gb", gpus=8, hostname="spare-2")
    body = drain_over_http(live_server, busy)
    assert body["state_reason"] == "draining to MAINTENANCE: 0 of 2 node(s) moved, 2 pending"

    def drained():
        host = Host.objects.get(pk=busy.pk)
        states = [pool_state(p) for _, p in pools]
        done = host.state == "MAINTENANCE" and all(s[0] == "RUNNING" for s in states)
        return done and (host, states)

    host, states = wait_for(drained, timeout=90, what="host MAINTENANCE, pools RUNNING")
    assert host.state_reason == "drained to MAINTENANCE: 2 of 2 node(s) moved, none pending"
    assert not Gpu.objects.filter(host=busy, holder_id__isnull=False).exists()
    hosts = sorted(s[1][0][0] for s in states)
    assert hosts == ["spare-1", "spare-2"]  # one tenant per host: dedicated hosts
    assert all(s[1] == [(s[1][0][0], "READY")] for s in states)
    for _cluster, pool_id in pools:
        op = Operation.objects.get(target_id=pool_id, type="HOST_MAINTENANCE")
        assert (op.status, op.progress["done"], op.progress["total"]) == ("DONE", 1, 1)
        old = Node.objects.get(pk=old_nodes[pool_id].pk)
        assert (old.phase, old.move_state) == ("DELETED", "moved")
        assert {(e.period.lower, e.period.upper) for e in LedgerEntry.objects.filter(node=old)} == {
            (old.ready_at, old.released_at)
        }
        new = Node.objects.get(nodepool_id=pool_id, phase="READY")
        rows = LedgerEntry.objects.filter(node=new)
        assert sorted(e.gpu_uuid for e in rows) == sorted(new.gpu_uuids)
        assert {(e.period.lower, e.period.upper) for e in rows} == {(new.ready_at, None)}
        assert new.ready_at <= old.released_at  # the replacement served before the old left


def test_without_room_for_both_one_pool_moves_and_the_other_runs_short(
    shared_host, make_host, live_server, request
):
    from fleet.models import Host

    busy, pools, _old = shared_host
    request.getfixturevalue("worker")
    make_host("h100-sxm5-80gb", gpus=4, hostname="small")  # room for one 4-GPU node
    # one pool would be left without a replacement: refused unless forced (test_commitments)
    drain_over_http(live_server, busy, force=True)

    def settled():
        host = Host.objects.get(pk=busy.pk)
        states = sorted(pool_state(p) for _, p in pools)
        phases = [s[0] for s in states]
        return host.state == "MAINTENANCE" and phases == ["DEGRADED", "RUNNING"] and (host, states)

    host, states = wait_for(settled, timeout=90, what="host MAINTENANCE, one pool short")
    assert host.state_reason == "drained to MAINTENANCE: 2 of 2 node(s) moved, none pending"
    assert states == [("DEGRADED", [], "True"), ("RUNNING", [("small", "READY")], None)]
