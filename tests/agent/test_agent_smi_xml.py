"""nvidia-smi -q -x parser, checked against real captures (shared/data/nvidia-smi-xml).

Expected values were read by hand from the XML files (units converted by hand:
1 MiB = 2**20 bytes, W x 1000 = mW).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nvke_agent.smi_xml import (
    NotAnNvidiaSmiReport,
    SmiMigDevice,
    parse_nvidia_smi_xml,
)

MiB = 2**20

CAPTURE_NAMES = ["a100-sxm4-v12.xml", "a10g.xml", "tesla-t4.xml", "rtx-4000-sff-ada-v13.xml"]


def _parse(captures: Path, name: str):
    return parse_nvidia_smi_xml((captures / name).read_bytes())


@pytest.mark.parametrize("name", CAPTURE_NAMES)
def test_every_capture_parses_with_its_doctype_line(captures: Path, name: str) -> None:
    raw = (captures / name).read_bytes()
    assert b"<!DOCTYPE nvidia_smi_log SYSTEM" in raw
    report = parse_nvidia_smi_xml(raw)
    assert len(report.gpus) == 1
    assert report.gpus[0].uuid.startswith("GPU-")


@pytest.mark.parametrize("name", CAPTURE_NAMES)
def test_text_and_bytes_input_give_the_same_report(captures: Path, name: str) -> None:
    raw = (captures / name).read_bytes()
    assert parse_nvidia_smi_xml(raw.decode("utf-8")) == parse_nvidia_smi_xml(raw)


def test_a100_with_mig_enabled_matches_the_capture(captures: Path) -> None:
    report = _parse(captures, "a100-sxm4-v12.xml")
    assert report.timestamp == "Fri Aug  4 11:44:30 2023"
    assert report.driver_version == "535.54.03"
    assert report.cuda_version == "12.2"
    # A trimmed capture: nvidia-smi says 4 GPUs are attached, one <gpu> is present.
    assert report.attached_gpus == 4
    assert len(report.gpus) == 1
    gpu = report.gpus[0]
    assert gpu.index == 0
    assert gpu.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert gpu.pci_bus_id == "00000000:01:00.0"
    assert gpu.minor_number == 1
    assert gpu.product_name == "NVIDIA A100-SXM4-80GB"
    assert gpu.product_architecture == "Ampere"
    assert gpu.memory_total_bytes == 81920 * MiB == 85899345920
    assert gpu.memory_used_bytes == 50 * MiB
    assert gpu.mig_mode == "enabled"
    # Utilization is N/A in MIG mode: None, never 0.
    assert gpu.utilization_gpu_pct is None
    assert gpu.utilization_memory_pct is None
    assert gpu.power_draw_mw == 67030  # 67.03 W
    assert gpu.temperature_c == 27.0
    assert gpu.ecc_volatile_uncorrected == 0  # sram 0 + dram 0
    assert [mig.gpu_instance_id for mig in gpu.mig_devices] == [3, 4, 5, 6]
    assert gpu.mig_devices[0] == SmiMigDevice(
        index=0,
        gpu_instance_id=3,
        compute_instance_id=0,
        uuid=None,  # v12 reports print no MIG UUID
        multiprocessor_count=14,
        memory_total_bytes=19968 * MiB,
        memory_used_bytes=12 * MiB,
    )
    assert all(mig.memory_total_bytes == 19968 * MiB for mig in gpu.mig_devices)
    assert [mig.index for mig in gpu.mig_devices] == [0, 1, 2, 3]


def test_a10g_matches_the_capture(captures: Path) -> None:
    report = _parse(captures, "a10g.xml")
    assert (report.driver_version, report.cuda_version, report.attached_gpus) == (
        "515.105.01",
        "11.7",
        1,
    )
    gpu = report.gpus[0]
    assert gpu.uuid == "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"
    assert gpu.pci_bus_id == "00000000:00:1E.0"
    assert gpu.product_name == "NVIDIA A10G"
    assert gpu.product_architecture == "Ampere"
    assert gpu.minor_number == 0
    assert gpu.memory_total_bytes == 23028 * MiB
    assert gpu.memory_used_bytes == 22 * MiB
    assert gpu.mig_mode is None  # current_mig N/A: no MIG on an A10G
    assert gpu.mig_devices == ()
    assert gpu.utilization_gpu_pct == 0.0  # "0 %" is a real 0
    assert gpu.utilization_memory_pct == 0.0
    assert gpu.power_draw_mw == 25580  # <power_readings><power_draw>25.58 W (v11 DTD)
    assert gpu.temperature_c == 17.0
    assert gpu.ecc_volatile_uncorrected == 0


def test_tesla_t4_matches_the_capture(captures: Path) -> None:
    report = _parse(captures, "tesla-t4.xml")
    gpu = report.gpus[0]
    assert gpu.uuid == "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"
    assert gpu.pci_bus_id == "00000000:00:1E.0"
    assert gpu.product_name == "Tesla T4"
    assert gpu.product_architecture == "Turing"
    assert gpu.memory_total_bytes == 15360 * MiB
    assert gpu.memory_used_bytes == 1032 * MiB
    assert gpu.mig_mode is None
    assert gpu.power_draw_mw == 26780
    assert gpu.temperature_c == 40.0
    assert gpu.utilization_gpu_pct == 0.0
    assert gpu.ecc_volatile_uncorrected == 0


def test_rtx_ada_v13_uses_instant_power_and_has_no_ecc(captures: Path) -> None:
    report = _parse(captures, "rtx-4000-sff-ada-v13.xml")
    assert (report.driver_version, report.cuda_version) == ("595.84", "13.2")
    gpu = report.gpus[0]
    assert gpu.uuid == "GPU-37037c3f-65c8-ec4d-24a9-420204ad8026"
    assert gpu.pci_bus_id == "00000000:06:00.0"
    assert gpu.product_name == "NVIDIA RTX 4000 SFF Ada Generation"
    assert gpu.product_architecture == "Ada Lovelace"
    assert gpu.memory_total_bytes == 20475 * MiB
    assert gpu.memory_used_bytes == 3534 * MiB
    # v13 has no <power_draw>: <instant_power_draw>8.44 W wins over <average_power_draw>8.81 W.
    assert gpu.power_draw_mw == 8440
    assert gpu.temperature_c == 38.0
    assert gpu.utilization_gpu_pct == 0.0
    assert gpu.utilization_memory_pct == 37.0
    assert gpu.mig_mode is None
    # ECC is off: every volatile counter (v13 names) is N/A.
    assert gpu.ecc_volatile_uncorrected is None


def _minimal_report(gpu_body: str, *, root: str = "nvidia_smi_log") -> str:
    return (
        '<?xml version="1.0" ?>\n'
        f'<!DOCTYPE {root} SYSTEM "nvsmi_device_v12.dtd">\n'
        f"<{root}><driver_version>550.54.15</driver_version><attached_gpus>1</attached_gpus>"
        f'<gpu id="00000000:16:00.0"><product_name>NVIDIA H100 80GB HBM3</product_name>'
        f"<uuid>GPU-00000000-0000-0000-0000-000000000001</uuid>{gpu_body}</gpu></{root}>"
    )


def test_v13_average_power_is_used_when_instant_is_missing() -> None:
    body = (
        "<gpu_power_readings><average_power_draw>700.50 W</average_power_draw></gpu_power_readings>"
    )
    gpu = parse_nvidia_smi_xml(_minimal_report(body)).gpus[0]
    assert gpu.power_draw_mw == 700500


def test_volatile_uncorrectable_counters_are_summed() -> None:
    body = (
        "<ecc_errors><volatile><sram_correctable>9</sram_correctable>"
        "<sram_uncorrectable_parity>2</sram_uncorrectable_parity>"
        "<sram_uncorrectable_secded>N/A</sram_uncorrectable_secded>"
        "<dram_uncorrectable>3</dram_uncorrectable></volatile>"
        "<aggregate><dram_uncorrectable>100</dram_uncorrectable></aggregate></ecc_errors>"
    )
    assert parse_nvidia_smi_xml(_minimal_report(body)).gpus[0].ecc_volatile_uncorrected == 5


def test_old_dtd_double_bit_total_is_the_uncorrected_count() -> None:
    body = "<ecc_errors><volatile><double_bit><total>4</total></double_bit></volatile></ecc_errors>"
    assert parse_nvidia_smi_xml(_minimal_report(body)).gpus[0].ecc_volatile_uncorrected == 4


def test_missing_and_unavailable_values_are_none() -> None:
    body = (
        "<fb_memory_usage><total>[N/A]</total></fb_memory_usage>"
        "<utilization><gpu_util>[Not Supported]</gpu_util></utilization>"
        "<temperature><gpu_temp>Requested functionality has been deprecated</gpu_temp>"
        "</temperature>"
    )
    gpu = parse_nvidia_smi_xml(_minimal_report(body)).gpus[0]
    assert gpu.memory_total_bytes is None
    assert gpu.utilization_gpu_pct is None
    assert gpu.temperature_c is None
    assert gpu.power_draw_mw is None
    assert gpu.minor_number is None
    assert gpu.ecc_volatile_uncorrected is None
    assert gpu.pci_bus_id == "00000000:16:00.0"  # from the <gpu id=…> attribute


@given(mib=st.integers(min_value=0, max_value=2**22), centiwatts=st.integers(0, 10**6))
def test_units_convert_exactly(mib: int, centiwatts: int) -> None:
    watts = Decimal(centiwatts) / 100
    body = (
        f"<fb_memory_usage><total>{mib} MiB</total></fb_memory_usage>"
        f"<power_readings><power_draw>{watts:.2f} W</power_draw></power_readings>"
    )
    gpu = parse_nvidia_smi_xml(_minimal_report(body)).gpus[0]
    assert gpu.memory_total_bytes == mib * MiB
    assert gpu.power_draw_mw == centiwatts * 10


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<nvidia_smi_log><driver_version>&lol9;</driver_version></nvidia_smi_log>
"""


