"""Rack-scale GPU systems in the catalog (``catalog/data/gpu_systems.yaml``): GB200 NVL72 with
its tray and NVLink domain sizes, each fact with its source, served on the GPU model."""

from __future__ import annotations

import pytest

from catalog.datafiles import CatalogDataError
from catalog.loader import gpu_system_rows
from catalog.models import GpuSystem

pytestmark = pytest.mark.django_db


def test_gb200_nvl72_is_18_trays_of_4_gpus_in_one_72_gpu_domain(loaded):
    system = GpuSystem.objects.get(slug="gb200-nvl72")
    assert system.gpu_model_id == "gb200"
    assert (
        system.compute_trays,
        system.gpus_per_tray,
        system.grace_cpus_per_tray,
        system.nvlink_switch_trays,
        system.nvlink_domain_gpus,
    ) == (18, 4, 2, 9, 72)
    # 72 GPUs / 4 per tray: a domain is 18 trays (hosts); 18 x 2 = 36 Grace CPUs
    assert system.domain_trays == 18
    assert system.compute_trays * system.grace_cpus_per_tray == 36
    sourced = {
        s["field"]: s["source"] if isinstance(s["source"], list) else [s["source"]]
        for s in system.sources
    }
    for field in ("compute_trays", "gpus_per_tray", "nvlink_domain_gpus", "grace_cpus_per_tray"):
        assert any("docs.nvidia.com/dgx/dgxgb200-user-guide" in s for s in sourced[field]), field


def test_the_gpu_model_api_serves_its_systems(loaded, anonymous, owner):
    body = owner.get("/api/v1/catalog/gpu-models/gb200").json()
    (system,) = body["systems"]
    assert (system["slug"], system["nvlink_domain_gpus"], system["gpus_per_tray"]) == (
        "gb200-nvl72",
        72,
        4,
    )


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (
            {"compute_trays": 18, "gpus_per_tray": 4, "nvlink_domain_gpus": 70},
            "whole number of trays",
        ),
        (
            {"compute_trays": 2, "gpus_per_tray": 4, "nvlink_domain_gpus": 72},
            "whole number of trays",
        ),
        (
            {"compute_trays": 0, "gpus_per_tray": 4, "nvlink_domain_gpus": 4},
            "compute_trays must be",
        ),
        (
            {"compute_trays": 18, "gpus_per_tray": 4, "nvlink_domain_gpus": 72, "sources": []},
            "sources",
        ),
    ],
)
def test_malformed_systems_are_refused(entry, problem):
    doc = {"systems": [{"key": "X", "gpu_model": "GB200", "sources": [{"field": "x"}], **entry}]}
    with pytest.raises(CatalogDataError) as err:
        gpu_system_rows(doc)
    assert problem in str(err.value)
