"""A node pool dry run's reservation figures are facts of the fleet, and "placeable from"
counts host shapes (issue 33 items 8 and 9; a fresh-user trial against ``make run``).

* ``held_by_reservations`` was 0 for a request that fitted and the GPUs reservation pools hold
  for one that did not: the same fleet read 0 for a 4-GPU pool and 4 for an 8-GPU pool.
* "placeable from <reservation end>" counted GPUs: two hosts with 4 GPUs each freed at the end
  made an 8-GPU node "placeable from" then, though no host would have 8 free.

Fleet: 2 simulated hosts x 8 H100 in us-east-1a (16 GPUs, region us-east-1).
"""

from __future__ import annotations

import pytest

from tests.helpers import drive_pool, make_cluster
from tests.reservations.conftest import pool_body, reserve

pytestmark = pytest.mark.django_db


def dry(client, cluster, body) -> dict:
    resp = client.post(f"/api/v1/clusters/{cluster}/nodepools?dry_run=true", body, format="json")
    assert resp.status_code == 200, resp.content
    return resp.json()["capacity"]


def create(client, cluster, body):
    return client.post(f"/api/v1/clusters/{cluster}/nodepools", body, format="json")


def create_and_drive(client, cluster, body) -> str:
    resp = create(client, cluster, body)
    assert resp.status_code == 202, resp.content
    pool_id = resp.json()["target_id"]
    drive_pool(pool_id)
    return pool_id


def held_per_host(hosts) -> list[list[tuple[str, int]]]:
    """Per host: (pool name, GPUs) of the nodes on it, sorted."""
    from nodepools.models import Node

    out = []
    for host in hosts:
        nodes = Node.objects.filter(host=host).exclude(phase="DELETED").select_related("nodepool")
        out.append(sorted((n.nodepool.name, len(n.gpu_uuids)) for n in nodes))
    return out


def test_held_by_reservations_is_the_same_for_a_4_and_an_8_gpu_pool(owner, outsider, h100_fleet):
    """By hand: A reserves 12 (4 h, drain) and its pool holds 4 of them (one 4-GPU node).
    C = 16, D = 0, R = 12: unreserved pools may take 16 - 0 - 12 = 4. B's 4-GPU pool fits now
    (the other host has 8 free), B's 8-GPU pool does not (until the reservation ends); both
    read held_by_reservations = 4 (the GPUs A's reservation node holds). Before: 0 and 4."""
    r = reserve(owner, 12, end_action="drain").json()
    create_and_drive(
        owner, make_cluster(owner, "a"), pool_body("res", 1, gpus=4, reservation=r["id"])
    )
    b = make_cluster(outsider, "b")

    four = dry(outsider, b, pool_body("p4", 1, gpus=4))
    eight = dry(outsider, b, pool_body("p8", 1, gpus=8))
    assert (four["placeable_now"], four["free_gpus"], four["reserved_gpus"]) == (True, 4, 12)
    assert (eight["placeable_now"], eight["free_gpus"], eight["reserved_gpus"]) == (False, 4, 12)
    assert four["held_by_reservations"] == eight["held_by_reservations"] == 4
    assert eight["placeable_from"].replace("Z", "+00:00") == r["end"].replace("Z", "+00:00")
    assert "4 of them held by reservation pools now" in eight["message"]
    assert four["unit"] == eight["unit"] == "gpu"
    # on its own reservation A's pool reads the GPUs *other* reservations hold: none
    own = dry(owner, make_cluster(owner, "a2"), pool_body("more", 1, gpus=4, reservation=r["id"]))
    assert (own["held_by_reservations"], own["free_gpus"], own["reserved_gpus"]) == (0, 8, 12)


