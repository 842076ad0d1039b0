"""Every isolation rule (the table of docs/tenant/isolation.md): the policy it accepts,
normalised, and each refusal with its stable code and field. Values are worked out by hand
from the catalog data (gpu_models.yaml, vgpu_profiles.yaml, drivers.yaml, driver_rules.yaml)."""

from __future__ import annotations

import pytest

from nvke.errors import InvalidInput

pytestmark = pytest.mark.django_db


def model(slug):
    from catalog.models import GpuModel

    return GpuModel.objects.get(slug=slug)


def refuse(slug, isolation):
    from nodepools.isolation import validate_isolation

    with pytest.raises(InvalidInput) as err:
        validate_isolation(model(slug), isolation)
    return err.value


def accept(slug, isolation):
    from nodepools.isolation import validate_isolation

    return validate_isolation(model(slug), isolation)


def plan(slug, isolation):
    from nodepools.isolation import isolation_plan

    return isolation_plan(model(slug), isolation)


# ------------------------------------------------------------------- accepted shapes


def test_exclusive_and_defaults_are_normalised(catalog):
    assert accept("t4", {"mode": "exclusive"}) == {"mode": "exclusive"}
    assert accept("t4", {"mode": "exclusive", "tenancy": "dedicated"}) == {"mode": "exclusive"}


def test_mig_and_mig_backed_vgpu_may_be_shared_across_tenants(catalog):
    """Placed as GPU instances on shared hosts (fleet/shared_hosts.py, #18)."""
    from fleet.shared_hosts import instances_for_policy

    policy = accept(
        "h100-sxm5-80gb", {"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"}
    )
    assert policy == {"mode": "mig", "mig_profile": "1g.10gb", "tenancy": "shared"}
    assert instances_for_policy("h100-sxm5-80gb", policy, 2) == ("1g.10gb", "1g.10gb")
    vgpu = accept(
        "h200-nvl-141gb", {"mode": "vgpu", "vgpu_profile": "H200-1-35C", "tenancy": "shared"}
    )
    assert vgpu == {"mode": "vgpu", "vgpu_profile": "H200-1-35C", "tenancy": "shared"}
    # a MIG-backed vGPU type is placed as the MIG instance behind it (catalog: 1g.35gb)
    assert instances_for_policy("h200-nvl-141gb", vgpu, 3) == ("1g.35gb",) * 3


def test_single_profile_fills_every_gpu_by_the_placement_table(catalog):
    assert accept("h100-sxm5-80gb", {"mode": "mig", "mig_profile": "1g.10gb"}) == {
        "mode": "mig",
        "mig_profile": "1g.10gb",
    }
    # 1g.10gb {0..6}:1 -> 7 instances at starts 0..6 (slice 7 is no 1g start)
    assert [
        p.start
        for p in plan("h100-sxm5-80gb", {"mode": "mig", "mig_profile": "1g.10gb"}).mig_placements
    ] == [0, 1, 2, 3, 4, 5, 6]
    # 3g.40gb {0,4}:4 -> 2 instances; 1g.20gb {0,2,4,6}:2 -> 4
    assert (
        len(plan("h100-sxm5-80gb", {"mode": "mig", "mig_profile": "3g.40gb"}).mig_placements) == 2
    )
    assert (
        len(plan("a100-sxm4-80gb", {"mode": "mig", "mig_profile": "1g.20gb"}).mig_placements) == 4
    )


@pytest.mark.parametrize(
    ("slug", "alias", "canonical"),
    [
        ("a100-sxm4-80gb", "7g.79gb", "7g.80gb"),  # mig_aliases.yaml
        ("a100-sxm4-80gb", "3g.39gb", "3g.40gb"),  # mig-parted issue #31, 535.x/545.x
        ("a100-sxm4-40gb", "3g.21gb", "3g.20gb"),  # 450.x drivers
        ("gb200", "1g.24gb", "1g.23gb"),  # pre-production boards
    ],
)
def test_known_aliases_resolve_per_model(catalog, slug, alias, canonical):
    assert accept(slug, {"mode": "mig", "mig_profile": alias})["mig_profile"] == canonical
    layout = accept(slug, {"mode": "mig", "mig_layout": {alias: 1}})["mig_layout"]
    assert layout == {canonical: 1}


def test_a_name_is_never_read_as_a_size(catalog):
    # 1g.12gb is an H100 NVL profile; on H100 SXM5 (same 1-slice class, 1g.10gb) it is unknown
    err = refuse("h100-sxm5-80gb", {"mode": "mig", "mig_profile": "1g.12gb"})
    assert (err.code, err.field) == ("unknown_mig_profile", "isolation.mig_profile")
    # 7g.79gb is an alias on A100-80GB only, not on H100-80GB whose full profile is 7g.80gb too
    err = refuse("h100-sxm5-80gb", {"mode": "mig", "mig_profile": "7g.79gb"})
    assert err.code == "unknown_mig_profile"


