"""Shared-host placement (fleet/shared_hosts.py): best fit that opens the fewest GPUs and
hosts, the operator's tenancy switch, concurrent claims that never overlap, and the exclusion
constraint as the last line of defence. Hosts are SIMULATED rows (``make_host``).

H100-SXM5-80GB (catalog ``-lgipp``): 1g.10gb {0..6}:1, 2g.20gb {0,2,4}:2, 3g.40gb {0,4}:4,
7g.80gb {0}:8; 7 compute slices.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import IntegrityError, transaction

from fleet import shared_hosts
from fleet.shared_hosts import GpuInstanceRequest
from tests.helpers import run_at_once

MODEL = "h100-sxm5-80gb"


def req(tenant, n: int, *profiles: str) -> GpuInstanceRequest:
    return GpuInstanceRequest(uuid.UUID(int=n + 1), tenant.id, MODEL, "us-east-1", tuple(profiles))


def make_shared(make_host, hostname: str, gpus: int = 2):
    from fleet.models import Host

    host = make_host(MODEL, gpus=gpus, hostname=hostname)
    Host.objects.filter(pk=host.pk).update(tenancy="shared")
    host.refresh_from_db()
    return host


def where(placement) -> list[tuple[str, int, str, int]]:
    return [(placement.hostname, i.gpu_index, i.profile, i.start) for i in placement.instances]


@pytest.mark.django_db
def test_instances_fill_the_opened_gpu_and_host_before_opening_new_ones(
    make_host, tenant_a, tenant_b
):
    make_shared(make_host, "hv-a")
    make_shared(make_host, "hv-b")
    with transaction.atomic():
        first, second, third, fourth = shared_hosts.claim_gpu_instances(
            [
                req(tenant_a, 0, "3g.40gb"),  # empty fleet: hostname order, GPU 0, start 0
                req(tenant_b, 1, "2g.20gb"),  # beside it on GPU 0 (opened): start 4
                req(tenant_b, 2, "1g.10gb", "1g.10gb"),
                req(tenant_a, 3, "7g.80gb"),  # a whole-GPU profile: GPU 1 of the same host
            ]
        )
    assert where(first) == [("hv-a", 0, "3g.40gb", 0)]
    assert where(second) == [("hv-a", 0, "2g.20gb", 4)]
    # the first 1g.10gb takes GPU 0's last valid start (6: compute 3+2+1 = 6 of 7); the second
    # has no valid start left there (slice 7 is no 1g.10gb start) and opens GPU 1 at 0
    assert where(third) == [("hv-a", 0, "1g.10gb", 6), ("hv-a", 1, "1g.10gb", 0)]
    # hv-a is full now (GPU 1 holds a 1g.10gb at 0, so 7g.80gb does not fit): hv-b opens
    assert where(fourth) == [("hv-b", 0, "7g.80gb", 0)]


@pytest.mark.django_db
def test_a_node_never_spans_hosts_and_a_full_fleet_refuses(make_host, tenant_a):
    make_shared(make_host, "hv-a", gpus=1)
    make_shared(make_host, "hv-b", gpus=1)
    with transaction.atomic():
        (placed,) = shared_hosts.claim_gpu_instances([req(tenant_a, 0, *["1g.10gb"] * 7)])
    assert {p.gpu_index for p in placed.instances} == {0}
    assert [p.start for p in placed.instances] == [0, 1, 2, 3, 4, 5, 6]
    with pytest.raises(shared_hosts.SharedCapacityShort), transaction.atomic():
        # 4 + 4 compute slices do not fit one H100 (7), and a node stays on one host
        shared_hosts.claim_gpu_instances([req(tenant_a, 1, "4g.40gb", "4g.40gb")])


@pytest.mark.django_db
def test_claims_are_idempotent_per_node(make_host, tenant_a):
    from fleet.models import GpuInstance

    make_shared(make_host, "hv-a")
    with transaction.atomic():
        (one,) = shared_hosts.claim_gpu_instances([req(tenant_a, 0, "1g.10gb")])
        (again,) = shared_hosts.claim_gpu_instances([req(tenant_a, 0, "1g.10gb")])
    assert one == again
    assert GpuInstance.objects.count() == 1


# --- the operator's switch --------------------------------------------------------------------


@pytest.mark.django_db
def test_a_host_holding_dedicated_nodes_cannot_be_made_shared(make_host, tenant_a, operator):
    from fleet import placement
    from fleet.models import HostEvent

    host = make_host(MODEL, gpus=2, hostname="bm-1")
    with transaction.atomic():
        placement.claim_gpus(
            [placement.GpuRequest(uuid.uuid4(), tenant_a.id, MODEL, 1, "us-east-1")]
        )
    url = f"/api/v1/fleet/hosts/{host.id}/tenancy"
    resp = operator.post(url, {"tenancy": "shared"}, format="json")
    body = resp.json()
    assert (resp.status_code, resp["Content-Type"]) == (409, "application/problem+json")
    assert (body["code"], body["held_gpus"]) == ("host_has_dedicated_nodes", 1)
    resp = operator.post(url, {"tenancy": "hypervisor"}, format="json")
    assert resp.status_code == 400
    assert "tenancy" in str(resp.json())
    host.refresh_from_db()
    assert host.tenancy == "dedicated"
    assert not HostEvent.objects.filter(host=host, message__startswith="tenancy").exists()


@pytest.mark.django_db
def test_a_host_without_mig_cannot_be_made_shared(make_host, operator):
    """Found by a re-probe: a T4 host (no MIG in the catalog) became shared, with a slice map
    of 8 free memory slices on GPUs that have none."""
    host = make_host("t4", gpus=1, hostname="t4-1")
    resp = operator.post(f"/api/v1/fleet/hosts/{host.id}/tenancy", {"tenancy": "shared"})
    body = resp.json()
    assert (resp.status_code, body["code"], body["field"]) == (
        400,
        "gpu_not_mig_capable",
        "tenancy",
    )
    host.refresh_from_db()
    assert host.tenancy == "dedicated"


@pytest.mark.django_db
def test_an_empty_host_is_made_shared_and_back_and_the_slice_map_names_tenants(
    make_host, tenant_a, tenant_b, operator
):
    from fleet.models import HostEvent

    host = make_host(MODEL, gpus=1, hostname="hv-1")
    url = f"/api/v1/fleet/hosts/{host.id}/tenancy"
    resp = operator.post(url, {"tenancy": "shared"}, format="json")
    assert (resp.status_code, resp.json()["tenancy"]) == (200, "shared")
    assert operator.post(url, {"tenancy": "shared"}, format="json").status_code == 200  # again
    assert HostEvent.objects.filter(host=host, message="tenancy dedicated -> shared").count() == 1
    with transaction.atomic():
        shared_hosts.claim_gpu_instances([req(tenant_a, 0, "3g.40gb"), req(tenant_b, 1, "1g.10gb")])
    (gpu,) = operator.get(f"/api/v1/fleet/hosts/{host.id}/slices").json()
    assert [
        (i["tenant"], i["profile"], i["start"], i["size"], i["state"]) for i in gpu["instances"]
    ] == [
        ("tenant-a", "3g.40gb", 0, 4, "ACTIVE"),
        ("tenant-b", "1g.10gb", 4, 1, "ACTIVE"),
    ]
    assert gpu["free"] == [5, 6, 7]  # memory slices 0-3 and 4 are taken of 8
    resp = operator.post(url, {"tenancy": "dedicated"}, format="json")
    assert (resp.status_code, resp.json()["code"]) == (409, "host_has_gpu_instances")


@pytest.mark.django_db
def test_whole_gpu_placement_ignores_shared_hosts(make_host, tenant_a):
    from fleet import placement

    make_shared(make_host, "hv-1", gpus=8)
    with pytest.raises(placement.InsufficientCapacity), transaction.atomic():
        placement.claim_gpus(
            [placement.GpuRequest(uuid.uuid4(), tenant_a.id, MODEL, 1, "us-east-1")]
        )


# --- concurrency ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_on_one_gpu_never_take_overlapping_slices(make_host, tenant_a, tenant_b):
    """Eight claimants, each its own PostgreSQL transaction (thread), start together and hold
    their transaction open a moment after claiming, as a provider call does: the host lock
    makes them take turns, each sees the instances committed before it, so the 1 GPU ends with
    seven 1g.10gb at starts 0..6 and the eighth claimant is refused (no valid start left)."""
    from fleet.models import GpuInstance

    make_shared(make_host, "hv-race", gpus=1)

    def claim(n: int, wait) -> object:
        wait()
        with transaction.atomic():
            tenant = tenant_a if n % 2 else tenant_b
            (placed,) = shared_hosts.claim_gpu_instances([req(tenant, n, "1g.10gb")])
            threading.Event().wait(0.05)
        return placed

    outcomes = run_at_once(8, claim, barrier_timeout_s=10, join_s=60)
    placed = [o for o in outcomes if not isinstance(o, Exception)]
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert (len(placed), len(refused)) == (7, 1)
    assert isinstance(refused[0], shared_hosts.SharedCapacityShort), refused
    assert sorted(p.instances[0].start for p in placed) == [0, 1, 2, 3, 4, 5, 6]
    assert sorted(GpuInstance.objects.values_list("start", flat=True)) == [0, 1, 2, 3, 4, 5, 6]


@pytest.mark.django_db
def test_the_database_refuses_overlapping_live_instances_of_one_gpu(make_host, tenant_a, tenant_b):
    from django.utils import timezone

    from fleet.models import GpuInstance

    host = make_shared(make_host, "hv-1", gpus=1)
    gpu = host.gpus.get()
    common = {"host": host, "gpu": gpu, "created_at": timezone.now()}
    GpuInstance.objects.create(
        profile="3g.40gb", start=0, size=4, compute_slices=3, holder_id=uuid.uuid4(),
        tenant=tenant_a, **common,
    )  # fmt: skip
    with pytest.raises(IntegrityError, match="gpuinstance_no_overlap"), transaction.atomic():
        GpuInstance.objects.create(  # slices 2-3 overlap 0-3, bypassing placement
            profile="2g.20gb", start=2, size=2, compute_slices=2, holder_id=uuid.uuid4(),
            tenant=tenant_b, **common,
        )  # fmt: skip
    # a FREE (scrubbed, history) row does not hold its slices
    GpuInstance.objects.create(
        profile="1g.10gb", start=4, size=1, compute_slices=1, state="FREE", **common
    )
    GpuInstance.objects.create(
        profile="1g.10gb", start=4, size=1, compute_slices=1, holder_id=uuid.uuid4(),
        tenant=tenant_b, **common,
    )  # fmt: skip


# --- the agent's scrub evidence on the wire ----------------------------------------------------


@pytest.mark.parametrize(
    ("scrubs", "field", "code"),
    [
        ("done", "inventory.gpus[0].slice_scrubs", "invalid_type"),
        (
            [{"start": 99, "size": 1}],
            "inventory.gpus[0].slice_scrubs[0].start",
            "number_out_of_range",
        ),
        ([{"start": 0, "size": "1"}], "inventory.gpus[0].slice_scrubs[0].size", "invalid_type"),
        ([{"scrub_id": "x" * 300}], "inventory.gpus[0].slice_scrubs[0].scrub_id", "value_too_long"),
        ([{}] * 57, "inventory.gpus[0].slice_scrubs", "invalid_type"),
    ],
)
def test_malformed_slice_scrubs_in_a_report_are_refused_naming_the_field(scrubs, field, code):
    from fleet.formats import FormatError, check_inventory

    gpu = "GPU-11111111-2222-3333-4444-555555555555"
    inventory = {"gpus": [{"uuid": gpu, "index": 0, "slice_scrubs": scrubs}]}
    with pytest.raises(FormatError) as err:
        check_inventory(inventory, {gpu})
    assert (err.value.field, err.value.code) == (field, code)


def test_the_simulated_source_reports_the_hosts_slice_scrubs(tmp_path):
    import json

    from nvke_agent.sources.simulated import SimulatedSource

    record = {"scrub_id": "s-1", "start": 4, "size": 1, "status": "ok", "cleared_bytes": 1024}
    state = {
        "nvml_error": "",
        "driver_version": "580.0.0",
        "cuda_version": "13.0",
        "gpus": [
            {
                "uuid": "GPU-sim-1",
                "index": 0,
                "mig_mode": "enabled",
                "instances": [],
                "slice_scrubs": [record],
            }
        ],
        "events": [],
    }
    path = tmp_path / "host.json"
    path.write_text(json.dumps(state))
    (gpu,) = SimulatedSource(path).inventory()["gpus"]
    assert (gpu["mig_devices"], gpu["slice_scrubs"]) == ([], [record])
