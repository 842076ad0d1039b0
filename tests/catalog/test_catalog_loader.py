"""The loader: normalising the shared catalog's irregular YAML, and writing it idempotently.

Expected values are read off catalog/data/gpu_models.yaml by hand (line references are to
that file as vendored) and the MIG user guide's profile tables.
"""

from __future__ import annotations

import re
import textwrap
from datetime import date

import pytest

from catalog.datafiles import CatalogDataError
from catalog.gpu_rows import history_aliases
from catalog.loader import (
    gpu_model_rows,
    load_catalog,
    parse_placements,
    product_names,
    slug_for_key,
)
from catalog.models import (
    CudaDriverRequirement,
    DriverBranch,
    GpuArchitecture,
    GpuModel,
    KubernetesVersion,
    MigProfile,
    XidCode,
)
from catalog.placements import Placements, placement_classes

EXPECTED_SLUGS = {
    "a100-sxm4-40gb",
    "a100-sxm4-80gb",
    "a30",
    "h100-sxm5-80gb",
    "h100-pcie-80gb",
    "h100-nvl-94gb",
    "h200-sxm-141gb",
    "h200-nvl-141gb",
    "b200",
    "gb200",
    "l40s",
    "l4",
    "a10",
    "t4",
    "a10g",
    # gpu_models_nvke.yaml: more data-center GPUs without MIG
    "l40",
    "a40",
    "a16",
    "rtx-6000-ada",
}


# ---------------------------------------------------------------- pure normalisation


@pytest.mark.parametrize(
    ("key", "slug"),
    [
        ("A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("H100-SXM5-80GB", "h100-sxm5-80gb"),
        ("H200-SXM-141GB", "h200-sxm-141gb"),
        ("H100-PCIe-80GB", "h100-pcie-80gb"),
        ("A10G", "a10g"),
        ("T4", "t4"),
        ("RTX PRO 6000", "rtx-pro-6000"),
    ],
)
def test_slug_is_the_key_lower_cased(key, slug):
    assert slug_for_key(key) == slug


def test_product_names_drop_commentary_and_unknown():
    raw = [
        "A100-SXM4-40GB (driver 450.x era)",
        "NVIDIA A100-SXM4-40GB (GFD product label NVIDIA-A100-SXM4-40GB on newer drivers)",
    ]
    assert product_names(raw) == ["A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"]
    assert product_names("Tesla T4") == ["Tesla T4"]
    assert product_names("unknown") == []
    assert product_names(None) == []
    assert product_names("NVIDIA  X (a (nested) note)") == ["NVIDIA X"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{0,2,4}:2", Placements((0, 2, 4), 2, True)),
        ("{0}:8", Placements((0,), 8, True)),
        ("unverified {0,1,2,3,4,5,6}:1", Placements((0, 1, 2, 3, 4, 5, 6), 1, False)),
        ("unknown (absent from the capture; mock lists {0,2}:2)", None),
        (None, None),
    ],
)
def test_parse_placements(text, expected):
    assert parse_placements(text) == expected


@pytest.mark.parametrize("text", ["{0,2,4}", "0,2,4:2", "{4,0}:4", 7])
def test_parse_placements_rejects_malformed_text(text):
    with pytest.raises(CatalogDataError):
        parse_placements(text)


def test_placement_classes_are_keyed_by_slices_and_media_extensions():
    from catalog.datafiles import DATA_DIR, read_yaml

    classes = placement_classes(read_yaml(DATA_DIR / "gpu_models.yaml"))
    eight, four = classes[8], classes[4]
    # placement_classes: "1g (2 mem slices)": {lgipp: "{0,2,4,6}:2", max_instances: 4}
    assert eight[(1, 2, False)].placements == Placements((0, 2, 4, 6), 2)
    assert eight[(1, 1, True)].max_instances == 1
    assert eight[(3, 4, False)].placements == Placements((0, 4), 4)
    assert eight[(7, 8, False)].placements == Placements((0,), 8)
    # a30_layout: "2g": "{0,2}:2"
    assert four[(2, 2, False)].placements == Placements((0, 2), 2)
    assert set(four) == {(1, 1, False), (1, 1, True), (2, 2, False), (4, 4, False)}


