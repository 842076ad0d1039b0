"""A shared MIG pool's per-node figures say what each node really gets (issue 33 item 3): each
VM node of a ``tenancy: shared`` pool holds one ``1g.10gb`` instance per requested device, but
``gpu_config.resources`` said ``{"nvidia.com/gpu": 7}`` (a whole GPU partitioned 7 ways) and
the portal "Resources per node nvidia.com/gpu: 7"; nothing said the pool was shared."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def _config(isolation, gpus=1):
    from catalog.models import GpuModel
    from nodepools.gpu_config import render_gpu_config
    from nodepools.isolation import validate_isolation

    model = GpuModel.objects.get(slug="h100-sxm5-80gb")
    return render_gpu_config(
        gpu_model=model,
        gpus_per_node=gpus,
        isolation=validate_isolation(model, isolation),
        pool_name="pool-a",
    )


def test_a_shared_mig_pool_node_gets_one_device_per_instance(catalog):
    shared = _config({"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"})
    assert shared["resources"] == {"nvidia.com/gpu": 1}
    assert shared["tenancy"] == "shared"
    # its layout is the node's one instance (1 memory slice of 8), placed by the fleet: not
    # the 7 instances of a whole H100 partitioned for it
    assert shared["mig_layout"] == [{"profile": "1g.10gb", "start": None, "size": 1}]
    assert "mig_instances_per_gpu" not in shared
    # no mig-parted entry (a fresh-user trial read "all-1g.10gb: 7 per GPU" there and in the
    # node's nvidia.com/mig.config label): the fleet partitions the shared host's GPUs
    assert shared["mig_parted_config"] is None
    assert "nvidia.com/mig.config" not in shared["labels"]
    configmaps = [m["metadata"]["name"] for m in shared["manifests"] if m["kind"] == "ConfigMap"]
    assert "nvke-mig-parted-config" not in configmaps
    two = _config({"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"}, gpus=2)
    assert two["resources"] == {"nvidia.com/gpu": 2}
    assert [d["profile"] for d in two["mig_layout"]] == ["1g.10gb", "1g.10gb"]


def test_a_shared_pool_expects_no_whole_gpu_layout_from_the_host(catalog):
    """The observed-state gate checks a shared node's own instances
    (nodepools.shared_host_nodes), never a per-GPU layout: the pool's expectation names none
    (a None start must not break it)."""
    from nodepools import observed_gates
    from nodepools.models import NodePool

    config = _config({"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"})
    pool = NodePool(gpu_model_id="h100-sxm5-80gb", gpu_config=config, driver_version="")
    assert observed_gates.expectation(pool).instances == ()
    assert observed_gates.expectation(pool).mig_enabled is True  # its GPU runs MIG


def test_a_dedicated_mig_pool_node_gets_every_instance_of_its_gpus(catalog):
    dedicated = _config({"mode": "mig", "mig_profile": "1g.10gb"})
    assert dedicated["resources"] == {"nvidia.com/gpu": 7}  # 7 x 1g.10gb on one H100
    assert [d["start"] for d in dedicated["mig_layout"]] == [0, 1, 2, 3, 4, 5, 6]
    assert "tenancy" not in dedicated


def test_the_portal_says_the_pool_is_shared(catalog):
    from django.template.loader import render_to_string

    html = render_to_string(
        "portal/partials/dry_run.html",
        {
            "dry_run": {
                "gpu_config": _config(
                    {"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"}
                )
            }
        },
    )
    assert "nvidia.com/gpu: 1" in html
    assert 'id="shared-tenancy"' in html
    assert "GPU instances of each node" in html and "GPU instances on each GPU" not in html
    assert html.count("1g.10gb") == 1  # one instance, not 7
