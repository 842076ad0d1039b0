"""catalog.services: what other apps call. Values checked by hand against catalog/data."""

from __future__ import annotations

from datetime import date

import pytest

from catalog.models import GpuModel
from catalog.services import (
    MigNotSupported,
    UnknownCudaVersion,
    UnknownGpuModel,
    UnknownMigProfile,
    UnsupportedKubernetesVersion,
    check_kubernetes_version,
    driver_problems,
    get_gpu_model,
    get_xid_code,
    match_product_name,
    minimum_driver_for_cuda,
    parse_driver_version,
    resolve_mig_profile,
    supported_kubernetes_versions,
)

pytestmark = pytest.mark.django_db

SNAPSHOT = date(2026, 11, 29)


@pytest.fixture(autouse=True)
def _catalog(loaded):
    return loaded


# ---------------------------------------------------------------- GPU models


@pytest.mark.parametrize(
    ("product_name", "slug"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA A10G", "a10g"),
        ("Tesla T4", "t4"),
        ("  tesla   t4 ", "t4"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),
        ("NVIDIA H100 NVL", "h100-nvl-94gb"),
        ("A100-SXM4-40GB", "a100-sxm4-40gb"),  # the 450.x driver era name
        ("NVIDIA B200", "b200"),
    ],
)
def test_it_matches_nvml_product_names(product_name, slug):
    model = match_product_name(product_name)
    assert model is not None and model.slug == slug


@pytest.mark.parametrize(
    "product_name",
    ["NVIDIA RTX 4000 SFF Ada Generation", "NVIDIA A100", "A10", "", "NVIDIA-A100-SXM4-40GB"],
)
def test_it_matches_nothing_for_unknown_or_partial_names(product_name):
    assert match_product_name(product_name) is None


def test_get_gpu_model_returns_the_row_or_names_the_valid_slugs():
    assert get_gpu_model("h200-sxm-141gb").name == "H200-SXM-141GB"
    with pytest.raises(UnknownGpuModel) as err:
        get_gpu_model("h300")
    assert err.value.slug == "h300"
    assert "a100-sxm4-80gb" in err.value.valid and "t4" in err.value.valid
    assert len(err.value.valid) == 19  # 15 from gpu_models.yaml + 4 from gpu_models_nvke.yaml
    assert isinstance(err.value, ValueError)
    assert "unknown GPU model 'h300'" in str(err.value)


# ---------------------------------------------------------------- MIG profiles


def test_it_resolves_a_profile_of_the_model():
    profile = resolve_mig_profile(get_gpu_model("h100-sxm5-80gb"), "1g.10gb")
    assert (profile.compute_slices, profile.memory_slices, profile.max_instances) == (1, 1, 7)
    assert profile.placements == "{0,1,2,3,4,5,6}:1"
    assert profile.placements_verified is True


def test_it_resolves_aliases_reported_by_other_drivers():
    a100 = get_gpu_model("a100-sxm4-80gb")
    assert resolve_mig_profile(a100, "3g.39gb").name == "3g.40gb"
    assert resolve_mig_profile(a100, "7g.79gb").name == "7g.80gb"
    assert resolve_mig_profile(get_gpu_model("a100-sxm4-40gb"), "3g.21gb").name == "3g.20gb"
    assert resolve_mig_profile(get_gpu_model("gb200"), "1g.24gb").name == "1g.23gb"


def test_it_rejects_mig_profile_of_another_gpu_model():
    a100 = get_gpu_model("a100-sxm4-80gb")
    with pytest.raises(UnknownMigProfile) as err:
        resolve_mig_profile(a100, "1g.18gb")  # an H200 profile
    assert err.value.gpu_model == a100
    assert err.value.name == "1g.18gb"
    assert err.value.valid == [
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ]
    assert resolve_mig_profile(get_gpu_model("h200-sxm-141gb"), "1g.18gb").name == "1g.18gb"


def test_it_rejects_mig_on_a_gpu_without_mig():
    t4 = get_gpu_model("t4")
    with pytest.raises(MigNotSupported) as err:
        resolve_mig_profile(t4, "1g.5gb")
    assert err.value.gpu_model == t4
    assert str(err.value) == "t4 does not support MIG"


# ---------------------------------------------------------------- Kubernetes versions


@pytest.mark.parametrize(
    ("requested", "minor"),
    [("1.37", "1.37"), ("1.37.1", "1.37"), ("v1.36.4", "1.36"), ("1.35", "1.35")],
)
def test_it_accepts_supported_kubernetes_versions(requested, minor):
    assert check_kubernetes_version(requested, today=SNAPSHOT).version == minor


def test_supported_versions_on_the_snapshot_day_are_the_three_newest():
    assert [kv.version for kv in supported_kubernetes_versions(SNAPSHOT)] == [
        "1.37",
        "1.36",
        "1.35",
    ]


def test_it_rejects_a_version_past_end_of_life():
    with pytest.raises(UnsupportedKubernetesVersion) as err:
        check_kubernetes_version("1.34.2", today=SNAPSHOT)  # EOL 2026-10-27
    assert err.value.version == "1.34.2"
    assert err.value.supported == ["1.37", "1.36", "1.35"]
    assert "reached end of life on 2026-10-27" in str(err.value)


def test_end_of_life_day_itself_is_still_supported():
    assert check_kubernetes_version("1.34", today=date(2026, 10, 27)).version == "1.34"
    with pytest.raises(UnsupportedKubernetesVersion):
        check_kubernetes_version("1.34", today=date(2026, 10, 28))


