"""Multi-node NVLink domains in the fleet (fleet/nvlink_domains.py): a host's domain from its
GPUs' fabric info, the free room per domain, and claims kept inside one domain.

The hosts are SIMULATED GB200 NVL72 compute trays (4 GPUs each, 18 per 72-GPU domain, catalog
``gb200-nvl72``); nothing here is real hardware.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import transaction

from fleet import nvlink_domains, placement
from fleet.formats import FormatError
from fleet.models import Gpu, Host
from fleet.nvlink_domains import Domain, NvlinkDomainFull

pytestmark = pytest.mark.django_db

CLUSTER = uuid.UUID("5b6f3c2a-9d41-4e8b-a7c2-0f1e2d3c4b5a")
D1, D2, D3 = (Domain(CLUSTER, 32766), Domain(CLUSTER, 32767), Domain(CLUSTER, 32768))


def tray_rack(make_host, domain: Domain, prefix: str, trays: int = 18) -> list[Host]:
    """A SIMULATED GB200 NVL72 rack: ``trays`` hosts of 4 GB200 GPUs in one domain."""
    hosts = []
    for i in range(trays):
        host = make_host("gb200", gpus=4, zone="us-east-1a", hostname=f"{prefix}-tray{i:02d}")
        Host.objects.filter(pk=host.pk).update(
            nvlink_cluster_uuid=domain.cluster_uuid, nvlink_clique_id=domain.clique_id
        )
        hosts.append(host)
    return hosts


def occupy(hosts: list[Host], tenant) -> None:
    """Another tenant's node holds all 4 GPUs of each host."""
    for host in hosts:
        Gpu.objects.filter(host=host).update(holder_id=uuid.uuid4(), holder_tenant=tenant)


def requests(tenant, nodes: int, *, first: int = 0) -> list[placement.GpuRequest]:
    return [
        placement.GpuRequest(uuid.UUID(int=first + i + 1), tenant.id, "gb200", 4, "us-east-1")
        for i in range(nodes)
    ]


def domain_of(holder: uuid.UUID) -> Domain:
    host = Host.objects.get(gpus__holder_id=holder, gpus__index=0)
    return nvlink_domains.host_domain(host)


@pytest.fixture
def racks(make_host, tenant_b):
    """Three SIMULATED NVL72 racks (54 trays): D1 with 6 trays free (12 held by tenant B),
    D2 with 9 free (9 held), D3 wholly free (18)."""
    d1 = tray_rack(make_host, D1, "r1")
    d2 = tray_rack(make_host, D2, "r2")
    tray_rack(make_host, D3, "r3")
    occupy(d1[:12], tenant_b)
    occupy(d2[:9], tenant_b)


def test_rooms_count_nodes_of_the_shape_per_domain(racks, tenant_a):
    rooms = nvlink_domains.domain_rooms(
        gpu_model="gb200", region="us-east-1", tenant_id=tenant_a.id, gpus_per_node=4
    )
    # 4-GPU nodes: one per free tray. 2-GPU nodes: two per free tray.
    assert [(r.domain, r.hosts, r.free_gpus, r.nodes) for r in rooms] == [
        (D3, 18, 72, 18),
        (D2, 9, 36, 9),
        (D1, 6, 24, 6),
    ]
    halves = nvlink_domains.domain_rooms(
        gpu_model="gb200", region="us-east-1", tenant_id=tenant_a.id, gpus_per_node=2
    )
    assert [r.nodes for r in halves] == [36, 18, 12]


def test_an_8_node_pool_lands_in_the_tightest_domain_and_the_fourth_is_refused(racks, tenant_a):
    pools = [uuid.uuid4() for _ in range(4)]
    # worked by hand (nodes of 4 GPUs that fit: D1 6, D2 9, D3 18):
    # pool 1 (8): D2 leaves 1, D3 leaves 10 -> D2;  now D1 6, D2 1, D3 18
    # pool 2 (8): only D3 fits -> D3 (10 left);     pool 3 (8): D3 again (2 left)
    # pool 4 (8): D1 6, D2 1, D3 2 -> refused, the largest free domain is D1 with 6
    for n, (pool, expected) in enumerate(zip(pools[:3], (D2, D3, D3), strict=True)):
        with transaction.atomic():
            placed = nvlink_domains.claim_in_one_domain(
                requests(tenant_a, 8, first=100 * n), group_id=pool
            )
        assert len({p.host_id for p in placed}) == 8  # one tray per node
        assert {domain_of(p.holder_id) for p in placed} == {expected}
        assert set(Gpu.objects.filter(holder_group_id=pool).values_list("holder_id", flat=True))
    with pytest.raises(NvlinkDomainFull) as refused, transaction.atomic():
        nvlink_domains.claim_in_one_domain(requests(tenant_a, 8, first=300), group_id=pools[3])
    largest = refused.value.largest
    assert (largest.domain, largest.nodes, largest.hosts, largest.free_gpus) == (D1, 6, 6, 24)
    assert f"largest free domain is {D1.label} with room for 6 node(s)" in str(refused.value)
    assert not Gpu.objects.filter(holder_group_id=pools[3]).exists()


