"""The NVIDIA driver is the host's, one for every node on it (issue 33: a fresh-user trial ran
``nvkectl nodepools upgrade t3 miglay --driver-version R580`` and saw the ``ex4`` node on the
same host switch to 580.95.05 ten seconds later, with no operation on ``ex4``).

Fleet, worked by hand: SIMULATED 8-GPU H100 hosts (``make_host``; the agent's report runs
in-process) whose driver is 570.172.08 (CUDA 12.8) before anything is installed. ``R580``
installs 580.95.05, the newest R580 release the catalog knows. Two 4-GPU pools of one cluster
fit one host (4 + 4 = 8 GPUs); best fit puts a second pool's node on the host the first one
partly uses (4 free GPUs left there, 8 on an empty one).
"""

from __future__ import annotations

import pytest

from tests.helpers import drive_pool, make_cluster

pytestmark = pytest.mark.django_db

MODEL = "h100-sxm5-80gb"
OLD = "570.172.08"
PINNED = {"name": "pinned", "gpu_model": MODEL, "gpus_per_node": 4, "node_count": 1}


@pytest.fixture
def host_with(make_host):
    """``host_with("gpu-a")``: an 8-GPU H100 host in us-east-1a reporting driver 570.172.08."""
    from fleet.models import Host

    def make(hostname: str, gpus: int = 8):
        host = make_host(MODEL, gpus=gpus, zone="us-east-1a", hostname=hostname)
        Host.objects.filter(pk=host.pk).update(driver_version=OLD, cuda_version="12.8")
        return host

    return make


def add_pool(client, cluster: str, name: str, *, gpus: int = 4, driver: str = "", **extra) -> str:
    body = {
        "name": name,
        "gpu_model": MODEL,
        "gpus_per_node": gpus,
        "node_count": 1,
        "driver_version": driver,
        **extra,
    }
    response = client.post(f"/api/v1/clusters/{cluster}/nodepools", body, format="json")
    assert response.status_code == 202, response.json()
    return response.json()["target_id"]


def only_node(pool_id):
    from nodepools.models import Node

    (node,) = Node.objects.live().filter(nodepool_id=pool_id).select_related("host")
    return node


def api_driver(client, cluster: str, pool_id) -> tuple[str, str]:
    """(host, driver) of the pool's one node, as the API shows it to the tenant."""
    (node,) = client.get(f"/api/v1/clusters/{cluster}/nodepools/{pool_id}").json()["nodes"]
    return node["host"], node["driver_version"]


@pytest.fixture
def two_pools_one_host(owner, host_with):
    """Cluster c1 with ``ex4`` (exclusive, no pin) and ``miglay`` (MIG 1g.10gb, no pin), one
    4-GPU node each, both RUNNING on the one host ``gpu-a``."""
    host_with("gpu-a")
    cluster = make_cluster(owner, "c1")
    ex4 = add_pool(owner, cluster, "ex4")
    drive_pool(ex4)
    miglay = add_pool(owner, cluster, "miglay", isolation={"mode": "mig", "mig_profile": "1g.10gb"})
    drive_pool(miglay)
    assert only_node(ex4).host.hostname == only_node(miglay).host.hostname == "gpu-a"
    return cluster, ex4, miglay


def test_a_driver_upgrade_is_refused_while_another_pools_node_shares_the_host(
    owner, two_pools_one_host
):
    from clusters.models import Operation
    from nodepools.models import NodePool

    cluster, ex4, miglay = two_pools_one_host
    ex4_node = only_node(ex4).name
    ops_before = Operation.objects.count()

    response = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools/{miglay}/upgrade",
        {"driver_version": "R580"},
        format="json",
    )

    assert response.status_code == 409
    assert response["Content-Type"].startswith("application/problem+json")
    body = response.json()
    assert (body["code"], body["field"], body["retryable"]) == (
        "host_driver_shared",
        "driver_version",
        False,
    )
    assert body["detail"] == (
        "installing driver R580 would change the driver under other pools' nodes without "
        f"draining them: host gpu-a (driver 570.172.08) also runs node {ex4_node} of pool "
        "ex4. A host's driver is one for all its nodes; move those nodes off the host (or "
        "this pool's nodes) first"
    )
    assert body["hosts"] == [
        {
            "host": "gpu-a",
            "driver_version": OLD,
            "nodes": [{"name": ex4_node, "pool": "ex4"}],
            "other_tenants_nodes": 0,
        }
    ]
    # nothing started, nothing changed: no operation, the pool keeps no pin, both nodes 570
    assert Operation.objects.count() == ops_before
    pool = NodePool.objects.get(pk=miglay)
    assert (pool.phase, pool.driver_version, pool.upgrade) == ("RUNNING", "", {})
    assert api_driver(owner, cluster, ex4) == ("gpu-a", OLD)
    assert api_driver(owner, cluster, miglay) == ("gpu-a", OLD)