@pytest.mark.parametrize("version", ["1.38", "1.30", "2.0", "latest", "1", "1.37.x"])
def test_it_rejects_unknown_or_malformed_versions(version):
    with pytest.raises(UnsupportedKubernetesVersion) as err:
        check_kubernetes_version(version, today=SNAPSHOT)
    assert err.value.supported == ["1.37", "1.36", "1.35"]


def test_it_rejects_a_version_before_its_release():
    with pytest.raises(UnsupportedKubernetesVersion, match="not released until 2026-08-26"):
        check_kubernetes_version("1.37", today=date(2026, 8, 25))


# ---------------------------------------------------------------- drivers, CUDA, Xids


@pytest.mark.parametrize(
    ("cuda", "label", "driver"),
    [
        ("12.4", "12.4 GA", "550.54.14"),
        ("12.4.1", "12.4 Update 1", "550.54.15"),
        ("11.0", "11.0.2 GA", "450.51.05"),
        ("11.0.3", "11.0.3 Update 1", "450.51.06"),
        ("12.8", "12.8 GA", "570.26"),
        ("13.1", "13.1", "590.44.01"),
        ("13.0 Update 2", "13.0 Update 2", "580.95.05"),
    ],
)
def test_minimum_driver_for_cuda(cuda, label, driver):
    row = minimum_driver_for_cuda(cuda)
    assert (row.label, row.min_linux_driver) == (label, driver)


def test_unknown_cuda_versions_are_rejected():
    with pytest.raises(UnknownCudaVersion) as err:
        minimum_driver_for_cuda("12.7")  # no 12.7 toolkit row exists
    assert "12.6" in err.value.known and "12.8" in err.value.known


def test_driver_problems_against_architecture_gpu_and_cuda():
    """The production check (``driver_problems``, what pool specs and upgrades use)."""
    b200 = GpuModel.objects.get(slug="b200")
    h100 = GpuModel.objects.get(slug="h100-sxm5-80gb")
    assert driver_problems(b200, parse_driver_version("570.133.20"), cuda_version="12.8") == []
    assert [
        (p.code, p.minimum) for p in driver_problems(b200, parse_driver_version("565.57.01"))
    ] == [("driver_architecture_unsupported", "570.26"), ("driver_too_old_for_gpu", "570.133.20")]
    (too_old,) = driver_problems(h100, parse_driver_version("560.35.03"), cuda_version="12.8")
    assert (too_old.code, too_old.field, too_old.message) == (
        "driver_too_old_for_cuda",
        "driver_version",
        "CUDA 12.8 GA needs driver >= 570.26; 560.35.03 is older",
    )
    assert driver_problems(h100, parse_driver_version("R580")) == []
    with pytest.raises(ValueError, match="not a driver branch"):
        parse_driver_version("latest")


def test_xid_codes_carry_severity_and_operator_action():
    fell_off = get_xid_code(79)
    assert fell_off.severity == "critical"
    assert fell_off.nvidia_immediate_action == "RESTART_BM"
    assert "reboot node" in fell_off.operator_action
    app_error = get_xid_code(13)
    assert (app_error.severity, app_error.device_plugin_marks_unhealthy) == ("warning", False)
    # no operator_action of its own: NVKE's RESTART_APP bucket mapping
    assert get_xid_code(8).operator_action.startswith("fail/restart the affected workload")
    # "info when alone after a kill; otherwise inherit the accompanying Xid"
    cleanup = get_xid_code(45)
    assert cleanup.severity == "info" and cleanup.severity_note.startswith("info when alone")
    # "unknown on Ampere+ ..." -> the CONTACT_SUPPORT bucket: critical
    assert get_xid_code(61).severity == "critical"
    assert get_xid_code(147).mnemonic == "NVLINK_TREX_ERROR"
    assert get_xid_code(150).mnemonic == "NVLINK_MSE_ERROR"
    assert get_xid_code(9999) is None


def test_the_gb200_product_name_is_sourced_and_a_gb200_report_imports(catalog):
    """``nvml_name: unknown`` in the shared catalog made every GB200 import 400
    ``unknown_gpu_product``; catalog/data/product_names.yaml adds "NVIDIA GB200" (the
    ``nvidia-smi -L`` line NVIDIA/k8s-dra-driver-gpu's GPU tests check on GB200 systems).

    The report is the real A10G capture with its product name and UUID changed: a SIMULATED
    GB200 report (no public GB200 ``nvidia-smi -q -x`` capture was found), enough to show the
    import path needs the product name only (memory comes from the report itself)."""
    from catalog.models import GpuModel
    from catalog.services import match_product_name
    from fleet.services import import_host
    from tests.conftest import capture

    assert match_product_name("NVIDIA GB200").slug == "gb200"
    assert match_product_name("nvidia  gb200").slug == "gb200"  # case and spaces as NVML varies
    assert match_product_name("NVIDIA GB200 NVL") is None  # a mock's name, not taken
    gb200 = GpuModel.objects.get(slug="gb200")
    (sourced,) = [s for s in gb200.sources if s.get("field") == "product_names"]
    assert sourced["value"] == "NVIDIA GB200"
    assert "22407113785e78c7763b4637689a201eb39c6199" in sourced["source"]
    xml = (
        capture("a10g.xml")
        .replace(
            "<product_name>NVIDIA A10G</product_name>", "<product_name>NVIDIA GB200</product_name>"
        )
        .replace(
            "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94", "GPU-7277883e-ce1e-3b6e-6cc1-6d52e80cdb86"
        )
    )
    host = import_host(hostname="gb200-tray-sim", zone="us-east-1a", nvidia_smi_xml=xml).host
    assert host.gpu_model_id == "gb200"
    assert list(host.gpus.values_list("uuid", flat=True)) == [
        "GPU-7277883e-ce1e-3b6e-6cc1-6d52e80cdb86"
    ]
