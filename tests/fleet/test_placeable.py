"""One definition of a placeable GPU (fleet/placeable.py; issue 33 item 4), shared by
placement, fragmentation, the console overview and the node pool form.

The fleet (SIMULATED, us-east-1a): a shared H100 host of 8 free GPUs (``tenancy: shared``), a
dedicated H100 host with GPU 0 UNHEALTHY (Xid) and GPU 1 being scrubbed, and an A100 host
whose agent went silent (``NOT_READY``). The console said "whole hosts free 1" (the shared
host, room for an 8-GPU node) and listed the silent A100's GPUs as FREE; dry runs rightly
placed nothing on the shared host.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

H100, A100 = "h100-sxm5-80gb", "a100-sxm4-80gb"


@pytest.fixture
def fleet(make_host):
    from fleet.choices import GpuHealth, HostState, HostTenancy
    from fleet.models import Gpu, Host

    shared = make_host(H100, gpus=8, hostname="hv-shared-1")
    Host.objects.filter(pk=shared.pk).update(tenancy=HostTenancy.SHARED)
    dedicated = make_host(H100, gpus=8, hostname="h100-ded-1")
    Gpu.objects.filter(host=dedicated, index=0).update(health=GpuHealth.UNHEALTHY)
    Gpu.objects.filter(host=dedicated, index=1).update(scrub_state="PENDING")
    silent = make_host(A100, gpus=8, hostname="a100-silent-1")
    Host.objects.filter(pk=silent.pk).update(state=HostState.NOT_READY)
    return shared, dedicated, silent


def test_the_orm_rule_and_the_planners_rule_agree(fleet):
    from fleet.models import Gpu, Host
    from fleet.placeable import placeable_gpus_q
    from fleet.placement import _views_for_hosts

    views = _views_for_hosts(Host.objects.values_list("pk", flat=True))
    planner = {
        g.uuid for v in views if v.schedulable for g in v.gpus if g.usable and g.holder is None
    }
    orm = set(Gpu.objects.filter(placeable_gpus_q()).values_list("uuid", flat=True))
    assert orm == planner
    assert len(orm) == 6  # the dedicated H100 less its UNHEALTHY and scrubbing GPUs


def test_fragmentation_counts_no_shared_host_as_whole_and_free(fleet):
    from fleet.fragmentation import fragmentation_report

    (h100,) = [g for g in fragmentation_report()["groups"] if g["gpu_model"] == H100]
    assert (h100["hosts"], h100["whole_hosts_free"], h100["free_gpus"]) == (1, 0, 6)
    assert (h100["shared_hosts"], h100["shared_free_gpus"]) == (1, 8)
    assert h100["shared_in_instances_gpus"] == 0
    shapes = {s["gpus"]: s["nodes"] for s in h100["shapes"]}
    assert shapes[8] == 0  # no room for an 8-GPU node, as the dry run says
    assert shapes[1] == 6


def test_the_console_overview_shows_no_unhealthy_or_silent_gpu_as_free(fleet):
    from portal.queries import gpus_by_model_and_health

    rows = {r["gpu_model_id"]: r for r in gpus_by_model_and_health()}
    # H100: 16 GPUs; 8 on the shared host and 6 on the dedicated one are placeable
    assert (rows[H100]["free"], rows[H100]["unavailable"], rows[H100]["unhealthy"]) == (14, 2, 1)
    # the silent A100 host: nothing is free, everything unavailable
    assert (rows[A100]["free"], rows[A100]["unavailable"]) == (0, 8)
    assert rows[H100]["in_instances"] == 0


def test_a_shared_gpu_carrying_a_tenants_instance_is_not_counted_free(fleet, tenant_a):
    """A fresh-user trial: GPU 0 of the shared host held two tenants' 1g.10gb instances and the
    console counted it Free (room for a whole-GPU node, it read)."""
    from django.utils import timezone

    from fleet.models import GpuInstance
    from portal.queries import gpus_by_model_and_health

    shared = fleet[0]
    gpu0 = shared.gpus.get(index=0)
    for start, holder, state in (
        (0, "11111111-1111-1111-1111-111111111111", "ACTIVE"),
        (1, None, "FREE"),  # an earlier tenant's, scrubbed: history, holds nothing
    ):
        GpuInstance.objects.create(
            host=shared, gpu=gpu0, profile="1g.10gb", start=start, size=1, compute_slices=1,
            holder_id=holder, tenant=tenant_a if holder else None, created_at=timezone.now(),
            state=state,
        )  # fmt: skip
    # a FREE row alone on GPU 1 leaves it free
    GpuInstance.objects.create(
        host=shared, gpu=shared.gpus.get(index=1), profile="1g.10gb", start=0, size=1,
        compute_slices=1, created_at=timezone.now(), state="FREE",
    )  # fmt: skip
    rows = {r["gpu_model_id"]: r for r in gpus_by_model_and_health()}
    h100 = rows[H100]
    assert (h100["held"], h100["in_instances"], h100["free"], h100["unavailable"]) == (0, 1, 13, 2)
    assert h100["held"] + h100["in_instances"] + h100["free"] + h100["unavailable"] == 16
    # the fragmentation report counts the same GPUs the same way (issue 33 D5; a fresh-user
    # trial read "In instances 1, Free 9" on the overview beside "8 GPU(s) free for MIG
    # instances" in fragmentation): of the shared host's 8 GPUs, 1 carries an instance, 7 are
    # free; the dedicated host's 6 placeable GPUs make 13 free with the 7
    from fleet.fragmentation import fragmentation_report

    (group,) = [g for g in fragmentation_report()["groups"] if g["gpu_model"] == H100]
    assert (group["shared_free_gpus"], group["shared_in_instances_gpus"]) == (7, 1)
    assert group["free_gpus"] + group["shared_free_gpus"] == h100["free"]


def test_the_node_pool_form_offers_a_model_with_gpus_free_first(fleet):
    from portal.queries import region_gpu_models

    models = region_gpu_models("us-east-1")
    assert [m.slug for m, _ in models] == [H100, A100]  # A100 sorts first by name, has 0 free
    # 6 of the dedicated host's 8 (one UNHEALTHY, one scrubbing); the shared host's 8 apart
    assert "6 of 8 GPUs free, up to 8 per node; + 8 GPUs on 1 shared host(s)" in models[0][1]
    assert "0 of 8 GPUs free" in models[1][1]
