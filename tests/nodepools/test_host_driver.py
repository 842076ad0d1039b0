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
