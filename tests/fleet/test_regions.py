"""Which zones are in which region: ``fleet.models.zone_in_region`` and ``Host.in_region_q``,
the one rule placement, reservations and the portal share. A zone starting with the region's
name is in it only when the name does not go on with a digit: GCP has both ``europe-west1``
(Belgium) and ``europe-west10`` (Berlin), and ``europe-west10-a`` was placed in
``europe-west1``."""

from __future__ import annotations

import uuid

import pytest
from django.db import transaction

from fleet import placement
from fleet.models import Host, zone_in_region
from fleet.placement import GpuRequest, InsufficientCapacity

CASES = [
    ("us-east-1a", "us-east-1", True),  # AWS: region + letter
    ("us-east-10a", "us-east-1", False),
    ("us-east-10a", "us-east-10", True),
    ("us-central1-a", "us-central1", True),  # GCP: region + "-" + letter
    ("europe-west1-b", "europe-west1", True),
    ("europe-west10-a", "europe-west1", False),
    ("europe-west10-a", "europe-west10", True),
    ("dc1-rack2", "dc1", True),  # a name of the operator's own, starting with the region
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
    for region in sorted({region for _, region, _ in CASES if region}):
        got = set(Host.objects.filter(Host.in_region_q(region)).values_list("zone", flat=True))
        assert got == {z for z in zones if zone_in_region(z, region)}, region
    west1 = Host.objects.filter(Host.in_region_q("europe-west1")).values_list("zone", flat=True)
    assert sorted(west1) == ["europe-west1-b"]


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
