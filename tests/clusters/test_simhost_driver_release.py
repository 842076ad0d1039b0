"""A driver upgrade to a branch makes a simulated host report the catalog's real release of
it (issue 33 item 6): ``R580`` reported ``580.0.0``, a version NVIDIA never shipped; the
catalog's newest known R580 release is 580.95.05 (the minimum driver of CUDA 13.0 Update 2,
catalog/data/drivers.yaml)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_a_branch_installs_its_newest_release_the_catalog_knows(catalog):
    from catalog.services import newest_known_release
    from clusters.providers import simhosts

    assert newest_known_release(580) == "580.95.05"
    state = {"faults": [], "gpus": [{"health": {"ecc_volatile_uncorrected": 2}}]}
    state["cuda_version"] = "12.8"
    simhosts.install_driver(state, "R580")
    assert state["driver_version"] == "580.95.05"
    # and the CUDA it supports, as nvidia-smi prints it: 13.0 (13.0 Update 2 needs >=
    # 580.95.05, 13.1 >= 590.44.01); it stayed "12.8" (a fresh-user trial)
    assert state["cuda_version"] == "13.0"
    assert state["gpus"][0]["health"]["ecc_volatile_uncorrected"] == 0
    simhosts.install_driver(state, "570.172.08")  # an exact release is taken as it is
    assert (state["driver_version"], state["cuda_version"]) == ("570.172.08", "12.8")


@pytest.mark.parametrize(
    ("release", "cuda"),
    [
        ("580.65.06", "13.0"),  # 13.0 GA's minimum
        ("580.65.05", "12.9"),  # below it: 12.9 Update 1 needs 575.57.08
        ("570.26", "12.8"),
        ("590.44.01", "13.1"),
        ("410.48", None),  # older than every toolkit the catalog holds
        ("R580", None),  # not a release
    ],
)
def test_the_cuda_a_driver_supports_is_the_newest_toolkit_whose_minimum_it_meets(
    catalog, release, cuda
):
    from catalog.services import cuda_of_driver

    assert cuda_of_driver(release) == cuda


def test_a_branch_the_catalog_names_no_release_of_keeps_its_number(catalog):
    from catalog.services import newest_known_release
    from clusters.providers import simhosts

    assert newest_known_release(999) is None
    state = {"faults": [], "gpus": []}
    simhosts.install_driver(state, "R999")
    assert state["driver_version"] == "999.0.0"