def test_mixed_layout_is_normalised_to_canonical_names_in_creation_order(catalog):
    policy = accept(
        "a100-sxm4-80gb", {"mode": "mig", "mig_layout": {"1g.10gb": 2, "3g.39gb": 1, "2g.20gb": 1}}
    )
    assert policy == {"mode": "mig", "mig_layout": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}
    placements = plan("a100-sxm4-80gb", policy).mig_placements
    # all-balanced: the 3g moves to start 4 so that 2g at 0 and two 1g at 2, 3 fit
    assert [(p.profile, p.start) for p in placements] == [
        ("3g.40gb", 4),
        ("2g.20gb", 0),
        ("1g.10gb", 2),
        ("1g.10gb", 3),
    ]


def test_vgpu_single_type_fills_the_gpu_and_layouts_may_mix_sizes_on_an_a10(catalog):
    assert accept("a10", {"mode": "vgpu", "vgpu_profile": "a10-12q"}) == {
        "mode": "vgpu",
        "vgpu_profile": "A10-12Q",
    }
    assert plan("a10", {"mode": "vgpu", "vgpu_profile": "A10-12Q"}).vgpu_devices == {"A10-12Q": 2}
    # GPU Operator KubeVirt doc: A10-4Q x3 + A10-6Q x2 on one A10 (12 + 12 = 24 GB)
    assert accept("a10", {"mode": "vgpu", "vgpu_layout": {"A10-4Q": 3, "A10-6Q": 2}}) == {
        "mode": "vgpu",
        "vgpu_layout": {"A10-4Q": 3, "A10-6Q": 2},
    }


def test_mig_backed_vgpu_goes_through_the_mig_placement_rules(catalog):
    p = plan("h200-nvl-141gb", {"mode": "vgpu", "vgpu_layout": {"H200-3-71C": 1, "H200-1-18C": 2}})
    assert p.mig_devices == {"3g.71gb": 1, "1g.18gb": 2}
    err = refuse(
        "h200-nvl-141gb", {"mode": "vgpu", "vgpu_layout": {"H200-4-71C": 1, "H200-3-71C": 2}}
    )
    assert (err.code, err.field) == ("mig_layout_does_not_fit", "isolation.vgpu_layout")


def test_time_slicing_and_mps(catalog):
    assert accept("l40s", {"mode": "time-slicing", "replicas": 4}) == {
        "mode": "time-slicing",
        "replicas": 4,
    }
    assert accept("l40s", {"mode": "mps", "replicas": 48})["replicas"] == 48
    # time-slicing of MIG devices is supported by the device plugin
    policy = accept(
        "a100-sxm4-80gb", {"mode": "time-slicing", "replicas": 2, "mig_profile": "3g.39gb"}
    )
    assert policy == {"mode": "time-slicing", "replicas": 2, "mig_profile": "3g.40gb"}