def test_billion_laughs_is_refused() -> None:
    with pytest.raises(NotAnNvidiaSmiReport, match="entity"):
        parse_nvidia_smi_xml(BILLION_LAUGHS)


def test_external_entity_is_refused_and_the_file_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENT")
    xxe = (
        '<?xml version="1.0"?>\n'
        f'<!DOCTYPE nvidia_smi_log [<!ENTITY xxe SYSTEM "file://{secret}">]>\n'
        "<nvidia_smi_log><driver_version>&xxe;</driver_version></nvidia_smi_log>"
    )
    with pytest.raises(NotAnNvidiaSmiReport) as info:
        parse_nvidia_smi_xml(xxe)
    assert "TOP-SECRET-CONTENT" not in str(info.value)


def test_external_parameter_entity_is_refused() -> None:
    xml = (
        '<?xml version="1.0"?>\n'
        "<!DOCTYPE nvidia_smi_log ["
        '<!ENTITY % remote SYSTEM "http://127.0.0.1:9/evil.dtd"> %remote;]>\n'
        "<nvidia_smi_log/>"
    )
    with pytest.raises(NotAnNvidiaSmiReport):
        parse_nvidia_smi_xml(xml)


def test_xml_that_is_not_an_nvidia_smi_report_is_refused_naming_its_root() -> None:
    with pytest.raises(NotAnNvidiaSmiReport, match=r"<rss>"):
        parse_nvidia_smi_xml('<?xml version="1.0"?><rss version="2.0"><channel/></rss>')


