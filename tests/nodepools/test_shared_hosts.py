"""Shared hosts end to end in the reconciler (#18): tenants' ``tenancy: shared`` MIG pools get
GPU instances of one shared H100 at valid placements, packed onto the fewest GPUs; whole-GPU
pools never land there; a released instance's slices are reused only after the host's agent
reports it destroyed and cleared; the ledger bills each instance by its fraction.

Hosts are SIMULATED INFRASTRUCTURE (``make_host``; clusters/providers/simhosts.py): with no
agent process registered, each host's agent report runs in-process (the agent's own
``simulated`` source over the host's state file, stored by ``fleet.ingest.ingest_report``).

H100-SXM5-80GB placement table (catalog, ``-lgipp``; worked by hand below): 3g.40gb {0,4}:4,
1g.10gb {0,1,2,3,4,5,6}:1, 7 compute slices. Tenant A's 3g.40gb takes slices 0-3 of GPU 0;
tenant B's three 1g.10gb go beside it at 4, 5, 6 (GPU 0 is opened, so it is filled first:
compute 3 + 3 = 6 of 7, and no 1g.10gb placement is left: start 7 is not valid).
"""

from __future__ import annotations

import pytest

from tests.helpers import drive_cluster, drive_pool

pytestmark = pytest.mark.django_db

MODEL = "h100-sxm5-80gb"


def shared(profile: str) -> dict:
    return {"mode": "mig", "mig_profile": profile, "tenancy": "shared"}


def make_cluster(client, name: str) -> str:
    cluster = client.post(
        "/api/v1/clusters", {"name": name, "kubernetes_version": "1.36", "region": "us-east-1"}
    ).json()["target_id"]
    drive_cluster(cluster)
    return cluster


def make_pool(client, cluster: str, name: str, isolation: dict, gpus: int = 1) -> str:
    response = client.post(
        f"/api/v1/clusters/{cluster}/nodepools",
        {
            "name": name,
            "gpu_model": MODEL,
            "gpus_per_node": gpus,
            "node_count": 1,
            "isolation": isolation,
        },
        format="json",
    )
    assert response.status_code == 202, response.json()
    return response.json()["target_id"]


def instances_of_pool(pool_id) -> list[tuple[int, str, int, int, str]]:
    """(GPU index, profile, start, size, state) of the pool's node's instances."""
    from fleet.models import GpuInstance
    from nodepools.models import Node

    node_ids = list(Node.objects.filter(nodepool_id=pool_id).values_list("id", flat=True))
    return sorted(
        (r.gpu.index, r.profile, r.start, r.size, r.state)
        for r in GpuInstance.objects.filter(holder_id__in=node_ids).select_related("gpu")
    )


@pytest.fixture
def tenant_c_client(db):
    from tenants.models import Tenant
    from tests.conftest import _client, _key

    return _client(_key(Tenant.objects.create(name="tenant-c"), "owner"))


@pytest.fixture
def shared_host(make_host, operator):
    host = make_host(MODEL, gpus=2, hostname="hv-shared-1")
    response = operator.post(
        f"/api/v1/fleet/hosts/{host.id}/tenancy", {"tenancy": "shared"}, format="json"
    )
    assert (response.status_code, response.json()["tenancy"]) == (200, "shared")
    return host


@pytest.fixture
def two_tenants(owner, outsider, shared_host):
    """Tenant A: one 3g.40gb; tenant B: three 1g.10gb; both READY on the shared host."""
    a = make_pool(owner, make_cluster(owner, "a"), "mig3g", shared("3g.40gb"))
    drive_pool(a)
    b = make_pool(outsider, make_cluster(outsider, "b"), "mig1g", shared("1g.10gb"), gpus=3)
    drive_pool(b)
    return a, b


