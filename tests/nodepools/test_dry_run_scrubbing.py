"""A dry run counts no GPU being scrubbed as free (issue 33, D4): a fresh-user trial scaled a
pool of 1-GPU nodes 5 -> 3 on an 8-GPU host and at once dry-ran 6 more 1-GPU nodes: the dry run
said "6 GPU(s) free on-demand, but no host set fits the nodes" while the fragmentation report
said ``free_gpus 4`` and the defrag page "2 released GPU(s) ... are being scrubbed".

Fleet: one 8-GPU H100 host (us-east-1a); pool ``small`` of 2 x 1-GPU nodes holds GPUs 0 and 1;
GPUs 2 and 3 were released and their scrubs are not confirmed (``scrub_state`` PENDING).
By hand: 8 - 2 held - 2 scrubbing = 4 free; 6 x 1-GPU nodes need 6, which the host has once the
two scrubs are done (8 - 2 = 6).
"""

from __future__ import annotations

import pytest

from tests.helpers import drive_pool, make_cluster

pytestmark = pytest.mark.django_db

H100 = "h100-sxm5-80gb"


@pytest.fixture
def cluster(owner, make_host):
    from fleet.models import Gpu

    host = make_host(H100, gpus=8, zone="us-east-1a")
    cluster = make_cluster(owner, "c1")
    op = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {"name": "small", "gpu_model": H100, "gpus_per_node": 1, "node_count": 2},
    ).json()
    drive_pool(op["target_id"])
    assert Gpu.objects.filter(host=host, holder_id__isnull=False).count() == 2
    Gpu.objects.filter(host=host, index__in=[2, 3]).update(scrub_state="PENDING")
    return cluster


def dry_run(owner, cluster, nodes: int) -> dict:
    resp = owner.post(
        f"/api/v1/clusters/{cluster}/nodepools?dry_run=true",
        {"name": "more", "gpu_model": H100, "gpus_per_node": 1, "node_count": nodes},
        format="json",
    )
    assert resp.status_code == 200, resp.content
    return resp.json()["capacity"]


def test_the_dry_run_and_fragmentation_count_the_same_free_gpus(owner, cluster):
    from fleet.fragmentation import fragmentation_report

    cap = dry_run(owner, cluster, 6)
    (h100,) = fragmentation_report()["groups"]
    assert h100["free_gpus"] == 4
    assert (cap["free_gpus"], cap["scrubbing_gpus"], cap["needed_gpus"]) == (4, 2, 6)
    assert (cap["placeable_now"], cap["placeable_from"]) == (False, None)
    assert cap["message"] == (
        "not placeable now: 4 GPU(s) free on-demand; 2 more GPU(s) are being scrubbed after "
        "their last release and will be free shortly (when the agent reports the scrub), then "
        "the nodes fit"
    )


def test_nodes_the_free_gpus_hold_are_placeable_now_while_others_scrub(owner, cluster):
    cap = dry_run(owner, cluster, 4)
    assert (cap["placeable_now"], cap["free_gpus"], cap["scrubbing_gpus"]) == (True, 4, 2)
    assert cap["message"] == "placeable now: 4 GPU(s) free on-demand"


def test_more_than_the_scrubs_free_is_not_called_a_scrub_wait(owner, cluster):
    cap = dry_run(owner, cluster, 7)  # 6 at most once scrubbed
    assert (cap["placeable_now"], cap["placeable_from"]) == (False, None)
    assert cap["message"] == "not placeable now: 4 GPU(s) free on-demand (2 more being scrubbed)"


def test_once_the_scrubs_are_done_both_say_six(owner, cluster):
    from fleet.fragmentation import fragmentation_report
    from fleet.models import Gpu

    Gpu.objects.filter(scrub_state="PENDING").update(scrub_state="CLEAN")
    cap = dry_run(owner, cluster, 6)
    (h100,) = fragmentation_report()["groups"]
    assert (h100["free_gpus"], cap["free_gpus"], cap["scrubbing_gpus"]) == (6, 6, 0)
    assert (cap["placeable_now"], cap["message"]) == (
        True,
        "placeable now: 6 GPU(s) free on-demand",
    )