def test_aliases_come_from_naming_history_not_from_gib_numbers():
    profile = {"name": "3g.40gb", "naming_history": "3g.39gb on 535.x/545.x (issue #31)"}
    assert history_aliases(profile, "3g.40gb") == ["3g.39gb"]
    a100_40 = {
        "name": "3g.20gb",
        "naming_history": "early (450.x) drivers exposed this profile as 3g.21gb "
        "(GFD label nvidia.com/mig-3g.21gb.*)",
    }
    assert history_aliases(a100_40, "3g.20gb") == ["3g.21gb"]
    assert history_aliases({"name": "1g.10gb"}, "1g.10gb") == []


def _rows():
    return {row.slug: row for row in gpu_model_rows()}


def test_every_model_of_the_shared_catalog_is_normalised():
    rows = _rows()
    assert set(rows) == EXPECTED_SLUGS
    assert sum(len(row.profiles) for row in rows.values()) == 68


def test_a30_uses_four_slices_and_falls_back_for_the_missing_placement():
    a30 = _rows()["a30"]
    assert (a30.mig_compute_slices, a30.mig_memory_slices, a30.max_mig_instances) == (4, 4, 4)
    by_name = {p.name: p for p in a30.profiles}
    assert by_name["2g.12gb"].placement_starts == [0, 2]
    assert by_name["2g.12gb"].placements_verified is True
    # 2g.12gb+me: placements "unknown (absent from the capture; mock lists {0,2}:2)"
    me = by_name["2g.12gb+me"]
    assert (me.placement_starts, me.placement_size, me.placements_verified) == ([0, 2], 2, False)
    assert a30.placements_verified is False
    # memory_total_mib is only a MOCK value (24576): not taken as a fact
    assert a30.memory_mib is None


def test_h200_placements_fall_back_to_the_class_table_and_are_unverified():
    h200 = _rows()["h200-sxm-141gb"]
    by_name = {p.name: p for p in h200.profiles}
    assert by_name["1g.35gb"].placement_starts == [0, 2, 4, 6]
    assert by_name["3g.71gb"].placement_starts == [0, 4]
    assert all(not p.placements_verified for p in h200.profiles)
    # -lgip "16.00" GiB in mig-parted issue #120 -> 16384 MiB
    assert by_name["1g.18gb"].memory_mib == 16384
    assert h200.product_names == []


def test_profiles_same_as_copies_the_profile_set_without_per_sku_measurements():
    rows = _rows()
    pcie, sxm = rows["h100-pcie-80gb"], rows["h100-sxm5-80gb"]
    assert [p.name for p in pcie.profiles] == [p.name for p in sxm.profiles]
    one = next(p for p in pcie.profiles if p.name == "1g.20gb")
    assert (one.compute_slices, one.memory_slices, one.max_instances) == (1, 2, 4)
    assert (one.placement_starts, one.placement_size) == ([0, 2, 4, 6], 2)
    assert one.placements_verified is False
    assert one.memory_mib is None and one.nvidia_smi_id is None
    nvl = rows["h200-nvl-141gb"]
    assert [p.name for p in nvl.profiles] == [p.name for p in rows["h200-sxm-141gb"].profiles]


def test_memory_prefers_real_captures_over_mocks():
    rows = _rows()
    h100 = {p.name: p for p in rows["h100-sxm5-80gb"].profiles}
    # 1g.10gb: GFD label mig-1g.10gb.memory 9984 (driver 550.54.15) beats -lgip 9.75 GiB
    assert h100["1g.10gb"].memory_mib == 9984
    # 4g.40gb: only -lgip 39.50 GiB -> 40448 MiB
    assert h100["4g.40gb"].memory_mib == 40448
    nvl = {p.name: p for p in rows["h100-nvl-94gb"].profiles}
    assert nvl["3g.47gb"].memory_mib == 47488  # MIG device total, driver 560.35.03
    a100 = {p.name: p for p in rows["a100-sxm4-80gb"].profiles}
    assert a100["7g.80gb"].memory_mib is None  # only "profile memorySizeMB (mock)"
    assert rows["a100-sxm4-40gb"].memory_mib == 40537
    assert rows["h100-nvl-94gb"].memory_mib == 95830