def test_two_tenants_get_their_own_instances_at_valid_placements_of_one_gpu(
    two_tenants, shared_host
):
    from catalog.models import MigProfile
    from fleet.models import GpuInstance
    from nodepools.models import Node, NodePool

    a, b = two_tenants
    for pool_id in (a, b):
        assert NodePool.objects.get(pk=pool_id).phase == "RUNNING"
    assert instances_of_pool(a) == [(0, "3g.40gb", 0, 4, "ACTIVE")]
    assert instances_of_pool(b) == [
        (0, "1g.10gb", 4, 1, "ACTIVE"),
        (0, "1g.10gb", 5, 1, "ACTIVE"),
        (0, "1g.10gb", 6, 1, "ACTIVE"),
    ]
    # every instance at a start the catalog's placement table allows, with its size
    table = {
        p.name: (set(p.placement_starts), p.placement_size)
        for p in MigProfile.objects.filter(gpu_model_id=MODEL)
    }
    for row in GpuInstance.objects.filter(host=shared_host):
        starts, size = table[row.profile]
        assert row.start in starts and row.size == size, row
    # the agent reports exactly these four instances on GPU 0 and nothing on GPU 1
    gpu0, gpu1 = shared_host.gpus.order_by("index")
    gpu0.refresh_from_db()
    gpu1.refresh_from_db()
    reported = sorted((d["profile"], d["placement_start"]) for d in gpu0.mig_devices)
    assert reported == [("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6), ("3g.40gb", 0)]
    assert gpu1.mig_devices == []
    # each node sees only its own instances (never the other tenant's)
    node_a = Node.objects.get(nodepool_id=a)
    assert node_a.gpu_uuids == [gpu0.uuid]
    assert node_a.gpu_layout[0]["mig_devices"] == [{"profile": "3g.40gb", "start": 0, "size": 4}]
    node_b = Node.objects.get(nodepool_id=b)
    assert [d["start"] for d in node_b.gpu_layout[0]["mig_devices"]] == [4, 5, 6]


def test_a_time_slicing_pool_never_lands_on_a_shared_host(
    two_tenants, tenant_c_client, shared_host, make_host
):
    from nodepools.models import Node, NodePool

    # GPU 1 of the shared host is wholly free, yet a whole-GPU pool is not placed there
    cluster = make_cluster(tenant_c_client, "c")
    ts = make_pool(tenant_c_client, cluster, "ts", {"mode": "time-slicing", "replicas": 4})
    drive_pool(ts)
    pool = NodePool.objects.get(pk=ts)
    assert pool.phase == "ERROR"
    assert not Node.objects.filter(nodepool_id=ts, host=shared_host).exists()
    assert "no free host with 1 x h100-sxm5-80gb" in str(pool.conditions)
    # with a dedicated host in the fleet it lands there
    dedicated = make_host(MODEL, gpus=2, hostname="bm-dedicated-1")
    ts2 = make_pool(tenant_c_client, cluster, "ts2", {"mode": "time-slicing", "replicas": 4})
    drive_pool(ts2)
    assert Node.objects.get(nodepool_id=ts2).host_id == dedicated.id


def test_a_shared_pool_never_lands_on_a_dedicated_host(tenant_c_client, make_host):
    from nodepools.models import Node, NodePool

    make_host(MODEL, gpus=2, hostname="bm-dedicated-2")
    cluster = make_cluster(tenant_c_client, "c")
    pool_id = make_pool(tenant_c_client, cluster, "mig", shared("1g.10gb"))
    drive_pool(pool_id)
    assert NodePool.objects.get(pk=pool_id).phase == "ERROR"
    assert not Node.objects.filter(nodepool_id=pool_id, host__isnull=False).exists()


def test_a_released_instance_is_reused_by_another_tenant_only_after_the_agent_confirms_its_scrub(
    owner, outsider, shared_host, tenant_c_client, settings
):
    from clusters.providers import simhosts
    from fleet.models import GpuInstance, HostEvent

    a = make_pool(owner, make_cluster(owner, "a"), "mig3g", shared("3g.40gb"))
    drive_pool(a)
    b_cluster = make_cluster(outsider, "b")
    b = make_pool(outsider, b_cluster, "mig1g", shared("1g.10gb"), gpus=3)
    drive_pool(b)
    # tenant C's 1g.10gb cannot go on GPU 0 (no valid start left): it opens GPU 1 at 0
    c_cluster = make_cluster(tenant_c_client, "c")
    c = make_pool(tenant_c_client, c_cluster, "m1", shared("1g.10gb"))
    drive_pool(c)
    assert instances_of_pool(c) == [(1, "1g.10gb", 0, 1, "ACTIVE")]

    # B deletes its pool while the host's agent does not report: the simulated host destroys
    # the instances and clears their memory, but no report has said so yet
    settings.NVKE_SIMULATED_IN_PROCESS_AGENT = False
    assert outsider.delete(f"/api/v1/clusters/{b_cluster}/nodepools/{b}").status_code == 202
    drive_pool(b)
    released = GpuInstance.objects.filter(previous_tenant__name="tenant-b").order_by("start")
    assert [(r.start, r.state) for r in released] == [
        (4, "SCRUBBING"),
        (5, "SCRUBBING"),
        (6, "SCRUBBING"),
    ]
    state = simhosts.read(shared_host.id)
    assert [i["start"] for i in state["gpus"][0]["instances"]] == [0]  # destroyed on the host
    # meanwhile tenant C's second 1g.10gb does NOT get slice 4: it goes beside C's first on
    # GPU 1 (start 1), the unconfirmed slices count as taken
    settings.NVKE_SIMULATED_IN_PROCESS_AGENT = True
    c2 = make_pool(tenant_c_client, c_cluster, "m2", shared("1g.10gb"))
    settings.NVKE_SIMULATED_IN_PROCESS_AGENT = False
    from nodepools.reconcile import reconcile_nodepool

    reconcile_nodepool(c2)  # places (the node then waits for a report to become READY)
    assert [s[:3] for s in instances_of_pool(c2)] == [(1, "1g.10gb", 1)]

    # the agent reports: instances gone and each scrub id cleared -> FREE
    settings.NVKE_SIMULATED_IN_PROCESS_AGENT = True
    assert simhosts.report_in_process(shared_host)
    assert [r.state for r in released.all()] == ["FREE", "FREE", "FREE"]
    first = released.all()[0]
    evidence = first.scrub_evidence
    assert (evidence["scrub_id"], evidence["status"]) == (str(first.scrub_id), "ok")
    # the GPU's memory / 8 memory slices is cleared per 1-slice instance
    from catalog.models import GpuModel

    assert evidence["cleared_bytes"] == GpuModel.objects.get(slug=MODEL).memory_mib * 2**20 // 8
    assert HostEvent.objects.filter(host=shared_host, message__contains="verified by the agent")
    drive_pool(c2)

    # now another tenant's instance may take slice 4 (best fit: GPU 0 has 1 compute slice
    # left after it, GPU 1 five)
    a2 = make_pool(owner, make_cluster(owner, "a2"), "m", shared("1g.10gb"))
    drive_pool(a2)
    assert instances_of_pool(a2) == [(0, "1g.10gb", 4, 1, "ACTIVE")]


def test_an_instance_stays_scrubbing_while_the_agent_still_reports_it(
    outsider, shared_host, settings
):
    from clusters.providers import simhosts
    from fleet.models import GpuInstance

    b_cluster = make_cluster(outsider, "b")
    b = make_pool(outsider, b_cluster, "mig1g", shared("1g.10gb"))
    drive_pool(b)
    simhosts.change(shared_host, lambda s: simhosts.set_fault(s, "gi-destroy-fails"))
    outsider.delete(f"/api/v1/clusters/{b_cluster}/nodepools/{b}")
    drive_pool(b)
    (row,) = GpuInstance.objects.filter(host=shared_host)
    assert simhosts.report_in_process(shared_host)
    row.refresh_from_db()
    assert row.state == "SCRUBBING"  # the agent still lists the GPU instance at start 0
    # past NVKE_SCRUB_TIMEOUT_S the host says which instance is overdue
    settings.NVKE_SCRUB_TIMEOUT_S = 0
    assert simhosts.report_in_process(shared_host)
    shared_host.refresh_from_db()
    assert shared_host.warnings == [
        "slice scrub overdue: 1g.10gb@0 of GPU 0: the agent has not confirmed them destroyed "
        "and cleared; they stay out of placement"
    ]
    # the instance disappears without a clear (no scrub record): still not free
    simhosts.change(shared_host, lambda s: s["gpus"][0].update(instances=[]))
    assert simhosts.report_in_process(shared_host)
    row.refresh_from_db()
    assert row.state == "SCRUBBING"