# ------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("slug", "isolation", "code", "field"),
    [
        ("t4", "mig", "invalid_isolation", "isolation"),
        ("t4", {"mode": "banana"}, "invalid_isolation", "isolation.mode"),
        ("t4", {"mode": "exclusive", "replicas": 2}, "invalid_isolation", "isolation.replicas"),
        (
            "t4",
            {"mode": "exclusive", "tenancy": "shared"},
            "invalid_isolation",
            "isolation.tenancy",
        ),
        ("t4", {"mode": "exclusive", "tenancy": "x"}, "invalid_isolation", "isolation.tenancy"),
        # MIG support is per product: Ampere A10G / Ada L40S, L4 / Turing T4 have none
        ("a10g", {"mode": "mig", "mig_profile": "1g.10gb"}, "mig_not_supported", "isolation.mode"),
        ("a10", {"mode": "mig", "mig_profile": "1g.10gb"}, "mig_not_supported", "isolation.mode"),
        (
            "l40s",
            {"mode": "mig", "mig_layout": {"1g.10gb": 1}},
            "mig_not_supported",
            "isolation.mode",
        ),
        ("l4", {"mode": "mig"}, "mig_not_supported", "isolation.mode"),
        ("t4", {"mode": "mig", "mig_profile": "1g.10gb"}, "mig_not_supported", "isolation.mode"),
        (
            "rtx-6000-ada",
            {"mode": "mig", "mig_profile": "1g.12gb"},
            "mig_not_supported",
            "isolation.mode",
        ),
        ("a40", {"mode": "mig", "mig_profile": "1g.12gb"}, "mig_not_supported", "isolation.mode"),
        ("h100-sxm5-80gb", {"mode": "mig"}, "mig_profile_required", "isolation.mig_profile"),
        (
            "h100-sxm5-80gb",
            {"mode": "mig", "mig_profile": "1g.10gb", "mig_layout": {"1g.10gb": 1}},
            "invalid_isolation",
            "isolation.mig_layout",
        ),
        (
            "a100-sxm4-80gb",
            {"mode": "mig", "mig_profile": "1g.18gb"},
            "unknown_mig_profile",
            "isolation.mig_profile",
        ),
        (
            "h100-nvl-94gb",
            {"mode": "mig", "mig_layout": {"3g.47gb": 1, "1g.10gb": 1}},
            "unknown_mig_profile",
            "isolation.mig_layout.1g.10gb",
        ),
        (
            "h100-nvl-94gb",
            {"mode": "mig", "mig_layout": {}},
            "invalid_isolation",
            "isolation.mig_layout",
        ),
        (
            "h100-nvl-94gb",
            {"mode": "mig", "mig_layout": {"1g.12gb": 0}},
            "invalid_isolation",
            "isolation.mig_layout",
        ),
        (
            "h100-nvl-94gb",
            {"mode": "mig", "mig_layout": {"1g.12gb": True}},
            "invalid_isolation",
            "isolation.mig_layout",
        ),
        (
            "h100-nvl-94gb",
            {"mode": "mig", "mig_layout": {"4g.47gb": 1, "2g.24gb": 2}},
            "mig_layout_does_not_fit",
            "isolation.mig_layout",
        ),
        (
            "h100-nvl-94gb",
            {"mode": "mig", "mig_layout": {"1g.12gb+me": 2}},
            "mig_layout_does_not_fit",
            "isolation.mig_layout",
        ),
        (
            "l40s",
            {"mode": "mps", "replicas": 4, "mig_profile": "1g.10gb"},
            "mps_on_mig_not_supported",
            "isolation.mig_profile",
        ),
        (
            "a100-sxm4-80gb",
            {"mode": "mps", "replicas": 4, "mig_profile": "1g.10gb"},
            "mps_on_mig_not_supported",
            "isolation.mig_profile",
        ),
        ("l40s", {"mode": "mps", "replicas": 49}, "invalid_replicas", "isolation.replicas"),
        ("l40s", {"mode": "mps", "replicas": 1}, "invalid_replicas", "isolation.replicas"),
        ("l40s", {"mode": "time-slicing"}, "invalid_replicas", "isolation.replicas"),
        (
            "l40s",
            {"mode": "time-slicing", "replicas": "4"},
            "invalid_replicas",
            "isolation.replicas",
        ),
        (
            "l40s",
            {"mode": "time-slicing", "replicas": 4, "mig_profile": "1g.10gb"},
            "mig_not_supported",
            "isolation.mode",
        ),
        (
            "l40s",
            {"mode": "time-slicing", "replicas": 4, "tenancy": "shared"},
            "cross_tenant_sharing_not_isolated",
            "isolation.tenancy",
        ),
        (
            "l40s",
            {"mode": "mps", "replicas": 4, "tenancy": "shared"},
            "cross_tenant_sharing_not_isolated",
            "isolation.tenancy",
        ),
        (
            "a10",
            {"mode": "vgpu", "vgpu_profile": "A10-12Q", "tenancy": "shared"},
            "shared_vgpu_not_mig_backed",
            "isolation.tenancy",
        ),
        (
            "l40s",
            {"mode": "vgpu", "vgpu_profile": "L40S-48C"},
            "vgpu_not_supported",
            "isolation.mode",
        ),
        ("a10", {"mode": "vgpu"}, "vgpu_profile_required", "isolation.vgpu_profile"),
        (
            "a10",
            {"mode": "vgpu", "vgpu_profile": "T4-8C"},
            "unknown_vgpu_profile",
            "isolation.vgpu_profile",
        ),
        # T4: "This GPU does not support mixed-size mode" (NVIDIA Turing vGPU table)
        (
            "t4",
            {"mode": "vgpu", "vgpu_layout": {"T4-8C": 1, "T4-4C": 2}},
            "vgpu_mixed_sizes_not_supported",
            "isolation.vgpu_layout",
        ),
        # H200 NVL: mixed-size support not found in public material -> refused
        (
            "h200-nvl-141gb",
            {"mode": "vgpu", "vgpu_layout": {"H200-70C": 1, "H200-35C": 2}},
            "vgpu_mixed_sizes_not_supported",
            "isolation.vgpu_layout",
        ),
        (
            "t4",
            {"mode": "vgpu", "vgpu_layout": {"T4-8C": 3}},
            "vgpu_layout_does_not_fit",
            "isolation.vgpu_layout",
        ),
        # 12 + 8 + 8 = 28 GB > the A10's 24 GB
        (
            "a10",
            {"mode": "vgpu", "vgpu_layout": {"A10-12Q": 1, "A10-8Q": 2}},
            "vgpu_layout_does_not_fit",
            "isolation.vgpu_layout",
        ),
        (
            "h200-nvl-141gb",
            {"mode": "vgpu", "vgpu_layout": {"H200-1-18C": 1, "H200-35C": 1}},
            "vgpu_mixed_backing",
            "isolation.vgpu_layout",
        ),
    ],
)
def test_refusals_name_the_rule_and_the_field(catalog, slug, isolation, code, field):
    err = refuse(slug, isolation)
    assert (err.code, err.field) == (code, field), err.detail