def test_rows_keep_their_source_strings():
    rows = _rows()
    a100 = rows["a100-sxm4-80gb"]
    fields = {entry["field"] for entry in a100.sources}
    assert {"nvml_name", "memory_mib", "pci_device_id", "max_mig_instances"} <= fields
    profile = next(p for p in a100.profiles if p.name == "3g.40gb")
    alias_sources = [e for e in profile.sources if e["field"] == "aliases"]
    assert alias_sources[0]["value"] == "3g.39gb on 535.x/545.x (issue #31)"
    seven = next(p for p in a100.profiles if p.name == "7g.80gb")
    assert any("Project-HAMi/HAMi" in str(e["source"]) for e in seven.sources)


def test_extra_file_adds_a_model_without_code(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        textwrap.dedent(
            """
            models:
              - key: H100-SXM5-80GB-CUSTOM
                nvml_name: "NVIDIA H100 80GB HBM3 (custom board)"
                architecture: hopper
                mig_capable: true
                max_mig_instances: 7
                profiles_same_as: H100-SXM5-80GB
              - key: RTX-4000-SFF-ADA
                nvml_name: "NVIDIA RTX 4000 SFF Ada Generation"
                architecture: ada
                mig_capable: false
            """
        )
    )
    with pytest.raises(CatalogDataError, match="NVIDIA H100 80GB HBM3"):
        gpu_model_rows(extra=[extra])  # same product name as h100-sxm5-80gb
    extra.write_text(extra.read_text().replace("NVIDIA H100 80GB HBM3 (custom board)", "unknown"))
    rows = {row.slug: row for row in gpu_model_rows(extra=[extra])}
    assert rows["rtx-4000-sff-ada"].product_names == ["NVIDIA RTX 4000 SFF Ada Generation"]
    assert len(rows["h100-sxm5-80gb-custom"].profiles) == 7


def test_malformed_data_is_rejected_with_where_it_is(tmp_path):
    extra = tmp_path / "bad.yaml"
    extra.write_text(
        textwrap.dedent(
            """
            models:
              - key: BAD-GPU
                mig_capable: true
                profiles:
                  - {name: 1g.5gb, compute_slices: 1, memory_slices: 2, max_instances: 7,
                     placements: "{0,1,2}:1"}
            """
        )
    )
    with pytest.raises(CatalogDataError, match=re.escape("BAD-GPU profile 1g.5gb")):
        gpu_model_rows(extra=[extra])


# ---------------------------------------------------------------- database


@pytest.mark.django_db
def test_load_catalog_writes_every_kind(loaded):
    assert set(GpuModel.objects.values_list("slug", flat=True)) == EXPECTED_SLUGS
    assert loaded.counts == {
        "gpu_models": 19,
        "mig_profiles": 68,
        "kubernetes_versions": 7,
        "gpu_architectures": 9,
        "driver_branches": 13,
        "cuda_driver_requirements": 48,  # 49 Linux rows in drivers.yaml, the 11.0.1 RC skipped
        "xid_codes": 36,  # 30 entries, "144-150" expanded to seven codes
        "vgpu_profiles": 17,  # T4 3 + A10 4 + H200 NVL 3 time-sliced and 7 MIG-backed
        "driver_rules": 4,  # B200 minimum, two A30 +me profiles, 4g + 3g before R510
        "gpu_systems": 1,  # GB200 NVL72
    }
    assert MigProfile.objects.count() == 68
    assert KubernetesVersion.objects.count() == 7
    assert XidCode.objects.count() == 36


