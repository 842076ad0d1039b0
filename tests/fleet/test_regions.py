"""Which zones are in which region: ``fleet.models.zone_in_region`` / ``host_in_region`` and
``Host.in_region_q``, the one rule placement, reservations and the portal share. A zone with a
cloud name is in its region only: GCP has both ``europe-west1`` (Belgium) and
``europe-west10`` (Berlin), and ``europe-west10-a`` was placed in ``europe-west1``; ``us`` and
``u`` took every ``us-east-1a`` host (found by the hostile trials). A name of the operator's
own is in the region it starts with followed by ``-``; a region given at import is a host's
only one."""

from __future__ import annotations

import uuid

import pytest
from django.db import transaction

from fleet import placement
from fleet.models import Host, host_in_region, zone_in_region
from fleet.placement import GpuRequest, InsufficientCapacity

CASES = [
    ("us-east-1a", "us-east-1", True),  # AWS: region + letter
    ("us-east-10a", "us-east-1", False),
    ("us-east-10a", "us-east-10", True),
    ("us-central1-a", "us-central1", True),  # GCP: region + "-" + letter
    ("europe-west1-b", "europe-west1", True),
    ("europe-west10-a", "europe-west1", False),
    ("europe-west10-a", "europe-west10", True),
    ("us-east-1a", "us", False),  # a prefix of a cloud zone is no region of it
    ("us-east-1a", "u", False),
    ("us-east-1a", "us-east", False),
    ("europe-west1-b", "europe", False),
    ("dc1-rack2", "dc1", True),  # a name of the operator's own, starting with the region
    ("dc1-rack2", "dc", False),
    ("dc1-rack2", "d", False),
    ("dc1", "dc1", True),
    ("dc10", "dc1", False),
    ("dc1", "", False),
]


@pytest.mark.parametrize(("zone", "region", "inside"), CASES)
def test_zone_in_region(zone, region, inside):
    assert zone_in_region(zone, region) is inside


@pytest.mark.django_db
def test_the_database_filter_agrees_with_the_rule(make_host):
    zones = sorted({zone for zone, _, _ in CASES})
    for i, zone in enumerate(zones):
        make_host("h100-sxm5-80gb", gpus=1, zone=zone, hostname=f"h{i}")
    # regions given at import: the host's only region, whatever its zone's name says
    Host.objects.create(
        hostname="az1", zone="1", region="eastus", gpu_model_id="h100-sxm5-80gb", gpu_count=1
    )
    Host.objects.create(
        hostname="r9", zone="dc1-rack9", region="dc9", gpu_model_id="a10g", gpu_count=1
    )
    hosts = list(Host.objects.values_list("hostname", "region", "zone"))
    for region in sorted({r for _, r, _ in CASES if r} | {"eastus", "dc9", "1", "us-east-10"}):
        got = set(Host.objects.filter(Host.in_region_q(region)).values_list("hostname", flat=True))
        assert got == {h for h, r, z in hosts if host_in_region(r, z, region)}, region
    by_region = {
        region: sorted(Host.objects.filter(Host.in_region_q(region)).values_list("zone", flat=True))
        for region in ("europe-west1", "us", "dc1", "dc9", "eastus")
    }
    assert by_region == {
        "europe-west1": ["europe-west1-b"],
        "us": [],
        "dc1": ["dc1", "dc1-rack2"],  # not dc1-rack9: it was given region dc9
        "dc9": ["dc1-rack9"],
        "eastus": ["1"],
    }


@pytest.mark.django_db
def test_placement_in_europe_west1_never_lands_in_europe_west10(make_host, tenant_a):
    make_host("h100-sxm5-80gb", gpus=8, zone="europe-west10-a", hostname="berlin")

    def claim(n: int):
        req = GpuRequest(uuid.UUID(int=n), tenant_a.id, "h100-sxm5-80gb", 8, region="europe-west1")
        with transaction.atomic():
            return placement.claim_gpus([req])

    with pytest.raises(InsufficientCapacity):
        claim(1)
    make_host("h100-sxm5-80gb", gpus=8, zone="europe-west1-b", hostname="st-ghislain")
    [got] = claim(2)
    assert got.hostname == "st-ghislain"


@pytest.mark.django_db
def test_reservations_count_a_host_in_its_region_only(make_host):
    """The second trial reserved 16 GPUs in us-east-1 and 16 more in "us" on the same 16."""
    from django.utils import timezone

    from reservations.capacity import fleet_counts

    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1a", hostname="a")
    make_host("h100-sxm5-80gb", gpus=8, zone="us-east-1b", hostname="b")
    Host.objects.create(
        hostname="az", zone="1", region="eastus", gpu_model_id="h100-sxm5-80gb", gpu_count=0
    )
    now = timezone.now()
    assert fleet_counts("h100-sxm5-80gb", "us-east-1", now) == {
        "us-east-1a": (8, 0),
        "us-east-1b": (8, 0),
    }
    for prefix in ("us", "u", "us-east"):
        assert fleet_counts("h100-sxm5-80gb", prefix, now) == {}, prefix