@pytest.fixture
def split_fleet(owner, h100_fleet):
    """Tenant A's GPUs half reserved on each host (worked by hand, best fit, A's tenancy):
    A's on-demand 4-GPU node ``od1`` goes to the first host; A reserves 8 (4 h, drain) and its
    2 x 4 reservation nodes fill the first host's other 4 and half of the second; A's second
    on-demand 4-GPU node ``od2`` (16 - 4 - 8 = 4 free on-demand) fills the second host.
    C = 16, D = 8, R = 8: nothing is free on-demand now; at the reservation's end 4 GPUs come
    free on each host."""
    cluster = make_cluster(owner, "a")
    create_and_drive(owner, cluster, pool_body("od1", 1, gpus=4))
    r = reserve(owner, 8, end_action="drain").json()
    create_and_drive(owner, cluster, pool_body("res", 2, gpus=4, reservation=r["id"]))
    create_and_drive(owner, cluster, pool_body("od2", 1, gpus=4))
    by_host = held_per_host(h100_fleet)
    assert sorted(by_host) == [[("od1", 4), ("res", 4)], [("od2", 4), ("res", 4)]]
    return r


def test_placeable_from_counts_host_shapes_not_gpus(owner, split_fleet):
    """By hand, at the reservation's end: D + needed + R = 8 + 8 + 0 = 16 <= 16, so by count
    8 more GPUs fit; but the 8 freed GPUs are 4 on each host. One 8-GPU node needs one host
    with 8 free: never as the fleet is (placeable_from null; before: the reservation's end).
    Two 4-GPU nodes (the same 8 GPUs) fit one per host: placeable from the end."""
    end = split_fleet["end"].replace("Z", "+00:00")
    cluster = make_cluster(owner, "a2")

    one_by_8 = dry(owner, cluster, pool_body("big", 1, gpus=8))
    assert (one_by_8["placeable_now"], one_by_8["free_gpus"], one_by_8["needed_gpus"]) == (
        False,
        0,
        8,
    )
    assert one_by_8["placeable_from"] is None
    assert "no host with room for a node once they end" in one_by_8["message"]

    two_by_4 = dry(owner, cluster, pool_body("pair", 2, gpus=4))
    assert (two_by_4["placeable_now"], two_by_4["needed_gpus"]) == (False, 8)
    assert two_by_4["placeable_from"].replace("Z", "+00:00") == end
    assert f"placeable from {end}" in two_by_4["message"].replace("Z", "+00:00")
    # both read the same fleet facts
    for cap in (one_by_8, two_by_4):
        assert (cap["held_by_reservations"], cap["reserved_gpus"]) == (8, 8)

    # the create's 409 says the same as the dry run
    refused = create(owner, cluster, pool_body("big", 1, gpus=8))
    assert (refused.status_code, refused.json()["code"]) == (409, "capacity_reserved")
    assert refused.json()["placeable_from"] is None
    refused = create(owner, cluster, pool_body("pair", 2, gpus=4))
    assert (refused.status_code, refused.json()["code"]) == (409, "capacity_reserved")
    assert refused.json()["placeable_from"].replace("Z", "+00:00") == end


def test_an_unhealthy_gpu_freed_at_the_end_is_not_counted_as_room(owner, split_fleet, h100_fleet):
    """The shape check at the reservation's end uses the placeability of now: with one of the
    second host's reservation GPUs UNHEALTHY, the end frees 4 + 3 healthy GPUs; a 4-GPU node
    still fits on the first host, two do not (the second host has 3)."""
    from fleet.models import Gpu
    from nodepools.models import Node

    first = Node.objects.get(nodepool__name="od1").host_id
    second = next(h.id for h in h100_fleet if h.id != first)
    res_on_second = Node.objects.get(nodepool__name="res", host_id=second)
    Gpu.objects.filter(uuid=res_on_second.gpu_uuids[0]).update(health="UNHEALTHY")
    end = split_fleet["end"].replace("Z", "+00:00")
    cluster = make_cluster(owner, "a2")
    one = dry(owner, cluster, pool_body("one", 1, gpus=4))
    assert one["placeable_from"].replace("Z", "+00:00") == end
    two = dry(owner, cluster, pool_body("two", 2, gpus=4))
    assert two["placeable_from"] is None