def test_malformed_xml_is_refused() -> None:
    with pytest.raises(NotAnNvidiaSmiReport, match="malformed"):
        parse_nvidia_smi_xml(b"<nvidia_smi_log><gpu></nvidia_smi_log>")


def test_not_an_nvidia_smi_report_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_nvidia_smi_xml("not xml at all")


def test_a_gpu_without_uuid_is_refused() -> None:
    xml = (
        "<nvidia_smi_log><gpu id='00000000:01:00.0'>"
        "<product_name>X</product_name></gpu></nvidia_smi_log>"
    )
    with pytest.raises(NotAnNvidiaSmiReport, match="uuid"):
        parse_nvidia_smi_xml(xml)


def test_gpu_index_is_the_element_position() -> None:
    gpus = "".join(
        f'<gpu id="00000000:{i:02X}:00.0"><product_name>Tesla T4</product_name>'
        f"<uuid>GPU-{i}</uuid></gpu>"
        for i in range(3)
    )
    report = parse_nvidia_smi_xml(f"<nvidia_smi_log>{gpus}</nvidia_smi_log>")
    assert [(gpu.index, gpu.uuid) for gpu in report.gpus] == [
        (0, "GPU-0"),
        (1, "GPU-1"),
        (2, "GPU-2"),
    ]
    assert report.attached_gpus is None


@pytest.mark.parametrize(
    ("total", "expected"),
    [
        ("23028 MiB", 23028 * MiB),
        # found by the hostile-tenant probe at host import: read as 80 MiB, and a size past
        # int8 stored as 104857599999999999998951424 bytes; neither is a reading
        ("\u0668\u0660 MiB", None),
        ("99999999999999999999 MiB", None),
        ("-1 MiB", None),
    ],
)
def test_memory_sizes_are_ascii_digits_within_64_bits(
    captures: Path, total: str, expected: int | None
) -> None:
    xml = (captures / "a10g.xml").read_text()
    xml = xml.replace("<total>23028 MiB</total>", f"<total>{total}</total>", 1)
    assert parse_nvidia_smi_xml(xml).gpus[0].memory_total_bytes == expected