def test_a_pool_with_nodes_stays_in_its_domain_even_when_another_has_more_room(racks, tenant_a):
    pool = uuid.uuid4()
    with transaction.atomic():
        nvlink_domains.claim_in_one_domain(requests(tenant_a, 8), group_id=pool)  # D2, 1 left
    with transaction.atomic():  # the 9th node: D2's last tray, though D3 has 18 free
        [ninth] = nvlink_domains.claim_in_one_domain(requests(tenant_a, 1, first=8), group_id=pool)
    assert domain_of(ninth.holder_id) == D2
    with pytest.raises(NvlinkDomainFull) as full, transaction.atomic():
        nvlink_domains.claim_in_one_domain(requests(tenant_a, 1, first=9), group_id=pool)
    assert full.value.pinned.domain == D2 and full.value.pinned.nodes == 0
    assert full.value.largest.domain == D3
    # claiming again for holders that already hold GPUs returns them (idempotent)
    with transaction.atomic():
        again = nvlink_domains.claim_in_one_domain(requests(tenant_a, 9), group_id=pool)
    assert {domain_of(p.holder_id) for p in again} == {D2}


def test_without_any_domain_the_refusal_says_so(make_host, tenant_a):
    make_host("gb200", gpus=4, hostname="no-domain-tray")
    with pytest.raises(NvlinkDomainFull) as refused, transaction.atomic():
        nvlink_domains.claim_in_one_domain(requests(tenant_a, 2), group_id=uuid.uuid4())
    assert refused.value.largest is None
    assert "no NVLink domain of gb200 hosts" in str(refused.value)


# --- the host's domain from the GPUs' fabric info ----------------------------------------------

UUID_A = "5b6f3c2a-9d41-4e8b-a7c2-0f1e2d3c4b5a"
UUID_B = "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f"


def fabric(state="completed", status=0, cluster=UUID_A, clique=32766):
    return {"state": state, "status": status, "cluster_uuid": cluster, "clique_id": clique}


def test_gpus_that_agree_give_the_host_its_domain():
    gpus = [{"uuid": f"GPU-{i}", "fabric": fabric()} for i in range(4)]
    reported = nvlink_domains.domain_from_gpus(gpus)
    assert (reported.known, reported.domain, reported.problem) == (
        True,
        Domain(uuid.UUID(UUID_A), 32766),
        "",
    )
    assert reported.domain.label == f"{UUID_A}.32766"


def test_gpus_that_disagree_leave_the_host_without_a_domain_and_say_which():
    gpus = [
        {"uuid": "GPU-0", "fabric": fabric()},
        {"uuid": "GPU-1", "fabric": fabric(cluster=UUID_B)},
    ]
    reported = nvlink_domains.domain_from_gpus(gpus)
    assert reported.domain is None
    assert reported.problem == (
        f"GPUs disagree on the domain: GPU-1 in {UUID_B}.32766, GPU-0 in {UUID_A}.32766"
    )


def test_an_unfinished_or_failed_registration_gives_no_domain():
    gpus = [
        {"uuid": "GPU-0", "fabric": fabric()},
        {
            "uuid": "GPU-1",
            "fabric": fabric(state="in_progress", status=None, cluster=None, clique=None),
        },
        {"uuid": "GPU-2", "fabric": fabric(status=3)},  # completed with NVML_ERROR_NOT_SUPPORTED
    ]
    reported = nvlink_domains.domain_from_gpus(gpus)
    assert reported.domain is None
    assert reported.problem == "fabric registration not complete or failed on GPU(s) GPU-1, GPU-2"


def test_gpus_without_fabric_support_leave_the_stored_domain_alone():
    not_supported = {
        "state": "not_supported",
        "status": None,
        "cluster_uuid": None,
        "clique_id": None,
    }
    assert not nvlink_domains.domain_from_gpus([{"uuid": "GPU-0", "fabric": not_supported}]).known
    assert not nvlink_domains.domain_from_gpus([{"uuid": "GPU-0"}]).known


@pytest.mark.parametrize(
    ("value", "field", "code"),
    [
        ("nonsense", "f", "invalid_type"),
        ({"state": "done"}, "f.state", "invalid_value"),
        ({"state": "completed", "status": -1}, "f.status", "invalid_value"),
        (
            {"state": "completed", "status": 0, "cluster_uuid": "GPU-1", "clique_id": 1},
            "f.cluster_uuid",
            "invalid_cluster_uuid",
        ),
        (
            {
                "state": "completed",
                "status": 0,
                "cluster_uuid": "0" * 8 + "-0000-0000-0000-" + "0" * 12,
                "clique_id": 1,
            },
            "f.cluster_uuid",
            "invalid_cluster_uuid",
        ),
        (
            {"state": "completed", "status": 0, "cluster_uuid": UUID_A, "clique_id": 2**32},
            "f.clique_id",
            "invalid_clique_id",
        ),
        (
            {"state": "completed", "status": 0, "cluster_uuid": UUID_A, "clique_id": "7"},
            "f.clique_id",
            "invalid_clique_id",
        ),
        ({"state": "completed", "status": 0, "cluster_uuid": UUID_A}, "f.clique_id", "required"),
        ({"state": "completed", "extra": 1}, "f.extra", "unknown_field"),
    ],
)
def test_malformed_fabric_info_is_refused_naming_the_field(value, field, code):
    with pytest.raises(FormatError) as err:
        nvlink_domains.check_fabric(value, "f")
    assert (err.value.field, err.value.code) == (field, code)