@pytest.mark.django_db
def test_a100_80gb_has_the_two_slice_1g_profile(loaded):
    profile = MigProfile.objects.get(gpu_model_id="a100-sxm4-80gb", name="1g.20gb")
    assert (profile.compute_slices, profile.memory_slices, profile.max_instances) == (1, 2, 4)
    assert profile.placement_starts == [0, 2, 4, 6]
    assert profile.placement_size == 2
    assert profile.placements == "{0,2,4,6}:2"
    assert profile.memory_mib == 19968  # MIG device fb total, driver 535.54.03
    a100 = GpuModel.objects.get(slug="a100-sxm4-80gb")
    assert a100.product_names == ["NVIDIA A100-SXM4-80GB"]
    assert (a100.mig_compute_slices, a100.mig_memory_slices) == (7, 8)
    assert a100.placements_verified is False  # no public -lgipp for this SKU


@pytest.mark.django_db
def test_h200_has_1g_18gb_and_a100_does_not(loaded):
    assert MigProfile.objects.filter(gpu_model_id="h200-sxm-141gb", name="1g.18gb").exists()
    assert not MigProfile.objects.filter(
        gpu_model__slug__startswith="a100", name="1g.18gb"
    ).exists()


@pytest.mark.django_db
def test_loading_twice_changes_nothing(loaded):
    before = {
        "models": list(GpuModel.objects.values_list("slug", "memory_mib", "product_names")),
        "profiles": list(MigProfile.objects.values_list("gpu_model_id", "name", "aliases")),
    }
    again = load_catalog()
    assert again.counts == loaded.counts
    assert set(again.created.values()) == {0}
    assert GpuModel.objects.count() == 19 and MigProfile.objects.count() == 68
    assert before == {
        "models": list(GpuModel.objects.values_list("slug", "memory_mib", "product_names")),
        "profiles": list(MigProfile.objects.values_list("gpu_model_id", "name", "aliases")),
    }


@pytest.mark.django_db
def test_profiles_no_longer_in_the_data_are_reported_and_pruned_on_request(loaded):
    MigProfile.objects.create(
        gpu_model_id="gb200", name="1g.24gb", compute_slices=1, memory_slices=1, max_instances=7
    )
    assert load_catalog().stale_profiles == ["gb200/1g.24gb"]
    assert load_catalog(prune=True).pruned_profiles == ["gb200/1g.24gb"]
    assert not MigProfile.objects.filter(gpu_model_id="gb200", name="1g.24gb").exists()


@pytest.mark.django_db
def test_a_product_name_claimed_by_an_admin_added_model_fails_the_load(loaded):
    GpuModel.objects.create(slug="t4-copy", name="T4-COPY", product_names=["tesla  t4"])
    with pytest.raises(CatalogDataError, match="tesla  t4"):
        load_catalog()


@pytest.mark.django_db
def test_kubernetes_versions_drivers_and_xids_are_loaded(loaded):
    v137 = KubernetesVersion.objects.get(version="1.37")
    assert (v137.released, v137.end_of_life) == (date(2026, 8, 26), date(2027, 10, 28))
    assert [kv.version for kv in KubernetesVersion.objects.all()][:3] == ["1.37", "1.36", "1.35"]
    assert GpuArchitecture.objects.get(name="blackwell").min_driver == "570.26"
    assert GpuArchitecture.objects.get(name="kepler").last_driver_branch == "R470"
    r470, r580, r595 = (DriverBranch.objects.get(branch=b) for b in ("R470", "R580", "R595"))
    assert "kepler" in r470.architectures and "hopper" not in r470.architectures
    assert {"volta", "blackwell", "hopper"} <= set(r580.architectures)
    assert "kepler" not in r580.architectures
    assert "volta" not in r595.architectures  # Volta's last branch is R580
    assert r580.designation == "LTSB"
    assert r580.end_of_life == (
        "June 2028 (615 and 620 editions of the support matrix) / "
        "August 2028 (stored unversioned snapshot)"
    )
    assert "blackwell" not in DriverBranch.objects.get(branch="R565").architectures
    cuda = CudaDriverRequirement.objects.get(label="12.4 Update 1")
    assert (cuda.cuda_version, cuda.update, cuda.min_linux_driver) == ("12.4", 1, "550.54.15")
    assert cuda.family_min_driver == "525"
    assert CudaDriverRequirement.objects.get(label="12.8 GA").min_windows_driver == "570.65"