def test_unknown_profile_lists_the_models_valid_ones(catalog):
    err = refuse("a100-sxm4-80gb", {"mode": "mig", "mig_profile": "1g.18gb"})
    assert err.extra["valid_profiles"] == [
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ]
    err = refuse("t4", {"mode": "vgpu", "vgpu_profile": "T4-2C"})
    assert err.extra["valid_profiles"] == ["T4-16C", "T4-8C", "T4-4C"]


def test_layout_refusal_says_which_rule_broke(catalog):
    err = refuse("h100-sxm5-80gb", {"mode": "mig", "mig_layout": {"3g.40gb": 2, "1g.10gb": 1}})
    assert err.extra == {"rule": "memory_slices"}
    assert "needs 9 memory slices; h100-sxm5-80gb has 8" in str(err.detail)


# ------------------------------------------------------------------- drivers


def check_driver(slug, driver, cuda=None, isolation=None):
    from nodepools.isolation import validate_driver

    validate_driver(
        model(slug),
        driver_version=driver,
        cuda_version=cuda,
        policy=isolation or {"mode": "exclusive"},
    )


@pytest.mark.parametrize(
    ("slug", "driver", "cuda", "isolation", "code", "field"),
    [
        ("t4", "R580x", None, None, "invalid_driver_version", "driver_version"),
        ("t4", "R545", None, None, "unknown_driver_branch", "driver_version"),
        # Hopper's first toolkit is CUDA 11.8 (>= 520.61.05): R470 predates it
        ("h100-sxm5-80gb", "R470", None, None, "driver_architecture_unsupported", "driver_version"),
        # Blackwell needs CUDA 12.8 (>= 570.26): R560 is too old
        ("b200", "560.35.03", None, None, "driver_architecture_unsupported", "driver_version"),
        # HGX B200: driver container >= 570.133.20 (GPU Operator platform support)
        ("b200", "570.124.06", None, None, "driver_too_old_for_gpu", "driver_version"),
        # CUDA 12.8 GA needs >= 570.26
        ("h100-sxm5-80gb", "R560", "12.8", None, "driver_too_old_for_cuda", "driver_version"),
        ("h100-sxm5-80gb", "550.54.15", "12.6", None, "driver_too_old_for_cuda", "driver_version"),
        ("h100-sxm5-80gb", "R580", "99.1", None, "unknown_cuda_version", "cuda_version"),
        # A30 2g.12gb+me needs R525+
        (
            "a30",
            "R470",
            None,
            {"mode": "mig", "mig_profile": "2g.12gb+me"},
            "driver_too_old_for_mig_profile",
            "driver_version",
        ),
        # 4g + 3g on one GPU needs R510+
        (
            "a100-sxm4-40gb",
            "R470",
            None,
            {"mode": "mig", "mig_layout": {"4g.20gb": 1, "3g.20gb": 1}},
            "driver_too_old_for_mig_profile",
            "driver_version",
        ),
    ],
)
def test_driver_refusals(catalog, slug, driver, cuda, isolation, code, field):
    with pytest.raises(InvalidInput) as err:
        check_driver(slug, driver, cuda, isolation)
    assert (err.value.code, err.value.field) == (code, field), err.value.detail


def test_drivers_that_fit(catalog):
    check_driver("h100-sxm5-80gb", "R580", "12.8")
    check_driver("b200", "570.133.20", "12.8")
    check_driver("b200", "R570")  # a branch stands for its newest release
    check_driver("a30", "R525", None, {"mode": "mig", "mig_profile": "2g.12gb+me"})
    check_driver(
        "a100-sxm4-40gb", "R535", None, {"mode": "mig", "mig_layout": {"4g.20gb": 1, "3g.20gb": 1}}
    )
    check_driver("t4", None, "13.1")  # the GPU Operator default 595.91.07 >= 590.44.01


def test_an_exact_release_is_held_to_the_architectures_minimum(catalog):
    # R570 supports Blackwell, but Blackwell's first toolkit (CUDA 12.8) needs >= 570.26
    with pytest.raises(InvalidInput) as err:
        check_driver("b200", "570.10.01")
    assert err.value.code == "driver_architecture_unsupported"
    assert err.value.extra == {"minimum": "570.26"}