def test_the_same_upgrade_runs_when_the_pools_node_has_its_host_to_itself(
    owner, two_pools_one_host
):
    """Once ``ex4`` is gone from the host, ``miglay``'s upgrade is taken and installs
    580.95.05 on gpu-a."""
    from nodepools.reconcile import reconcile_nodepool

    cluster, ex4, miglay = two_pools_one_host
    deleted = owner.delete(f"/api/v1/clusters/{cluster}/nodepools/{ex4}")
    assert deleted.status_code == 202, deleted.json()
    for _ in range(20):
        if reconcile_nodepool(ex4) is None:
            break
    response = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools/{miglay}/upgrade",
        {"driver_version": "R580"},
        format="json",
    )
    assert response.status_code == 202, response.json()
    drive_pool(miglay, max_steps=40)
    assert api_driver(owner, cluster, miglay) == ("gpu-a", "580.95.05")


def test_the_documented_way_out_gives_the_pool_a_host_of_its_own(
    owner, two_pools_one_host, host_with
):
    """docs/tenant/isolation.md: scale the pool to 0, upgrade it (no node to roll), scale it
    back to 1. Its new node pins R580 and goes to the empty gpu-b, not beside ex4 on gpu-a
    (4 free GPUs there again); ex4 keeps 570.172.08."""
    from clusters.models import Operation

    cluster, ex4, miglay = two_pools_one_host
    host_with("gpu-b")
    base = f"/api/v1/clusters/{cluster}/nodepools/{miglay}"
    assert owner.post(f"{base}/set-size", {"node_count": 0}).status_code == 202
    drive_pool(miglay)
    op = owner.post(f"{base}/upgrade", {"driver_version": "R580"}, format="json")
    assert op.status_code == 202, op.json()
    drive_pool(miglay)
    assert Operation.objects.get(pk=op.json()["id"]).status == "DONE"
    assert owner.post(f"{base}/set-size", {"node_count": 1}).status_code == 202
    drive_pool(miglay)
    assert api_driver(owner, cluster, miglay) == ("gpu-b", "580.95.05")
    assert api_driver(owner, cluster, ex4) == ("gpu-a", OLD)


def test_a_pinned_pool_is_placed_on_an_empty_host_rather_than_the_shared_one(owner, host_with):
    """Best fit alone picks gpu-a (4 GPUs free beside ``ex4``, leftover 0) over the empty
    gpu-b (leftover 4); R580 differs from gpu-a's 570.172.08 and ``ex4`` runs there, so the
    pinned pool's node goes to gpu-b, and ``ex4`` keeps 570.172.08."""
    host_with("gpu-a")
    host_with("gpu-b")
    cluster = make_cluster(owner, "c1")
    ex4 = add_pool(owner, cluster, "ex4")
    drive_pool(ex4)
    assert api_driver(owner, cluster, ex4) == ("gpu-a", OLD)

    pinned = add_pool(owner, cluster, "pinned", driver="R580")
    drive_pool(pinned)

    assert api_driver(owner, cluster, pinned) == ("gpu-b", "580.95.05")
    assert api_driver(owner, cluster, ex4) == ("gpu-a", OLD)


def test_an_unpinned_pool_takes_the_drivers_of_the_host_it_lands_on(owner, host_with):
    """One host gpu-b: the pinned pool's node installs R580 there (580.95.05); a pool without
    a pin placed beside it later runs 580.95.05, the host's driver, and the pinned pool's pin
    still holds."""
    host_with("gpu-b")
    cluster = make_cluster(owner, "c1")
    pinned = add_pool(owner, cluster, "pinned", driver="R580")
    drive_pool(pinned)
    unpinned = add_pool(owner, cluster, "later")
    drive_pool(unpinned)
    assert api_driver(owner, cluster, unpinned) == ("gpu-b", "580.95.05")
    assert api_driver(owner, cluster, pinned) == ("gpu-b", "580.95.05")


def test_a_pinned_pool_that_only_fits_beside_another_pools_node_is_refused_and_says_why(
    owner, host_with
):
    """One host gpu-a, ``ex4`` on 4 of its GPUs: a pool pinning R580 has 4 free GPUs but no
    host it may change the driver of. The dry run and the failed create say so."""

    host_with("gpu-a")
    cluster = make_cluster(owner, "c1")
    ex4 = add_pool(owner, cluster, "ex4")
    drive_pool(ex4)
    why = (
        "the pool pins driver R580, and the hosts with room run another driver beside other "
        "nodes (a host's driver is one for all its nodes: it is changed only on a host that "
        "no other node uses)"
    )
    dry = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools?dry_run=true",
        {**PINNED, "driver_version": "R580"},
        format="json",
    ).json()
    assert dry["capacity"]["placeable_now"] is False
    assert dry["capacity"]["free_gpus"] == 4
    assert dry["capacity"]["message"] == f"not placeable now: 4 GPU(s) free on-demand, but {why}"

    op = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {**PINNED, "driver_version": "R580"},
        format="json",
    ).json()
    drive_pool(op["target_id"])
    # a create without capacity fails (retryable), as docs/concepts/disruption.md says
    error = owner.get(f"/api/v1/operations/{op['id']}").json()["error"]
    assert (error["code"], error["retryable"]) == ("insufficient_capacity", True)
    assert error["message"] == (
        "no free host with 4 x h100-sxm5-80gb GPU(s) in region 'us-east-1' (0 of 1 node(s) "
        f"could be placed): {why}"
    )
    assert api_driver(owner, cluster, ex4) == ("gpu-a", OLD)


