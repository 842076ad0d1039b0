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
    two = _config({"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"}, gpus=2)
    assert two["resources"] == {"nvidia.com/gpu": 2}


def test_a_dedicated_mig_pool_node_gets_every_instance_of_its_gpus(catalog):
    dedicated = _config({"mode": "mig", "mig_profile": "1g.10gb"})
    assert dedicated["resources"] == {"nvidia.com/gpu": 7}  # 7 x 1g.10gb on one H100
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
