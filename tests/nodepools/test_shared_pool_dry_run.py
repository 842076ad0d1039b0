"""A ``tenancy: shared`` pool's dry runs answer in GPU instances on shared hosts (issue 33
items 6 and 7; a fresh-user trial against ``make run``): the create dry run reported the
dedicated hosts' whole GPUs (free 8 on the bare-metal host) for a pool that is only ever placed
as MIG instances on shared hosts, and a scale-down dry run said "1 GPU(s)" for a node holding
one ``1g.10gb`` instance.

Fleet (SIMULATED hosts): ``bm-1``, a dedicated 8-GPU H100; ``hv-shared-1``, a shared 2-GPU
H100. H100-SXM5-80GB MIG placements (catalog ``-lgipp``): 3g.40gb at {0, 4} size 4, 1g.10gb at
{0..6} size 1, 7 compute slices. Tenant A's one 3g.40gb instance takes slices 0-3 of GPU 0:
1g.10gb instances that still fit: GPU 0 at 4, 5, 6 (3; compute 3 + 3 = 6 of 7) and GPU 1 at
0..6 (7): 10 in all.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from tests.helpers import drive_pool, make_cluster
from tests.nodepools.test_shared_hosts import MODEL, make_pool, shared

pytestmark = pytest.mark.django_db


def pool_body(name: str, nodes: int, gpus: int, isolation: dict) -> dict:
    return {
        "name": name,
        "gpu_model": MODEL,
        "gpus_per_node": gpus,
        "node_count": nodes,
        "isolation": isolation,
    }


@pytest.fixture
def fleet(make_host, operator, owner):
    from billing.prices import set_price

    since = timezone.now() - timedelta(days=1)
    set_price(gpu_model=MODEL, effective_from=since, hourly_rate=Decimal("2.50"))
    make_host(MODEL, gpus=8, hostname="bm-1")
    host = make_host(MODEL, gpus=2, hostname="hv-shared-1")
    resp = operator.post(
        f"/api/v1/fleet/hosts/{host.id}/tenancy", {"tenancy": "shared"}, format="json"
    )
    assert resp.status_code == 200, resp.content
    a = make_pool(owner, make_cluster(owner, "a"), "mig3g", shared("3g.40gb"))
    drive_pool(a)
    return host


def dry(client, cluster, body) -> dict:
    resp = client.post(f"/api/v1/clusters/{cluster}/nodepools?dry_run=true", body, format="json")
    assert resp.status_code == 200, resp.content
    return resp.json()


def test_a_shared_pool_dry_run_counts_free_instances_of_its_profile_on_shared_hosts(
    outsider, fleet
):
    from datetime import datetime

    from django.utils import timezone

    b = make_cluster(outsider, "b")
    before = timezone.now()
    body = dry(outsider, b, pool_body("p", 2, 3, shared("1g.10gb")))
    after = timezone.now()
    cap = body["capacity"]
    # 2 nodes x 3 instances = 6 of the 10 free 1g.10gb (before: needed_gpus 6, free_gpus 8,
    # the dedicated host's whole GPUs)
    assert cap["unit"] == "gpu_instance"
    assert cap["gpu_instances"] == [{"profile": "1g.10gb", "needed": 6, "free": 10}]
    assert (cap["needed_gpus"], cap["free_gpus"], cap["held_by_reservations"]) == (None,) * 3
    # placeable from the instant of the request: the dry run's own "now"
    assert cap["placeable_now"] is True
    assert before <= datetime.fromisoformat(cap["placeable_from"]) <= after
    assert cap["message"] == "placeable now: 10 x 1g.10gb GPU instance(s) free on shared hosts"

    short = dry(outsider, b, pool_body("p", 4, 3, shared("1g.10gb")))["capacity"]
    assert short["gpu_instances"] == [{"profile": "1g.10gb", "needed": 12, "free": 10}]
    assert (short["placeable_now"], short["placeable_from"]) == (False, None)
    assert short["message"] == (
        "not placeable: 10 x 1g.10gb GPU instance(s) free on shared hosts; the pool needs "
        "12 x 1g.10gb"
    )
    # 3g.40gb instances that still fit: at 4 on GPU 0 (A's is at 0; compute 3 + 3 <= 7) and
    # at 0 and 4 on GPU 1: 3
    big = dry(outsider, b, pool_body("q", 1, 1, shared("3g.40gb")))["capacity"]
    assert big["gpu_instances"] == [{"profile": "3g.40gb", "needed": 1, "free": 3}]


def test_a_shared_pool_is_not_kept_out_by_reservations_of_dedicated_gpus(owner, outsider, fleet):
    """Reservations hold whole GPUs of dedicated hosts, which a shared pool never takes: with
    all 8 of bm-1 reserved the shared pool is placeable now, and its create is accepted (before:
    409 capacity_reserved, 8 of 8 GPUs reserved)."""
    resp = owner.post(
        "/api/v1/reservations",
        {
            "gpu_model": MODEL,
            "region": "us-east-1",
            "gpus": 8,
            "start": timezone.now().isoformat(),
            "end": (timezone.now() + timedelta(hours=4)).isoformat(),
        },
        format="json",
    )
    assert resp.status_code == 201, resp.content
    b = make_cluster(outsider, "b")
    cap = dry(outsider, b, pool_body("p", 2, 3, shared("1g.10gb")))["capacity"]
    assert (cap["placeable_now"], cap["gpu_instances"][0]["free"]) == (True, 10)
    # a whole-GPU pool of the same tenant reads the dedicated figures, reserved included
    whole = dry(outsider, b, pool_body("w", 1, 1, {"mode": "exclusive"}))["capacity"]
    assert (whole["unit"], whole["free_gpus"], whole["reserved_gpus"]) == ("gpu", 0, 8)
    created = outsider.post(
        f"/api/v1/clusters/{b}/nodepools", pool_body("p", 2, 3, shared("1g.10gb")), format="json"
    )
    assert created.status_code == 202, created.content


def test_the_portal_and_nvkectl_name_instances_for_a_shared_pool(outsider, fleet, capsys):
    from django.template.loader import render_to_string
    from nvkectl.reservations import capacity_line, print_dry_run

    body = dry(outsider, make_cluster(outsider, "b"), pool_body("p", 2, 3, shared("1g.10gb")))
    html = render_to_string("portal/partials/dry_run.html", {"dry_run": body})
    assert 'id="dry-run-instances"' in html
    text = " ".join(html.split())
    assert 'needs 6 x <span class="mono">1g.10gb</span>;' in text
    assert '10 x <span class="mono">1g.10gb</span> free on shared hosts' in text
    assert "<dt>GPUs</dt>" not in html
    # cost: 6 instances x 1/7 of an H100 = 0.857142 GPU-h x 2.50 = 2.14 USD per hour
    assert "2.14 USD (6 GPU instance(s) = 0.857142 GPU-h per hour x 2.5 USD/GPU-h)" in text
    assert "6 GPU x" not in text
    assert capacity_line(body["capacity"]) == (
        f"  needed 6 x 1g.10gb GPU instance(s), free 10 x 1g.10gb on shared hosts, "
        f"placeable from {body['capacity']['placeable_from']}"
    )
    print_dry_run(body)
    printed = capsys.readouterr().out
    assert "GPU(s)" not in printed.split("quota:")[0]
    # the verdict once (a trial read "placeable now: placeable now: 56 x 1g.10gb ...")
    assert printed.splitlines()[0] == "capacity: " + body["capacity"]["message"]
    assert body["capacity"]["message"].startswith("placeable now: ")


def test_a_shared_pool_scale_dry_runs_name_instances(outsider, fleet):
    """B's shared pool of 2 nodes x one 1g.10gb instance: scaling to 1 removes the newest node,
    which holds one 1g.10gb instance (before: "gpus": 1, "1 GPU(s)"); scaling to 4 adds 2
    nodes needing 2 x 1g.10gb of the 10 - 2 = 8 still free."""
    from nvkectl.pools import resize_dry_run_lines

    from nodepools.models import Node

    b = make_cluster(outsider, "b")
    pool_id = make_pool(outsider, b, "mig1g", shared("1g.10gb"), nodes=2)
    drive_pool(pool_id)
    url = f"/api/v1/clusters/{b}/nodepools/{pool_id}/set-size?dry_run=true"
    newest = Node.objects.filter(nodepool_id=pool_id).order_by("-created_at", "-name").first()

    down = outsider.post(url, {"node_count": 1}, format="json")
    assert down.status_code == 200, down.content
    nodes = down.json()["disruption"]["nodes"]
    assert [(n["name"], n["gpus"], n["gpu_instances"]) for n in nodes] == [
        (newest.name, None, {"1g.10gb": 1})
    ]
    assert resize_dry_run_lines(down.json()) == [
        "node count: 2 -> 1",
        f"  would drain and remove {newest.name} (1 x 1g.10gb GPU instance(s), newest)",
    ]

    up = outsider.post(url, {"node_count": 4}, format="json")
    assert up.status_code == 200, up.content
    cap = up.json()["capacity"]
    assert cap["unit"] == "gpu_instance"
    assert cap["gpu_instances"] == [{"profile": "1g.10gb", "needed": 2, "free": 8}]
    assert cap["placeable_now"] is True