def test_a_rollout_pauses_when_another_pools_node_arrived_after_the_upgrade_was_accepted(
    owner, host_with
):
    """``miglay`` alone on gpu-a: its R580 upgrade is accepted. ``ex4`` is then placed on
    gpu-a's other 4 GPUs (it pins nothing, and nothing is installed yet; it is in the tenant's
    other cluster, c2). At the install the
    rollout pauses, naming ex4's node, and gpu-a keeps 570.172.08."""
    from nodepools.models import NodePool
    from nodepools.reconcile import reconcile_nodepool

    host_with("gpu-a")
    cluster = make_cluster(owner, "c1")
    miglay = add_pool(owner, cluster, "miglay")
    drive_pool(miglay)
    accepted = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools/{miglay}/upgrade",
        {"driver_version": "R580"},
        format="json",
    )
    assert accepted.status_code == 202, accepted.json()
    # the upgrade holds cluster c1's operation lock: ex4 comes in the tenant's cluster c2
    other = make_cluster(owner, "c2")
    ex4 = add_pool(owner, other, "ex4")
    drive_pool(ex4)
    ex4_node = only_node(ex4).name
    assert api_driver(owner, other, ex4) == ("gpu-a", OLD)

    for _ in range(10):
        if reconcile_nodepool(miglay) is None:
            break
    pool = NodePool.objects.get(pk=miglay)
    assert pool.upgrade["state"] == "paused"
    blocked = next(c for c in pool.conditions if c["type"] == "UpgradeBlocked")
    assert (blocked["status"], blocked["reason"]) == ("True", "UpgradeFailed")
    assert blocked["message"] == (
        f"node {only_node(miglay).name}: installing driver R580 would change the driver under "
        "other pools' nodes without draining them: host gpu-a (driver 570.172.08) also runs "
        f"node {ex4_node} of pool ex4. A host's driver is one for all its nodes; move those "
        "nodes off the host (or this pool's nodes) first; resume with force or after fixing it"
    )
    assert api_driver(owner, other, ex4) == ("gpu-a", OLD)
    assert api_driver(owner, cluster, miglay) == ("gpu-a", OLD)


def test_other_tenants_nodes_on_a_shared_host_are_counted_never_named(
    owner, outsider, make_host, operator
):
    """A shared (hypervisor) host with tenant A's and tenant B's MIG VM nodes: A's driver
    upgrade is refused, and the refusal says "1 node(s) of other tenants" without B's node
    or pool name."""
    from fleet.models import Host
    from nodepools.models import Node

    host = make_host(MODEL, gpus=2, hostname="hv-shared-1")
    Host.objects.filter(pk=host.pk).update(driver_version=OLD, cuda_version="12.8")
    response = operator.post(
        f"/api/v1/fleet/hosts/{host.id}/tenancy", {"tenancy": "shared"}, format="json"
    )
    assert response.status_code == 200, response.json()
    shared = {"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"}
    cluster_a = make_cluster(owner, "a")
    pool_a = add_pool(owner, cluster_a, "mine", gpus=1, isolation=shared)
    drive_pool(pool_a)
    cluster_b = make_cluster(outsider, "b")
    pool_b = add_pool(outsider, cluster_b, "theirs", gpus=1, isolation=shared)
    drive_pool(pool_b)
    (b_node,) = Node.objects.filter(nodepool_id=pool_b)
    assert b_node.host_id == host.id

    response = owner.post(
        f"/api/v1/clusters/{cluster_a}/nodepools/{pool_a}/upgrade",
        {"driver_version": "R580"},
        format="json",
    )
    assert response.status_code == 409
    body = response.json()
    assert body["hosts"] == [
        {"host": "hv-shared-1", "driver_version": OLD, "nodes": [], "other_tenants_nodes": 1}
    ]
    assert body["detail"] == (
        "installing driver R580 would change the driver under other pools' nodes without "
        "draining them: host hv-shared-1 (driver 570.172.08) also runs 1 node(s) of other "
        "tenants. A host's driver is one for all its nodes; move those nodes off the host (or "
        "this pool's nodes) first"
    )
    assert b_node.name not in response.content.decode()
    assert "theirs" not in response.content.decode()
